package convert

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

// TestLayoutTransformersEveryFixture converts every fixture transformers
// wrote with --layout transformers and checks what was written against
// the form resolved for it (the family's, or as stored where the experts
// are quantised: every FP8, INT4, NVFP4 and MXFP4 fixture): an as-stored
// output holds every one of SRC's tensors under its own name, byte for
// byte, and nothing else; a gate-up one holds the first MoE layer's stacks
// under the names transformers 5 holds, in the family's orientation.
func TestLayoutTransformersEveryFixture(t *testing.T) {
	for _, fx := range hf.All() {
		t.Run(fx.Dir, func(t *testing.T) {
			src := filepath.Join(hfDir, fx.Dir)
			fp := cktest.Plan(t, src)
			dst := filepath.Join(t.TempDir(), "out")
			if _, err := Convert(context.Background(), Options{Src: src, Dst: dst, Layout: layout.Transformers}); err != nil {
				t.Fatal(err)
			}
			ck, dp := cktest.Open(t, dst), fp.TransformersOutputForm()
			c, ok, err := layout.ReadContract(ck.Config)
			if err != nil || !ok {
				t.Fatalf("contract: %v %v", ok, err)
			}
			if want := fx.Quantized() || fp.Transformers.AsStored; dp.AsStored != want {
				t.Fatalf("%s experts (family form as-stored %v): resolved as-stored %v, want %v", fx.Format, fp.Transformers.AsStored, dp.AsStored, want)
			}
			if fp8 := fx.Format == hf.FP8Block || fx.Format == hf.FP8Tensor; fp8 != strings.Contains(dp.Why, "dequantises FP8 experts per expert") {
				t.Errorf("%s experts: reason %q", fx.Format, dp.Why)
			}
			wantL, wantO := dp.Layout()
			if c.Layout != wantL || c.Oriented() != wantO {
				t.Fatalf("contract layout %s %s, the family's form says %s %s", c.Layout, c.Oriented(), wantL, wantO)
			}
			sck := cktest.Open(t, src)
			if c.Layout == layout.AsStored {
				if len(ck.Tensors) != len(sck.Tensors) {
					t.Errorf("DST has %d tensors, SRC %d", len(ck.Tensors), len(sck.Tensors))
				}
				for _, st := range sck.Tensors {
					dt, ok := ck.Tensor(st.Name)
					if !ok {
						t.Fatalf("%s is missing", st.Name)
					}
					if !bytes.Equal(cktest.ReadAll(t, st), cktest.ReadAll(t, dt)) || dt.DType != st.DType || !slices.Equal(dt.StoredShape(), st.StoredShape()) {
						t.Fatalf("%s differs from SRC's", st.Name)
					}
				}
				return
			}
			l := fp.Layers[0]
			f, err := fp.Format()
			if err != nil {
				t.Fatal(err)
			}
			if c.ExpertsModule != dp.Module {
				t.Errorf("contract experts_module %q, the family's form says %q", c.ExpertsModule, dp.Module)
			}
			n := layout.NamesIn(layout.GateUp, l.Prefix, dp.Module, f)
			down, ok := ck.Tensor(n.Weight(layout.ProjDown))
			if !ok {
				t.Fatalf("%s is missing", n.Weight(layout.ProjDown))
			}
			E, H, I := int64(fp.NumExperts), int64(fp.HiddenSize), int64(fp.IntermediateOf(l))
			want := []int64{E, H, I}
			if wantO == layout.InOut {
				want = []int64{E, I, H}
			}
			if got := down.Shape; !slices.Equal(got[:1], want[:1]) || len(got) != 3 || !slices.Equal(got, want) {
				t.Errorf("%s: shape %v, want %v", down.Name, got, want)
			}
		})
	}
}

