package family_test

import (
	"context"
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
)

// synthDirs caches one synthetic checkpoint per preset for this package's
// tests (written once, read by several).
var synthDirs sync.Map

// synthPlan writes (once) the preset's checkpoint and plans it with its
// config.json edited.
func synthPlan(t *testing.T, preset string, edit func(map[string]any)) (*family.Plan, error) {
	t.Helper()
	v, _ := synthDirs.LoadOrStore(preset, &sync.Once{})
	dir := filepath.Join(synthRoot, preset)
	v.(*sync.Once).Do(func() {
		spec, err := fixtures.Preset(preset)
		if err == nil {
			_, err = fixtures.Write(context.Background(), dir, spec, fixtures.Options{})
		}
		if err != nil {
			t.Fatalf("synth %s: %v", preset, err)
		}
	})
	return planEditedDir(t, dir, edit)
}

// planEditedDir plans the checkpoint in dir (through checkpoint, which
// resolves views) with its config.json edited (edit nil: as written) and
// the tensors named in drop hidden.
func planEditedDir(t *testing.T, dir string, edit func(map[string]any), drop ...string) (*family.Plan, error) {
	t.Helper()
	ck := cktest.Open(t, dir)
	cfg := testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
	if edit != nil {
		edit(cfg)
	}
	if len(drop) > 0 {
		return family.Detect(cfg, without{ck, drop})
	}
	return family.Detect(cfg, ck)
}

// planEdited is planEditedDir of the committed HF fixture named dir.
func planEdited(t *testing.T, dir string, edit func(cfg map[string]any), drop ...string) (*family.Plan, error) {
	t.Helper()
	return planEditedDir(t, filepath.Join("..", "fixtures", "hf", dir), edit, drop...)
}

var synthRoot string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "moeprep-family-test-")
	if err != nil {
		panic(err)
	}
	synthRoot = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Issue 30's DeepSeek-like families, each planned from its synth preset:
