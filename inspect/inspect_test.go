package inspect

import (
	"testing"

	"github.com/moeprep/moeprep/layout"
)

func TestRanges(t *testing.T) {
	tests := []struct {
		in   []int
		want string
	}{
		{nil, "none"},
		{[]int{5}, "5"},
		{[]int{1, 2, 3, 5, 7, 8, 9, 61}, "1-3,5,7-9,61"},
		{[]int{3, 4}, "3-4"},
	}
	for _, tt := range tests {
		if got := Ranges(tt.in); got != tt.want {
			t.Errorf("Ranges(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestActivationText: every non-SwiGLU activation is spelled out with the
// values that differ from SwiGLU's (alpha below 1 included).
func TestActivationText(t *testing.T) {
	for _, c := range []struct {
		a    layout.Activation
		want string
	}{
		{layout.Activation{Alpha: 1.702, Limit: 7, UpOffset: 1}, "clamped SwiGLU (limit 7, alpha 1.702, up offset 1)"},
		{layout.Activation{Limit: 10}, "clamped SwiGLU (limit 10)"},
		{layout.Activation{Alpha: 0.5}, "SwiGLU variant (alpha 0.5)"},
		{layout.Activation{Alpha: 1, UpOffset: -2}, "SwiGLU variant (up offset -2)"},
		{layout.ClampedAfter(7), "SwiGLU with silu(gate) capped (limit 7)"},
		{layout.Activation{}, "SwiGLU"},
	} {
		if got := activationText(c.a); got != c.want {
			t.Errorf("%+v: %q, want %q", c.a, got, c.want)
		}
	}
}
