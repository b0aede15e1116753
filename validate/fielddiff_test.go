package validate

import "testing"

func TestFieldDiff(t *testing.T) {
	type spec struct {
		Scoring    string
		NumExperts int
		TopKGroup  int
		hidden     int
	}
	got := fieldDiff(spec{"sigmoid", 16, 2, 1}, spec{"softmax", 16, 1, 2})
	if want := "scoring sigmoid (SRC softmax), top_k_group 2 (SRC 1)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for in, want := range map[string]string{"NumExperts": "num_experts", "TopK": "top_k", "RoutedScalingFactor": "routed_scaling_factor", "NGroup": "n_group"} {
		if got := snakeCase(in); got != want {
			t.Errorf("snakeCase(%s) = %s, want %s", in, got, want)
		}
	}
}
