package byteproof

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

// The byte proof on its own, without validate.Run: small HF fixtures
// converted here, proven with CheckBytes, and the prediction's segments
// checked against what the layout says by hand.

const hfFixtures = "../../fixtures/hf"

// converted is a fixture and its conversion, opened.
type converted struct {
	src, dst *checkpoint.Checkpoint
	dstDir   string
	plan     *family.Plan
	c        *layout.Contract
}

// convertFixture converts fixture with o into a temporary directory; mutate
// (nil: none) changes DST before it is opened.
func convertFixture(t *testing.T, fixture string, o convert.Options, mutate func(dst string)) converted {
	t.Helper()
	o.Src = filepath.Join(hfFixtures, fixture)
	o.Dst = filepath.Join(t.TempDir(), "dst")
	if _, err := convert.Convert(context.Background(), o); err != nil {
		t.Fatalf("convert %s: %v", fixture, err)
	}
	if mutate != nil {
		mutate(o.Dst)
	}
	src, plan := cktest.OpenPlanned(t, o.Src)
	dst := cktest.Open(t, o.Dst)
	c, ok, err := layout.ReadContract(dst.Config)
	if err != nil || !ok {
		t.Fatalf("%s: contract: %v (found %v)", o.Dst, err, ok)
	}
	return converted{src: src, dst: dst, dstDir: o.Dst, plan: plan, c: c}
}

// flipByte flips the low bit of byte off of tensor name in DST's files,
// found through the file's own header.
func flipByte(t *testing.T, dst, name string, off int64) {
	t.Helper()
	ck, err := checkpoint.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	tn, ok := ck.Tensor(name)
	ck.Close()
	if !ok {
		t.Fatalf("%s: no tensor %s", dst, name)
	}
	h, err := testkit.ReadSTHeader(tn.File)
	if err != nil {
		t.Fatal(err)
	}
	testkit.FlipBits(t, tn.File, h.DataStart+h.Tensors[name].DataOffsets[0]+off, 0x01)
}

// TestCheckBytesTable: the proof passes an untouched conversion (every
// tensor, file and byte accounted for) and fails one whose DST differs by
// one byte, naming the kind, the tensor, the layer, the bank expert and the
// byte.
func TestCheckBytesTable(t *testing.T) {
	const p = "model.layers.1.mlp"
	const I, H = 32, 160    // deepseek-v3-bf16's sizes; 16 routed experts
	per := int64(I * H * 2) // one bf16 expert slice of a gate, up or down stack
	for _, tc := range []struct {
		name    string
		fixture string
		o       convert.Options
		tensor  string // flipped in DST ("": untouched)
		off     int64  // the byte flipped, within the tensor
		expert  int    // bank expert named, -1: none
		layer   int    // layer named, -1: none
	}{
		{"untouched stacked", "deepseek-v3-bf16", convert.Options{TP: 1}, "", 0, 0, 0},
		{"untouched fused gate-up, fuse-shared tp 4", "deepseek-v3-bf16", convert.Options{FuseShared: true, TP: 4, Layout: layout.GateUp}, "", 0, 0, 0},
		{"untouched fp8 fuse-shared", "deepseek-v3-fp8", convert.Options{FuseShared: true, TP: 1}, "", 0, 0, 0},
		{"routed slice of the gate stack", "deepseek-v3-bf16", convert.Options{TP: 1},
			layout.Names(layout.Stacked, p, false).Weight(layout.ProjGate), 5*per + 100, 5, 1},
		{"replica of the shared expert (bank expert 16 + 2)", "deepseek-v3-bf16", convert.Options{FuseShared: true, TP: 4, Layout: layout.GateUp},
			layout.Names(layout.GateUp, p, false).Weight(layout.ProjDown), 18 * per, 18, 1},
		{"a copied tensor (the router)", "deepseek-v3-bf16", convert.Options{TP: 1},
			p + ".gate.weight", 7, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mutate func(string)
			if tc.tensor != "" {
				mutate = func(dst string) { flipByte(t, dst, tc.tensor, tc.off) }
			}
			cv := convertFixture(t, tc.fixture, tc.o, mutate)
			res, err := CheckBytes(context.Background(), cv.src, cv.dst, cv.plan, cv.c, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.tensor == "" {
				if !res.Pass || res.Mismatch != nil || res.Tensors == 0 || res.Files == 0 || res.DstBytes == 0 || res.SrcBytes == 0 {
					t.Fatalf("untouched conversion: %+v (mismatch %v)", res, res.Mismatch)
				}
				return
			}
			m := res.Mismatch
			if res.Pass || m == nil {
				t.Fatalf("one byte of %s changed, and the proof passed: %+v", tc.tensor, res)
			}
			if m.Kind != MismatchBytes || m.Tensor != tc.tensor || m.Expert != tc.expert || m.Layer != tc.layer || m.Offset != tc.off {
				t.Errorf("mismatch %+v, want %s of %s, layer %d, expert %d, byte %d", *m, MismatchBytes, tc.tensor, tc.layer, tc.expert, tc.off)
			}
		})
	}
}

