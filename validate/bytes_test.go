package validate

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestBytesCleanConversions: the structural proof passes on every correct
// conversion of the HF fixtures (every layout, fuse-shared, every fold).
func TestBytesCleanConversions(t *testing.T) {
	for _, c := range conversionCases() {
		t.Run(c.name(), func(t *testing.T) {
			src := filepath.Join(hfFixtures, c.fixture)
			dst := convertInto(t, src, c.o)
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			b := rep.Bytes
			if b == nil || !b.Pass || rep.Failed() || b.Tensors == 0 || b.DstBytes == 0 || len(rep.Rows) != 0 {
				t.Fatalf("bytes: %+v (mismatch %v)", b, b.Mismatch)
			}
			folds := c.o.FuseShared && (c.o.FoldScaling == "down" || (c.fixture == "deepseek-v3-fp8" && c.o.FoldScaling != "none"))
			if folds && b.FoldMaxRelChange == 0 {
				t.Errorf("folded values were not compared")
			}
		})
	}
}

// TestBytesMismatchKinds plants one structural error of each kind and
// checks the proof fails (exit 1) naming the kind, tensor, layer, expert
// and byte offset.
func TestBytesMismatchKinds(t *testing.T) {
	fp8 := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	bf16 := filepath.Join(hfFixtures, "deepseek-v3-bf16")
	v2 := filepath.Join(hfFixtures, "deepseek-v2-lite") // 2 shared experts: replicas are split
	p := "model.layers.1.mlp"
	for _, tc := range []struct {
		name   string
		src    string
		o      convert.Options
		mutate func(t *testing.T, dst string) string // returns the tensor it touched
		kind   string
		expert int
		offset int64 // -1: do not check
	}{
		{"routed slice byte", fp8, convert.Options{FuseShared: true, TP: 1}, func(t *testing.T, dst string) string {
			n := layout.Names(layout.Stacked, p, true).Weight(layout.ProjGate)
			rewriteTensor(t, dst, n, func(raw []byte, shape []int64) { slice(raw, shape, 5)[100] ^= 1 })
			return n
		}, byteproof.MismatchBytes, 5, -1},
		{"replica differs from its shared expert", bf16, convert.Options{FuseShared: true, TP: 4, Layout: layout.GateUp}, func(t *testing.T, dst string) string {
			n := layout.Names(layout.GateUp, p, false).Weight(layout.ProjDown)
			rewriteTensor(t, dst, n, func(raw []byte, shape []int64) { slice(raw, shape, 16+2)[0] ^= 0x40 })
			return n
		}, byteproof.MismatchBytes, 18, 18 * 160 * 32 * 2},
		{"split shared slice wrong", v2, convert.Options{FuseShared: true, TP: 2, Layout: layout.UpGate}, func(t *testing.T, dst string) string {
			n := layout.Names(layout.UpGate, p, false).Weight(layout.ProjGateUp)
			// replica 1, slice 1 is bank expert 8 + 1*2 + 1 = 11: one bit of its up rows
			rewriteTensor(t, dst, n, func(raw []byte, shape []int64) { m := slice(raw, shape, 11); m[3] ^= 0x01 })
			return n
		}, byteproof.MismatchBytes, 11, -1},
		{"folded bf16 value off", bf16, convert.Options{FuseShared: true, TP: 1, FoldScaling: "down"}, func(t *testing.T, dst string) string {
			n := layout.Names(layout.Stacked, p, false).Weight(layout.ProjDown)
			rewriteTensor(t, dst, n, func(raw []byte, shape []int64) {
				m := slice(raw, shape, 7)
				scaleBF16(m[20:22], 1.02)
			})
			return n
		}, byteproof.MismatchFold, 7, -1},
		{"folded fp8 scale off", fp8, convert.Options{FuseShared: true, TP: 2, Layout: layout.GateUp}, func(t *testing.T, dst string) string {
			n := layout.Names(layout.GateUp, p, true).Get(layout.ProjDown, layout.RoleScale)
			rewriteTensor(t, dst, n, func(raw []byte, shape []int64) { scaleF32(slice(raw, shape, 9)[:4], 1+1e-5) })
			return n
		}, byteproof.MismatchFold, 9, -1},
		{"copied tensor differs", bf16, convert.Options{}, func(t *testing.T, dst string) string {
			n := "model.layers.0.mlp.down_proj.weight"
			rewriteTensor(t, dst, n, func(raw []byte, _ []int64) { raw[len(raw)-1] ^= 0x10 })
			return n
		}, byteproof.MismatchBytes, -1, -1},
		{"NaN in a stack", fp8, convert.Options{FuseShared: true, TP: 1}, func(t *testing.T, dst string) string {
			n := layout.Names(layout.Stacked, p, true).Weight(layout.ProjUp)
			rewriteTensor(t, dst, n, func(raw []byte, shape []int64) { slice(raw, shape, 2)[7] = 0x7F })
			return n
		}, byteproof.MismatchNaN, 2, -1},
		{"manifest: the index changed", bf16, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) string {
			// Trailing space: the index still reads the same, only its hash
			// tells. (A changed copy is compared with SRC's file first:
			// TestDirectoryProof.)
			f := filepath.Join(dst, safetensors.IndexFileName)
			testkit.WriteFile(t, f, append(testkit.ReadFile(t, f), ' '))
			return ""
		}, byteproof.MismatchManifest, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertInto(t, tc.src, tc.o)
			tensor := tc.mutate(t, dst)
			rep, err := Run(context.Background(), Options{Src: tc.src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if exitcode.Code(rep.Err()) != exitcode.CheckFailed || rep.Bytes == nil || rep.Bytes.Mismatch == nil {
				t.Fatalf("not caught: %+v", rep.Bytes)
			}
			m := rep.Bytes.Mismatch
			if m.Kind != tc.kind || m.Tensor != tensor || m.Expert != tc.expert || (tc.offset >= 0 && m.Offset != tc.offset) {
				t.Fatalf("got %s; want kind %q tensor %q expert %d offset %d", m.Error(), tc.kind, tensor, tc.expert, tc.offset)
			}
			if tensor != "" && (!strings.Contains(rep.Err().Error(), tensor) || (tc.expert >= 0 && m.Layer != 1)) {
				t.Errorf("error %q does not name tensor %s in layer 1", rep.Err(), tensor)
			}
			t.Logf("caught: %s", m.Error())
		})
	}
}