// routing as read from transformers 5.17 and the tensor names it saves.
func TestDSFamiliesPlan(t *testing.T) {
	cases := []struct {
		preset string
		want   string // family, model type, sizes, routing
		moe    string // MoE layer indices (MTP included)
		names  [4]string
	}{
		{"small-deepseek-v32",
			"deepseek_v32/deepseek_v32 E16 k4 S1x32 sigmoid noaux_tc g4/2 norm rsf 2.5 limit 0",
			"[1 2 3(MTP)]",
			[4]string{"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
				"model.layers.2.mlp.experts.3.gate_proj.weight", "model.layers.3.mlp.shared_experts.down_proj.weight"}},
		{"small-glm-moe-dsa",
			"glm_moe_dsa/glm_moe_dsa E16 k4 S1x32 sigmoid noaux_tc g4/2 norm rsf 2.5 limit 0",
			"[1 2 3(MTP)]",
			[4]string{"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
				"model.layers.2.mlp.experts.3.gate_proj.weight", "model.layers.3.mlp.shared_experts.down_proj.weight"}},
		{"small-mistral4",
			"mistral4/mistral4 E16 k4 S1x32 softmax noaux_tc g4/2 norm rsf 2 limit 0",
			"[1 2]",
			[4]string{"model.layers.1.mlp.gate.weight", "",
				"model.layers.2.mlp.experts.gate_up_proj[3][0:32]", "model.layers.2.mlp.shared_experts.down_proj.weight"}},
		{"small-kimi-linear",
			"kimi_linear/kimi_linear E16 k4 S1x32 sigmoid noaux_tc g4/2 norm rsf 2.446 limit 0",
			"[1 2]",
			[4]string{"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
				"model.layers.2.block_sparse_moe.experts.3.w1.weight", "model.layers.2.block_sparse_moe.shared_experts.down_proj.weight"}},
		{"small-laguna",
			"laguna/laguna E8 k2 S2x64 sigmoid noaux_tc g1/1 norm rsf 1.5 limit 0",
			"[1 2]",
			[4]string{"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.e_score_correction_bias",
				"model.layers.2.mlp.experts.3.gate_proj.weight", "model.layers.2.mlp.shared_expert.down_proj.weight"}},
	}
	for _, tc := range cases {
		t.Run(tc.preset, func(t *testing.T) {
			p, err := synthPlan(t, tc.preset, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("%s/%s E%d k%d S%dx%d %s %s g%d/%d %s rsf %v limit %v", p.Family, p.ModelType, p.NumExperts, p.TopK,
				p.NumSharedExperts, p.SharedIntermediateSize, p.Scoring, p.TopKMethod, p.NGroup, p.TopKGroup,
				map[bool]string{true: "norm", false: "nonorm"}[p.NormTopKProb], p.RoutedScalingFactor, p.Act.Limit)
			if got != tc.want {
				t.Errorf("plan\n got %s\nwant %s", got, tc.want)
			}
			var moe []string
			for _, l := range p.Layers {
				s := fmt.Sprint(l.Index)
				if l.MTP {
					s += "(MTP)"
				}
				moe = append(moe, s)
			}
			if g := "[" + strings.Join(moe, " ") + "]"; g != tc.moe {
				t.Errorf("MoE layers %s, want %s", g, tc.moe)
			}
			l1, l2 := p.Layers[0], p.Layers[1]
			if l1.Router != tc.names[0] || l1.RouterBias != tc.names[1] || l2.Experts[3].Weight(layout.ProjGate) != tc.names[2] ||
				p.Layers[len(p.Layers)-1].Shared == nil {
				t.Errorf("names: router %s, bias %q, expert 3 gate %s", l1.Router, l1.RouterBias, l2.Experts[3].Weight(layout.ProjGate))
			}
			if last := p.Layers[len(p.Layers)-1]; last.Shared.Weight(layout.ProjDown) != tc.names[3] {
				t.Errorf("shared down %s, want %s", last.Shared.Weight(layout.ProjDown), tc.names[3])
			}
		})
	}
}

// What each family's config.json may say otherwise: the keys transformers
// writes, aliases, defaults, and the options moeprep refuses, each in one
// line naming the key.
func TestDSFamiliesConfig(t *testing.T) {
	set := func(kv map[string]any) func(map[string]any) { return func(c map[string]any) { maps.Copy(c, kv) } }
	del := func(keys ...string) func(map[string]any) {
		return func(c map[string]any) {
			for _, k := range keys {
				delete(c, k)
			}
		}
	}
	cases := []struct {
		name, preset string
		edit         func(map[string]any)
		want         string // "plan: ..." for a plan summary, else an error substring
	}{
		// Kimi-Linear: the hub's names (as synth writes them) or the module's
		{"kimi hub keys", "small-kimi-linear", nil, "plan: k4 g4/2 S1 norm"},
		{"kimi module keys", "small-kimi-linear", func(c map[string]any) {
			c["num_experts_per_tok"], c["n_group"], c["n_shared_experts"], c["norm_topk_prob"] = 4.0, 4.0, 1.0, false
			del("num_experts_per_token", "num_expert_group", "num_shared_experts", "moe_renormalize")(c)
		}, "plan: k4 g4/2 S1 nonorm"},
		{"kimi moe_renormalize false", "small-kimi-linear", set(map[string]any{"moe_renormalize": false}), "plan: k4 g4/2 S1 nonorm"},
		{"kimi keys disagree", "small-kimi-linear", set(map[string]any{"n_group": 2.0}), "config.json: n_group=2 and num_expert_group=4 disagree"},
		{"kimi layer types from first_k_dense_replace", "small-kimi-linear", del("mlp_layer_types"), "plan: k4 g4/2 S1 norm"},
		// Laguna
		{"laguna softcapping", "small-laguna", set(map[string]any{"moe_router_logit_softcapping": 30.0}),
			"moe_router_logit_softcapping=30 is not supported for laguna"},
		{"laguna input scaling", "small-laguna", set(map[string]any{"moe_apply_router_weight_on_input": true}),
			"moe_apply_router_weight_on_input=true is not supported for laguna"},
		{"laguna shared of one expert", "small-laguna", set(map[string]any{"shared_expert_intermediate_size": 32.0}),
			"shape"},
		// Mistral 4: no groups, no norm
		{"mistral4 plain top-k", "small-mistral4", set(map[string]any{"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": false}),
			"plan: k4 g1/1 S1 nonorm"},
		{"mistral4 defaults", "small-mistral4", del("n_group", "topk_group", "norm_topk_prob"), "plan: k4 g1/1 S1 norm"},
		// DeepSeek-V3.2 / GLM-5: num_experts is an alias of n_routed_experts
		{"v32 num_experts disagrees", "small-deepseek-v32", set(map[string]any{"num_experts": 8.0}), "disagree"},
		{"glm5 defaults", "small-glm-moe-dsa", del("n_group", "topk_group"), "plan: k4 g1/1 S1 norm"},
		{"v32 layer types disagree with the tensors", "small-deepseek-v32",
			set(map[string]any{"mlp_layer_types": []any{"dense", "dense", "sparse"}}), "layer 1: dense by config.json but holds MoE tensor"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := synthPlan(t, tc.preset, tc.edit)
			if want, ok := strings.CutPrefix(tc.want, "plan: "); ok {
				if err != nil {
					t.Fatal(err)
				}
				got := fmt.Sprintf("k%d g%d/%d S%d %s", p.TopK, p.NGroup, p.TopKGroup, p.NumSharedExperts,
					map[bool]string{true: "norm", false: "nonorm"}[p.NormTopKProb])
				if got != want {
					t.Errorf("plan %s, want %s", got, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %v, want one line with %q", err, tc.want)
			}
		})
	}
}

// Youtu-LLM has no MoE layer: refused in one line naming it and why.
func TestYoutuRefused(t *testing.T) {
	_, err := family.Detect(map[string]any{"model_type": "youtu", "hidden_size": 64.0}, nil)
	want := `config.json: model_type "youtu" is not supported: Youtu-LLM is a dense model`
	if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("err = %v, want %q...", err, want)
	}
}