// TestLayoutTransformersForms holds the forms of the families whose form
// is not plain gate-up, and a few that are, to what transformers 5's
// modules hold (their safetensors names and shapes as the fixtures show):
// the family data must not drift from them.
func TestLayoutTransformersForms(t *testing.T) {
	for _, tc := range []struct {
		dir    string
		layout layout.Layout
		or     layout.Orientation
		tensor string // a DST tensor and its shape
		shape  []int64
	}{
		{"gpt-oss", layout.AsStored, layout.OutIn, "model.layers.0.mlp.experts.gate_up_proj_bias", []int64{8, 64}},
		{"gpt-oss-mxfp4", layout.AsStored, layout.OutIn, "model.layers.0.mlp.experts.gate_up_proj_blocks", []int64{8, 64, 2, 16}},
		{"aria", layout.AsStored, layout.OutIn, "language_model.model.layers.0.mlp.experts.fc1.weight", []int64{8, 64, 64}},
		{"dbrx", layout.AsStored, layout.OutIn, "transformer.blocks.0.ffn.experts.mlp.w2", []int64{256, 64}},
		{"granitemoehybrid", layout.GateUp, layout.OutIn, "model.layers.0.block_sparse_moe.experts.down_proj", []int64{8, 64, 32}},
		{"longcat-flash", layout.AsStored, layout.OutIn, "model.layers.0.mlp.experts.3.gate_proj.weight", []int64{32, 64}},
		{"step3p7", layout.GateUp, layout.OutIn, "model.layers.1.mlp.experts.gate_up_proj", []int64{8, 64, 64}},
		{"nemotron-h", layout.AsStored, layout.OutIn, "", nil},
		{"llama4-text", layout.GateUp, layout.InOut, "model.layers.1.feed_forward.experts.down_proj", []int64{8, 32, 64}},
		{"llama4", layout.GateUp, layout.InOut, "language_model.model.layers.1.feed_forward.experts.down_proj", []int64{8, 32, 64}},
		{"mixtral", layout.GateUp, layout.OutIn, "model.layers.0.mlp.experts.down_proj", []int64{8, 64, 32}},
		{"qwen3-moe", layout.GateUp, layout.OutIn, "model.layers.1.mlp.experts.gate_up_proj", []int64{8, 64, 64}},
		{"granitemoe", layout.GateUp, layout.OutIn, "model.layers.0.block_sparse_moe.experts.down_proj", []int64{8, 64, 32}},
		{"granitemoeshared", layout.GateUp, layout.OutIn, "model.layers.1.block_sparse_moe.experts.gate_up_proj", []int64{8, 64, 64}},
		// Quantised experts are written as stored, each expert with its own
		// scales, under any family's form.
		{"deepseek-v3-fp8", layout.AsStored, layout.OutIn, "model.layers.1.mlp.experts.3.gate_proj.weight_scale_inv", []int64{1, 2}},
		{"glm4-moe-lite-fp8", layout.AsStored, layout.OutIn, "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv", []int64{1, 1}},
		{"deepseek-v4-fp8", layout.AsStored, layout.OutIn, "model.layers.1.ffn.experts.3.w2.weight_scale_inv", []int64{1, 1}},
		{"deepseek-v3-fp8-tensor", layout.AsStored, layout.OutIn, "model.layers.1.mlp.experts.3.down_proj.weight_scale", []int64{1, 1}}, // a scalar, read as its [1, 1] grid
		{"qwen3-moe-fp8-channel", layout.AsStored, layout.OutIn, "model.layers.1.mlp.experts.3.down_proj.weight_scale", []int64{64, 1}},
		{"deepseek-v3-int4", layout.AsStored, layout.OutIn, "model.layers.1.mlp.experts.3.gate_proj.weight_packed", []int64{32, 20}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			src := filepath.Join(hfDir, tc.dir)
			dst := filepath.Join(t.TempDir(), "out")
			var notes []string
			sum, err := Convert(context.Background(), Options{Src: src, Dst: dst, Layout: layout.Transformers, Notice: func(s string) { notes = append(notes, s) }})
			if err != nil {
				t.Fatal(err)
			}
			if sum.Layout != string(tc.layout) || layout.Orientation(cmpOr(sum.Orientation, string(layout.OutIn))) != tc.or {
				t.Errorf("wrote %s %q, want %s %s", sum.Layout, sum.Orientation, tc.layout, tc.or)
			}
			if !slices.ContainsFunc(notes, func(n string) bool {
				return strings.HasPrefix(n, "--layout transformers: ") && strings.Contains(n, "writing layout "+string(tc.layout))
			}) {
				t.Errorf("no notice of the form written: %q", notes)
			}
			if tc.tensor == "" {
				return
			}
			tn, ok := cktest.Open(t, dst).Tensor(tc.tensor)
			if !ok {
				t.Fatalf("%s is missing", tc.tensor)
			}
			if tc.shape != nil && !slices.Equal(tn.Shape, tc.shape) {
				t.Errorf("%s: shape %v, want %v", tc.tensor, tn.Shape, tc.shape)
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestLayoutTransformersRefusals: what would make the output something
// transformers does not load as the original is refused, naming why.
func TestLayoutTransformersRefusals(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		o    Options
		want string
	}{
		{"deepseek-v3-bf16", Options{FuseShared: true}, "fuse-shared --layout transformers"},
		{"qwen3-moe", Options{EP: 2}, "--layout transformers with --ep"},
		{"qwen3-moe", Options{Orientation: layout.InOut}, "transformers 5 holds qwen3_moe's experts out-in"},
		{"llama4-text", Options{Orientation: layout.OutIn}, "transformers 5 holds llama4_text's experts in-out"},
		{"gpt-oss", Options{Orientation: layout.InOut}, "as the checkpoint stores them, which --orientation cannot change"},
		{"gpt-oss-mxfp4", Options{DType: "BF16"}, "copied as they are and not dequantised"},
		{"deepseek-v3-fp8", Options{DType: "BF16"}, "deepseek_v3's experts are written as the checkpoint stores them (transformers 5 dequantises FP8 experts per expert"},
		{"deepseek-v3-fp8", Options{Orientation: layout.InOut}, "which --orientation cannot change"},
		{"deepseek-v3-bf16", Options{FoldScaling: layout.FoldDown}, "would apply it twice"},
	} {
		t.Run(fmt.Sprint(tc.dir, "/", tc.want), func(t *testing.T) {
			o := tc.o
			o.Src, o.Dst, o.Layout = filepath.Join(hfDir, tc.dir), filepath.Join(t.TempDir(), "out"), layout.Transformers
			_, err := Convert(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// Without --layout transformers, --orientation in-out stays a choice.
	o := Options{Src: filepath.Join(hfDir, "qwen3-moe"), Dst: filepath.Join(t.TempDir(), "out"), Layout: layout.GateUp, Orientation: layout.InOut}
	if _, err := Convert(context.Background(), o); err != nil {
		t.Errorf("gate-up in-out: %v", err)
	}
}