// TestPredictStacks: each stack is its bank experts' bytes in bank order,
// each a whole source matrix (or, for a split shared expert, its rows or
// columns of the slice), a folded down projection carrying rsf and nothing
// else a fold.
func TestPredictStacks(t *testing.T) {
	const p = "model.layers.1.mlp"
	for _, tc := range []struct {
		name    string
		fixture string
		o       convert.Options
		I, H, E int // routed experts
		S       int // shared slices (0: not fused)
		bank    int
		fold    float64 // rsf on the routed down slices
	}{
		{"stacked, not fused", "deepseek-v3-bf16", convert.Options{TP: 1}, 32, 160, 16, 0, 16, 0},
		{"fuse-shared tp 2, folded down", "deepseek-v3-bf16", convert.Options{FuseShared: true, TP: 2, FoldScaling: "down"}, 32, 160, 16, 1, 18, 2.5},
		// two shared experts of I each: replica r's slice s is bank expert
		// E + r*2 + s, rows s*I of the [2I, H] gate and columns of down
		{"two shared slices, tp 2", "deepseek-v2-lite", convert.Options{FuseShared: true, TP: 2}, 0, 0, 0, 2, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cv := convertFixture(t, tc.fixture, tc.o, nil)
			pred, err := predict(cv.src, cv.plan, cv.c)
			if err != nil {
				t.Fatal(err)
			}
			I, H, E, bank := tc.I, tc.H, tc.E, tc.bank
			if I == 0 { // read off the fixture
				I, H, E, bank = cv.plan.MoEIntermediateSize, cv.plan.HiddenSize, cv.plan.NumExperts, cv.c.BankSize()
			}
			if bank != cv.c.BankSize() {
				t.Fatalf("bank %d, want %d", cv.c.BankSize(), bank)
			}
			names := cv.c.Names(cv.c.Layers[0])
			es := int64(2) // bf16
			for _, st := range []struct {
				name, proj string
				rows       bool // a shared slice is rows (gate, up) or columns (down)
			}{{names.Weight(layout.ProjGate), "gate_proj", true}, {names.Weight(layout.ProjUp), "up_proj", true}, {names.Weight(layout.ProjDown), "down_proj", false}} {
				segs := pred.tensors[st.name]
				if len(segs) != bank {
					t.Fatalf("%s: %d segments, want one per bank expert (%d)", st.name, len(segs), bank)
				}
				want := pred.meta[st.name]
				if want.layer != 1 || want.dtype != "BF16" {
					t.Errorf("%s: meta %+v", st.name, want)
				}
				for b, sg := range segs {
					n := int64(I*H) * es
					if sg.off != int64(b)*n || sg.n != n || sg.expert != b || sg.layer != 1 {
						t.Fatalf("%s: expert %d: off %d n %d expert %d layer %d, want off %d n %d", st.name, b, sg.off, sg.n, sg.expert, sg.layer, int64(b)*n, n)
					}
					srcName := fmt.Sprintf("%s.experts.%d.%s.weight", p, b, st.proj)
					wantRanges := [][2]int64{{0, n}}
					wantFold := 0.0
					if b < E {
						if st.proj == "down_proj" {
							wantFold = tc.fold
						}
					} else {
						srcName = fmt.Sprintf("%s.shared_experts.%s.weight", p, st.proj)
						s := int64((b - E) % tc.S)
						if st.rows {
							wantRanges = [][2]int64{{s * n, (s + 1) * n}}
						} else { // columns s*I.. of each of H rows of tc.S*I
							wantRanges = nil
							row := int64(tc.S*I) * es
							for r := range int64(H) {
								wantRanges = append(wantRanges, [2]int64{r*row + s*int64(I)*es, r*row + (s+1)*int64(I)*es})
							}
							wantRanges = merged(wantRanges)
						}
					}
					if sg.src.Name != srcName || sg.fold != wantFold || fmt.Sprint(sg.ranges) != fmt.Sprint(wantRanges) {
						t.Fatalf("%s: expert %d: from %s %v fold %v, want %s %v fold %v", st.name, b, sg.src.Name, short(sg.ranges), sg.fold, srcName, short(wantRanges), wantFold)
					}
				}
			}
		})
	}
}

// merged joins ranges that touch: one slice of one is the whole matrix.
func merged(r [][2]int64) [][2]int64 {
	var out [][2]int64
	for _, x := range r {
		if len(out) > 0 && out[len(out)-1][1] == x[0] {
			out[len(out)-1][1] = x[1]
			continue
		}
		out = append(out, x)
	}
	return out
}

// short is the first few ranges, for a message.
func short(r [][2]int64) [][2]int64 { return r[:min(len(r), 3)] }
