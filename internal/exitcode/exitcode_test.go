package exitcode

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, 0},
		{"check", fmt.Errorf("layer 3: %w", Check("rel_l2 too large")), 1},
		{"interrupt", fmt.Errorf("convert: %w", ErrInterrupted), 130},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), 130},
		{"malformed", errors.New("model.safetensors: header too long"), 2},
	}
	for _, tt := range tests {
		if got := Code(tt.err); got != tt.want {
			t.Errorf("%s: Code = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestMessageOneLine(t *testing.T) {
	got := Message(errors.New("a.safetensors:\n  bad\theader"))
	if want := "moeprep: a.safetensors: bad header"; got != want {
		t.Fatalf("Message = %q, want %q", got, want)
	}
}
