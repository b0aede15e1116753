package tensorload

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// fp8Stack is N random FP8 [2I, H] gate-up slices with their scales
// stored as two grids of ceil(I/bo) rows per slice (layout.StackShapes), and
// the value of every element computed by hand from numfmt.
type fp8Stack struct {
	n, inter, h, bo, bi int
	codes               []byte    // [n, 2I, H]
	scales              []float32 // [n, 2*ceil(I/bo), ceil(H/bi)]
}

func newFP8Stack(rng *rand.Rand, n, inter, h, bo, bi int) *fp8Stack {
	s := &fp8Stack{n: n, inter: inter, h: h, bo: bo, bi: bi, codes: make([]byte, n*2*inter*h)}
	for i := range s.codes {
		for s.codes[i]&0x7F == 0 || s.codes[i]&0x7F == 0x7F {
			s.codes[i] = byte(rng.IntN(256))
		}
	}
	gr, gc := ScaleDims(inter, h, bo, bi)
	s.scales = make([]float32, n*2*gr*gc)
	for i := range s.scales {
		s.scales[i] = float32(rng.Float64() + 0.1)
	}
	return s
}

// want is element (r, c) of half (0 gate, 1 up) of slice e.
func (s *fp8Stack) want(e, half, r, c int) float32 {
	gr, gc := ScaleDims(s.inter, s.h, s.bo, s.bi)
	code := s.codes[(e*2*s.inter+half*s.inter+r)*s.h+c]
	return numfmt.E4M3ToF32(code) * s.scales[(e*2*gr+half*gr+r/s.bo)*gc+c/s.bi]
}

func (s *fp8Stack) source() cktest.Mem {
	m := cktest.Mem{}
	gr, gc := ScaleDims(s.inter, s.h, s.bo, s.bi)
	m.Put("w", safetensors.F8E4M3, []int64{int64(s.n), int64(2 * s.inter), int64(s.h)}, s.codes)
	sb := make([]byte, 4*len(s.scales))
	for i, v := range s.scales {
		binary.LittleEndian.PutUint32(sb[4*i:], math.Float32bits(v))
	}
	m.Put("w_scale_inv", safetensors.F32, []int64{int64(s.n), int64(2 * gr), int64(gc)}, sb)
	return m
}

// loadMatrix reads each half of a stacked FP8 gate-up slice with the scale
// rows its own grid has, for I on and off the block edge, and dequantises
// every element to its code times its block's scale.
func TestLoadMatrixFP8Halves(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 28))
	for _, tc := range []struct{ inter, h, bo, bi int }{{8, 12, 4, 4}, {6, 10, 4, 3}, {130, 20, 128, 128}} {
		s := newFP8Stack(rng, 3, tc.inter, tc.h, tc.bo, tc.bi)
		src := s.source()
		gr, _ := ScaleDims(tc.inter, tc.h, tc.bo, tc.bi)
		for e := range s.n {
			for half := range 2 {
				ref := MatrixRef{Name: "w", Index: e, Rows: tc.inter, Cols: tc.h, SliceRows: 2 * tc.inter, RowStart: half * tc.inter,
					Scale: "w_scale_inv", ScaleSliceRows: 2 * gr, ScaleRowStart: half * gr, Format: weightfmt.FP8Block(int64(tc.bo), int64(tc.bi), false)}
				got, err := LoadMatrix(src, ref)
				if err != nil {
					t.Fatalf("%+v expert %d half %d: %v", tc, e, half, err)
				}
				for i, v := range got {
					if w := s.want(e, half, i/tc.h, i%tc.h); v != w {
						t.Fatalf("%+v expert %d half %d element %d = %v, want %v", tc, e, half, i, v, w)
					}
				}
			}
		}
	}
}

// The loader refuses a weight whose dtype and scale disagree, naming what
// is wrong.
func TestLoadMatrixRefusesMismatchedFormats(t *testing.T) {
	src := cktest.Mem{}
	src.Put("fp8", safetensors.F8E4M3, []int64{4, 4}, bytes.Repeat([]byte{0x38}, 16))
	src.Put("bf16", safetensors.BF16, []int64{4, 4}, bytes.Repeat([]byte{0x80, 0x3f}, 16))
	src.Put("scale", safetensors.F32, []int64{1, 1}, binary.LittleEndian.AppendUint32(nil, math.Float32bits(2)))
	src.Put("bf16scale", safetensors.BF16, []int64{1, 1}, []byte{0x80, 0x3f})
	src.Put("ints", safetensors.I32, []int64{4, 4}, make([]byte, 64))
	fp8x4 := weightfmt.FP8Block(4, 4, false)
	for _, tc := range []struct {
		name string
		ref  MatrixRef
		want string
	}{
		{"fp8 without its scale", MatrixRef{Name: "fp8", Index: -1, Rows: 4, Cols: 4}, "is F8_E4M3 without a weight_scale_inv"},
		{"bf16 with a scale", MatrixRef{Name: "bf16", Index: -1, Rows: 4, Cols: 4, Scale: "scale", Format: fp8x4}, "is BF16 but has a block scale scale (expected F8_E4M3)"},
		{"a scale but no format", MatrixRef{Name: "fp8", Index: -1, Rows: 4, Cols: 4, Scale: "scale"}, "names a scale scale but no weight format"},
		{"a scale of a plain format", MatrixRef{Name: "fp8", Index: -1, Rows: 4, Cols: 4, Scale: "scale", Format: weightfmt.Plain(safetensors.BF16)}, "its format BF16 has none"},
		{"a bf16 scale", MatrixRef{Name: "fp8", Index: -1, Rows: 4, Cols: 4, Scale: "bf16scale", Format: fp8x4}, "scale bf16scale is BF16, want F32"},
		{"rows off the block edge", MatrixRef{Name: "fp8", Index: -1, Rows: 2, Cols: 4, SliceRows: 4, RowStart: 2, Scale: "scale", Format: fp8x4}, "do not start a 4-row scale block"},
		{"integers", MatrixRef{Name: "ints", Index: -1, Rows: 4, Cols: 4}, "dtype I32 is not a floating-point type"},
	} {
		if _, err := LoadMatrix(src, tc.ref); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	got, err := LoadMatrix(src, MatrixRef{Name: "fp8", Index: -1, Rows: 4, Cols: 4, Scale: "scale", Format: fp8x4})
	if err != nil || got[0] != 2 || got[15] != 2 {
		t.Errorf("fp8 ones times scale 2: %v %v", got, err)
	}
}