// TestNonFiniteWeightsFail: a NaN or Inf in any weight, scale or bias
// validate reads fails its layer with a non-finite row naming the tensor
// (and the layer and expert), exit 1, on whichever side it is.
func TestNonFiniteWeightsFail(t *testing.T) {
	fp8 := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	for _, tc := range []struct {
		name, tensor string
		inSrc        bool
		mutate       func(raw []byte, shape []int64)
		want         string
	}{
		{"NaN fp8 byte in a DST stack", layout.Names(layout.Stacked, "model.layers.1.mlp", true).Weight(layout.ProjDown), false,
			func(raw []byte, shape []int64) { slice(raw, shape, 4)[11] = 0xFF }, "expert 4"},
		{"Inf weight scale in DST", layout.Names(layout.Stacked, "model.layers.1.mlp", true).Get(layout.ProjGate, layout.RoleScale), false,
			func(raw []byte, shape []int64) {
				binary.LittleEndian.PutUint32(slice(raw, shape, 1), math.Float32bits(float32(math.Inf(1))))
			}, "expert 1"},
		{"NaN correction bias in SRC", "model.layers.1.mlp.gate.e_score_correction_bias", true,
			func(raw []byte, _ []int64) {
				binary.LittleEndian.PutUint32(raw[8:], math.Float32bits(float32(math.NaN())))
			}, "layer 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := fp8
			dst := convertInto(t, fp8, convert.Options{FuseShared: true, TP: 1})
			if tc.inSrc {
				src = filepath.Join(t.TempDir(), "src")
				testkit.CopyDir(t, fp8, src)
				rewriteTensor(t, src, tc.tensor, tc.mutate)
			} else {
				rewriteTensor(t, dst, tc.tensor, tc.mutate)
			}
			rep := runFail(t, Options{Src: src, Dst: dst, Seed: 2, Bytes: BytesOff}, "a non-finite value")
			found := false
			for _, r := range rep.Rows {
				if r.Check == judge.NonFinite {
					found = true
					if r.Pass || r.Layer != 1 || !strings.Contains(r.Reason, tc.tensor) || !strings.Contains(r.Reason, tc.want) || !strings.Contains(r.Reason, "NaN or Inf") {
						t.Errorf("row %+v", r)
					}
					t.Logf("layer %d: %s", r.Layer, r.Reason)
				}
			}
			if !found {
				t.Fatalf("no non-finite row: %+v", rep.Rows)
			}
		})
	}
}
