package convert

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// TestHFFixtures converts every committed HF fixture (fixtures/hf/*/config.json)
// with each layout and, where the family has a shared expert, fuse-shared.
// The fixtures index (fixtures/hf/index.go) lists the committed fixtures, so
// the test fails when one goes missing.
//
// Issue 29's low-bit variants (hf.Fixture.LowBit: FP8 per tensor or channel,
// INT4, NVFP4, MXFP4): this file's byte model knows bf16 and FP8 128x128
// blocks only; their bytes are proven by validate's byte proof in validate's
// TestValidateCorrectConversions, with transformers' goldens, in every
// layout. Here they are converted in every layout and must succeed.
// hfDir holds the HF fixtures.
var hfDir = filepath.Join("..", "fixtures", "hf")

func TestHFFixtures(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(hfDir, "*", "config.json"))
	found := map[string]bool{}
	for _, c := range dirs {
		found[filepath.Base(filepath.Dir(c))] = true
	}
	for _, fx := range hf.All() {
		if !found[fx.Dir] {
			t.Errorf("HF fixture %s is missing", fx.Dir)
		}
	}
	if len(dirs) != len(hf.All()) {
		t.Errorf("found %d HF fixtures, the index lists %d: keep them in step", len(dirs), len(hf.All()))
	}
	for _, c := range dirs {
		checkHFFixture(t, filepath.Dir(c))
	}
}

// checkHFFixture converts one fixture several ways and verifies each output
// against the source through the family plan (no knowledge of the generator).
func checkHFFixture(t *testing.T, src string) {
	fp := cktest.Plan(t, src)
	// An HF fixture's row in the fixtures index says which layouts convert
	// takes; the other sources (synth presets, hand-made wrappers) have none.
	fx, inIndex := hf.Lookup(filepath.Base(src))
	if filepath.Dir(src) == hfDir && !inIndex {
		t.Fatalf("%s has no row in the fixtures index", src)
	}
	inIndex = inIndex && filepath.Dir(src) == hfDir
	runs := []Options{{}, {Layout: layout.GateUp}, {Layout: layout.UpGate}}
	if fp.NumSharedExperts > 0 && !fp.SharedGated {
		fold := Options{FuseShared: true, TP: 1, FoldScaling: "down", Layout: layout.GateUp}
		if fp.Act.Ungated() {
			fold.Layout = layout.Stacked // the only layout of ungated experts
		}
		runs = append(runs, Options{FuseShared: true, TP: 2}, fold)
	}
	for i, o := range runs {
		name := fmt.Sprintf("%s/%s/fuse=%v/tp%d/%s", filepath.Base(src), o.Layout, o.FuseShared, o.TP, o.FoldScaling)
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), fmt.Sprint("out", i))
			o.Src, o.Dst = src, dst
			sum, err := Convert(context.Background(), o)
			lay := cmp.Or(o.Layout, layout.Stacked)
			if inIndex && !o.FuseShared && slices.Contains(fx.Layouts, string(lay)) != (err == nil) {
				t.Errorf("--layout %s: %v, but the fixtures index lists layouts %v", lay, err, fx.Layouts)
			}
			if o.Layout.Fused() && fp.Act.Ungated() {
				// Nemotron-H: no gate rows to fuse, refused in one line naming the way out
				if err == nil || !strings.Contains(err.Error(), "no gate rows to fuse") || !strings.Contains(err.Error(), "--layout stacked") {
					t.Fatalf("--layout %s of ungated experts: %v, want the refusal", o.Layout, err)
				}
				return
			}
			if err != nil {
				if o.FoldScaling == "down" && strings.Contains(err.Error(), "UE8M0") {
					return
				}
				// FP8 with S > 1 shared experts of I not a multiple of the block:
				// the documented refusal (afmoe-fp8, ernie4-5-moe-fp8).
				if o.FuseShared && fp.Quantization == family.QuantFP8Block && fp.NumSharedExperts > 1 &&
					fp.MoEIntermediateSize%128 != 0 && strings.Contains(err.Error(), "cannot be split exactly") {
					return
				}
				// Llama 4's input-scaled routing: fuse-shared refuses, naming why.
				if o.FuseShared && fp.RoutedInputScaled && strings.Contains(err.Error(), "scales the routed experts' input") {
					return
				}
				// Inkling: the router weights each shared expert per token.
				if o.FuseShared && fp.SharedRouted && strings.Contains(err.Error(), "weights each shared expert per token") {
					return
				}
				// ERNIE 4.5 use_bias: the shared expert's biases cannot ride in fused slots.
				if o.FuseShared && fp.Layers[0].Shared != nil && fp.Layers[0].Shared.Get(layout.ProjGate, layout.RoleBias) != "" && strings.Contains(err.Error(), "the shared expert has biases") {
					return
				}
				// ERNIE-4.5-VL: the shared MLP serves both banks of a layer.
				if o.FuseShared && fp.Layers[0].Bank != family.NoBank && strings.Contains(err.Error(), "both routed banks") {
					return
				}
				// NVFP4's E4M3 block scales and MXFP8's E8M0 scales cannot take rsf exactly.
				if o.FoldScaling == "down" && (fp.Quantization == family.QuantNVFP4 || fp.Quantization == family.QuantMXFP8) && strings.Contains(err.Error(), "use --fold-scaling auto or none") {
					return
				}
				// HY-V4 and Step-3.7's clamped layers: the shared MLP's
				// activation is not the routed experts'.
				if o.FuseShared && strings.Contains(err.Error(), "runs its shared MLP with another activation") {
					return
				}
				// Kimi's INT4 routed experts beside a BF16 shared expert.
				if o.FuseShared && fp.SharedQuantization != "" && strings.Contains(err.Error(), "would requantise the shared expert") {
					return
				}
				t.Fatal(err)
			}
			if inIndex && fx.LowBit() {
				return // validate proves these bytes (see TestHFFixtures)
			}
			verifyAgainstPlan(t, src, dst, o, sum)
		})
	}
}

