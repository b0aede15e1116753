package validate

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/internal/testkit/handwrap"
	"github.com/moeprep/moeprep/layout"
)

// Qwen3-VL-MoE as its hub release stores it: the stacked experts
// transposed, gate_up_proj [E, H, 2I] and down_proj [E, I, H]; transformers
// 5.17's save (the committed fixture) holds [E, 2I, H] and [E, H, I]. The
// fixture with both tensors of every layer transposed is the same model:
// it plans transposed views, converts in every layout, and validates
// against the same goldens, the byte proof included.
func TestQwen3VLMoEHubLayout(t *testing.T) {
	src := filepath.Join(t.TempDir(), "qwen3-vl-moe-hub")
	testkit.CopyDir(t, filepath.Join(hfFixtures, "qwen3-vl-moe"), src)
	path := filepath.Join(src, "model.safetensors")
	b := testkit.ReadFile(t, path)
	h, err := testkit.ParseSTHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	data := b[h.DataStart:]
	n := 0
	for name, e := range h.Tensors {
		if !strings.HasSuffix(name, ".mlp.experts.gate_up_proj") && !strings.HasSuffix(name, ".mlp.experts.down_proj") {
			continue
		}
		if e.DType != "BF16" || len(e.Shape) != 3 {
			t.Fatalf("%s: %s %v", name, e.DType, e.Shape)
		}
		ne, rows, cols := e.Shape[0], e.Shape[1], e.Shape[2]
		blob := data[e.DataOffsets[0]:e.DataOffsets[1]]
		out := make([]byte, len(blob))
		for x := range ne {
			for r := range rows {
				for c := range cols {
					from, to := 2*(x*rows*cols+r*cols+c), 2*(x*rows*cols+c*rows+r)
					copy(out[to:to+2], blob[from:from+2])
				}
			}
		}
		copy(blob, out)
		e.Shape = []int64{ne, cols, rows}
		h.Tensors[name] = e
		n++
	}
	if n != 4 {
		t.Fatalf("transposed %d stacked tensors, want 4 (2 MoE layers)", n)
	}
	file, err := h.Bytes(data)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, path, file)
	if g := cktest.Plan(t, src).Layers[0].Experts[5].Weight(layout.ProjUp); g != "model.language_model.layers.1.mlp.experts.gate_up_proj[5][T:32:32:1]" {
		t.Fatalf("expert 5's up planned as %s, want a transposed view", g)
	}
	for _, l := range []layout.Layout{layout.Stacked, layout.GateUp, layout.UpGate} {
		t.Run(string(l), func(t *testing.T) {
			dst := convertInto(t, src, convert.Options{Layout: l})
			runPass(t, Options{Src: src, Dst: dst, Golden: filepath.Join(hfFixtures, "qwen3-vl-moe"), Seed: 1}, "validate failed on the hub layout's conversion")
		})
	}
}

// TestHandWrappersValidate: issue 30's second set of wrappers, built by
// hand as transformers 5.17 saves them, converted (the default layout, and
// fuse-shared where the text model's shared expert is ungated) and
// validated on the CPU: every MoE layer of the text model checked and
// passing, the rest of the wrapper proven carried.
func TestHandWrappersValidate(t *testing.T) {
	srcs := map[string]string{}
	for mt, h := range handwrap.Wrappers() {
		srcs[mt] = cktest.WriteHand(t, h, 31)
	}
	srcs["inkling_mm_model"] = cktest.InklingMM(t, filepath.Join("..", "fixtures", "hf", "inkling-text"))
	cases := []struct {
		mt   string
		o    convert.Options
		moe  []int
		text string
	}{
		{"qwen3_omni_moe", convert.Options{}, []int{1}, "qwen3_omni_moe_text"},
		{"aria", convert.Options{Layout: layout.GateUp}, []int{0, 1}, "aria_text"},
		{"aria", convert.Options{FuseShared: true, TP: 1}, []int{0, 1}, "aria_text"},
		{"minimax_m3_vl", convert.Options{}, []int{1}, "minimax_m3_vl_text"},
		{"minimax_m3_vl", convert.Options{FuseShared: true, TP: 1, Layout: layout.UpGate}, []int{1}, "minimax_m3_vl_text"},
		{"inkling_mm_model", convert.Options{}, []int{1, 2}, "inkling_text"},
	}
	for _, c := range cases {
		t.Run(c.mt, func(t *testing.T) {
			p := cktest.Plan(t, srcs[c.mt])
			if p.Wrapper == nil || p.Wrapper.ModelType != c.mt || p.ModelType != c.text {
				t.Fatalf("planned %s in %+v", p.ModelType, p.Wrapper)
			}
			dst := convertInto(t, srcs[c.mt], c.o)
			rep, err := Run(context.Background(), Options{Src: srcs[c.mt], Dst: dst, Device: "cpu", Tokens: 16, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			if err := rep.Err(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if !slices.Equal(rep.MoELayers, c.moe) || !slices.Equal(rep.LayersChecked, c.moe) {
				t.Errorf("MoE layers %v, checked %v, want %v", rep.MoELayers, rep.LayersChecked, c.moe)
			}
		})
	}
	// What the wrapper carries is proven carried: one bit of the talker's
	// own (unplanned) MoE, or of MiniMax-M3's vision tower, changed in the
	// output fails validate naming it.
	for mt, name := range map[string]string{
		"qwen3_omni_moe": "talker.model.layers.0.mlp.experts.2.up_proj.weight",
		"minimax_m3_vl":  "vision_tower.vision_model.embeddings.patch_embedding.weight",
	} {
		t.Run(mt+" carried", func(t *testing.T) {
			dst := convertInto(t, srcs[mt], convert.Options{})
			rewriteTensor(t, dst, name, func(raw []byte, _ []int64) { raw[3] ^= 0x10 })
			rep, err := Run(context.Background(), Options{Src: srcs[mt], Dst: dst, Device: "cpu", Tokens: 16, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			if err := rep.Err(); err == nil || !strings.Contains(err.Error(), "bytes: ") || !strings.Contains(err.Error(), name+": bytes differ") {
				t.Errorf("a changed %s: validate says %v", name, err)
			}
		})
	}
}
