package validate

import (
	"context"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
)

// TestActivationsOfTheirOwn: checkpoints whose shared MLP (HY-V4) or
// layers (Step-3.7) run activations other than the contract-wide one
// validate after convert, and a contract that loses or changes one of
// them is refused naming it, before any number is compared.
func TestActivationsOfTheirOwn(t *testing.T) {
	for _, c := range []struct {
		preset string
		edit   func(c map[string]any)
		want   string
	}{
		{"small-hy-v4", func(c map[string]any) { delete(c, "shared_activation") }, "shared_activation"},
		{"small-hy-v4", func(c map[string]any) { c["activation"] = map[string]any{"limit": 0.5} }, "activation"},
		// layers[1] is layer 2, whose routed experts and shared MLP cap silu(g) at 0.05 and 0.08
		{"small-step3p5", func(c map[string]any) { delete(layerEntry(c, 1), "activation") }, "layers[1] activation"},
		{"small-step3p5", func(c map[string]any) {
			layerEntry(c, 1)["shared_activation"] = map[string]any{"limit": 0.05, "clamp_after_act": true}
		},
			"layers[1] shared_activation"},
		{"small-step3p5", func(c map[string]any) { layerEntry(c, 2)["activation"] = map[string]any{"limit": 0.05} }, "layers[2] activation"},
	} {
		t.Run(c.preset, func(t *testing.T) {
			src := cktest.WritePreset(t, c.preset)
			dst := convertInto(t, src, convert.Options{})
			opts := Options{Src: src, Dst: dst, Seed: 3}
			rep, err := Run(context.Background(), opts)
			if err != nil || rep.Failed() {
				t.Fatalf("the clean conversion: %v %v", err, rep.Err())
			}
			editContract(t, dst, c.edit)
			rep, err = Run(context.Background(), opts)
			if err == nil {
				err = rep.Err()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("edited contract: error %v, want one naming %q", err, c.want)
			}
		})
	}
}

// layerEntry is the contract's layers[i] object.
func layerEntry(c map[string]any, i int) map[string]any {
	return c["layers"].([]any)[i].(map[string]any)
}