func verifyAgainstPlan(t *testing.T, src, dst string, o Options, sum *Summary) {
	ck, fp := cktest.OpenPlanned(t, src)
	out, cfg := readOut(t, dst)
	c, ok, err := layout.ReadContract(cfg)
	if !ok || err != nil {
		t.Fatalf("contract: %v %v", ok, err)
	}
	read := func(name string) []byte {
		if name == "" {
			return nil // an ungated MLP's gate
		}
		return cktest.Bytes(t, ck, name)
	}
	fp8 := c.Quantized()
	I, H := int64(fp.MoEIntermediateSize), int64(fp.HiddenSize)
	es := int64(fp.WeightDType.Size())
	S := c.SharedSlices
	consumed := map[string]bool{}
	seen := map[string]bool{}
	for _, l := range fp.Layers {
		names := c.Names(layout.LayerInfo{Index: l.Index, Prefix: l.Prefix})
		pick := func(n string) []byte {
			seen[n] = true
			d, ok := out[n]
			if !ok {
				t.Fatalf("output lacks %s", n)
			}
			return d.data
		}
		for b := 0; b < c.BankSize(); b++ {
			var g, u, d, gs, us, ds []byte
			if b < c.NumExperts {
				m := l.Experts[b]
				for _, n := range m.Names() {
					consumed[checkpoint.BaseName(n)] = true
				}
				g, u, d = read(m.Weight(layout.ProjGate)), read(m.Weight(layout.ProjUp)), read(m.Weight(layout.ProjDown))
				if fp8 {
					gs, us, ds = read(m.Get(layout.ProjGate, layout.RoleScale)), read(m.Get(layout.ProjUp, layout.RoleScale)), read(m.Get(layout.ProjDown, layout.RoleScale))
				}
			} else {
				m := *l.Shared
				for _, n := range m.Names() {
					consumed[checkpoint.BaseName(n)] = true
				}
				s := int64((b - c.NumExperts) % S)
				if m.Weight(layout.ProjGate) != "" {
					g = rowsOf(read(m.Weight(layout.ProjGate)), H*es, s*I, I)
				}
				u = rowsOf(read(m.Weight(layout.ProjUp)), H*es, s*I, I)
				d = colsOf(read(m.Weight(layout.ProjDown)), H, int64(S)*I*es, s*I*es, I*es)
				if S == 1 {
					g, u, d = read(m.Weight(layout.ProjGate)), read(m.Weight(layout.ProjUp)), read(m.Weight(layout.ProjDown))
				}
				if fp8 && S == 1 {
					gs, us, ds = read(m.Get(layout.ProjGate, layout.RoleScale)), read(m.Get(layout.ProjUp, layout.RoleScale)), read(m.Get(layout.ProjDown, layout.RoleScale))
				} else if fp8 {
					gc := layout.CeilDiv(H, 128) * 4
					gs = rowsOf(read(m.Get(layout.ProjGate, layout.RoleScale)), gc, s*I/128, layout.CeilDiv(I, 128))
					us = rowsOf(read(m.Get(layout.ProjUp, layout.RoleScale)), gc, s*I/128, layout.CeilDiv(I, 128))
					ds = colsOf(read(m.Get(layout.ProjDown, layout.RoleScale)), layout.CeilDiv(H, 128), int64(S)*layout.CeilDiv(I, 128)*4, s*I/128*4, layout.CeilDiv(I, 128)*4)
				}
			}
			where := fmt.Sprintf("layer %d id %d", l.Index, b)
			folded := c.RoutedScalingFactorFolded && b < c.NumExperts
			if c.Layout.Fused() {
				a, z, as, zs := g, u, gs, us
				if c.Layout == layout.UpGate {
					a, z, as, zs = u, g, us, gs
				}
				eqBytes(t, where+" gate/up", sliceOf(pick(names.Weight(layout.ProjGateUp)), int64(b), int64(len(a)+len(z))), append(append([]byte{}, a...), z...))
				if fp8 {
					eqBytes(t, where+" gate/up scale", sliceOf(pick(names.Get(layout.ProjGateUp, layout.RoleScale)), int64(b), int64(len(as)+len(zs))), append(append([]byte{}, as...), zs...))
				}
			} else {
				if names.Weight(layout.ProjGate) == "" {
					// ungated: the source has no gate, the output no all_gate
					if g != nil || !c.RoutedAct(layout.LayerInfo{Index: l.Index}).Ungated() {
						t.Fatalf("%s: no gate stack named, yet the source has a gate or the contract's activation is gated", where)
					}
					if _, ok := out[strings.Replace(names.Weight(layout.ProjUp), ".all_up.", ".all_gate.", 1)]; ok {
						t.Fatalf("%s: an ungated layer's output holds all_gate", where)
					}
				} else {
					eqBytes(t, where+" gate", sliceOf(pick(names.Weight(layout.ProjGate)), int64(b), int64(len(g))), g)
				}
				eqBytes(t, where+" up", sliceOf(pick(names.Weight(layout.ProjUp)), int64(b), int64(len(u))), u)
				if fp8 {
					eqBytes(t, where+" gate scale", sliceOf(pick(names.Get(layout.ProjGate, layout.RoleScale)), int64(b), int64(len(gs))), gs)
					eqBytes(t, where+" up scale", sliceOf(pick(names.Get(layout.ProjUp, layout.RoleScale)), int64(b), int64(len(us))), us)
				}
			}
			gotD := sliceOf(pick(names.Weight(layout.ProjDown)), int64(b), int64(len(d)))
			if folded && !fp8 {
				eqFolded(t, where+" down", gotD, d, fp.WeightDType, c.RoutedScalingFactor)
			} else {
				eqBytes(t, where+" down", gotD, d)
			}
			if bn, ok := c.Biases(layout.LayerInfo{Index: l.Index, Prefix: l.Prefix}); ok {
				m := l.Experts[b] // gpt-oss: biases read through the source's views
				gb, ub, db := read(m.Get(layout.ProjGate, layout.RoleBias)), read(m.Get(layout.ProjUp, layout.RoleBias)), read(m.Get(layout.ProjDown, layout.RoleBias))
				if c.Layout.Fused() {
					a, z := gb, ub
					if c.Layout == layout.UpGate {
						a, z = ub, gb
					}
					eqBytes(t, where+" gate/up bias", sliceOf(pick(bn.GateUp), int64(b), int64(len(a)+len(z))), append(append([]byte{}, a...), z...))
				} else {
					eqBytes(t, where+" gate bias", sliceOf(pick(bn.Gate), int64(b), int64(len(gb))), gb)
					eqBytes(t, where+" up bias", sliceOf(pick(bn.Up), int64(b), int64(len(ub))), ub)
				}
				eqBytes(t, where+" down bias", sliceOf(pick(bn.Down), int64(b), int64(len(db))), db)
			}
			if fp8 {
				gotS := sliceOf(pick(names.Get(layout.ProjDown, layout.RoleScale)), int64(b), int64(len(ds)))
				if folded {
					eqFolded(t, where+" down scale", gotS, ds, safetensors.F32, c.RoutedScalingFactor)
				} else {
					eqBytes(t, where+" down scale", gotS, ds)
				}
			}
		}
	}
	for _, st := range ck.Tensors {
		if consumed[st.Name] {
			continue
		}
		seen[st.Name] = true
		got, ok := out[st.Name]
		checkAsIs(t, st.Name, got, ok, tensorData{st.DType, st.Shape, read(st.Name)}, "output against the source")
	}
	for n := range out {
		if !seen[n] {
			t.Errorf("unexpected output tensor %s", n)
		}
	}
	m, err := layout.ReadManifest(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Verify(dst); err != nil {
		t.Error(err)
	}
	_ = sum
}
