package suggest

import (
	"reflect"
	"testing"
)

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"valdiate", "validate", 1}, {"layotu", "layout", 1}, {"tpp", "tp", 1}, {"", "abc", 3},
		{"kitten", "sitting", 3}, {"same", "same", 0}, {"ca", "abc", 3},
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestClosest(t *testing.T) {
	presets := []string{"tiny-deepseek-v3", "tiny-deepseek-v3-fp8", "tiny-gpt-oss", "small-gpt-oss-mxfp4", "deepseek-v3-shaped", "tiny-qwen3-moe"}
	for _, tc := range []struct {
		word   string
		want   []string
		phrase string
	}{
		{"tiny-deepseek-v4", []string{"tiny-deepseek-v3", "tiny-deepseek-v3-fp8"}, "; did you mean tiny-deepseek-v3 or tiny-deepseek-v3-fp8?"},
		{"tiny-qwen3-mo", []string{"tiny-qwen3-moe"}, "; did you mean tiny-qwen3-moe?"},
		{"gpt-oss", []string{"tiny-gpt-oss", "small-gpt-oss-mxfp4"}, "; did you mean tiny-gpt-oss or small-gpt-oss-mxfp4?"},
		{"deepseek-v3", []string{"tiny-deepseek-v3", "tiny-deepseek-v3-fp8", "deepseek-v3-shaped"}, "; did you mean tiny-deepseek-v3, tiny-deepseek-v3-fp8 or deepseek-v3-shaped?"},
		{"nope", []string{}, ""},
	} {
		if got := Closest(tc.word, presets, 3); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Closest(%q) = %v, want %v", tc.word, got, tc.want)
		}
		if got := Phrase(tc.word, presets); got != tc.phrase {
			t.Errorf("Phrase(%q) = %q, want %q", tc.word, got, tc.phrase)
		}
	}
}
