package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// Cohere2 MoE combines its shared expert by shared_expert_combination_strategy:
// "average" (the default, and the fixture's) halves routed + shared, which the
// plan carries as OutputScale 0.5; "sum" adds it; anything else is refused
// naming the key.
func TestCohere2SharedCombination(t *testing.T) {
	src := filepath.Join(hf, "cohere2-moe")
	cfg := testkit.ReadFile(t, filepath.Join(src, "config.json"))
	for _, tc := range []struct {
		name, from, to string
		want           float64
		err            string
	}{
		{"average (fixture)", "", "", 0.5, ""},
		{"sum", `"shared_expert_combination_strategy": "average"`, `"shared_expert_combination_strategy": "sum"`, 1, ""},
		{"strategy left out: average", `"shared_expert_combination_strategy": "average",`, ``, 0.5, ""},
		{"unknown", `"shared_expert_combination_strategy": "average"`, `"shared_expert_combination_strategy": "median"`, 0, "shared_expert_combination_strategy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := string(cfg)
			if tc.from != "" {
				if !strings.Contains(c, tc.from) {
					t.Fatalf("fixture config lacks %q", tc.from)
				}
				c = strings.Replace(c, tc.from, tc.to, 1)
			}
			testkit.WriteFile(t, filepath.Join(dir, "config.json"), c)
			abs, _ := filepath.Abs(filepath.Join(src, "model.safetensors"))
			if err := os.Symlink(abs, filepath.Join(dir, "model.safetensors")); err != nil {
				t.Skip("no symlinks here:", err)
			}
			ck, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			p, err := ck.Plan()
			if testkit.WantErr(t, err, tc.err) {
				return
			}
			if p.Output() != tc.want {
				t.Errorf("output scale %v, want %v", p.Output(), tc.want)
			}
		})
	}
}
