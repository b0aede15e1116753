package weightfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// overflowWant is the OverflowError a target dtype gives: its place, its value
// (NaN: a NaN computed from finite source values) and how the message
// writes the value.
type overflowWant struct {
	row, col int64
	value    float64
	text     string
}

// dequantTargets are the dtypes --dtype takes (Dequantisable).
var dequantTargets = []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32}

// every is the same overflowWant for every target dtype.
func every(r overflowWant) map[safetensors.DType]*overflowWant {
	return map[safetensors.DType]*overflowWant{safetensors.BF16: &r, safetensors.F16: &r, safetensors.F32: &r}
}

// only is a overflowWant for the dtypes listed and none for the others.
func only(r overflowWant, ds ...safetensors.DType) map[safetensors.DType]*overflowWant {
	out := map[safetensors.DType]*overflowWant{}
	for _, d := range ds {
		out[d] = &r
	}
	return out
}

// piece is a weight and its stored bytes.
type piece struct {
	m   Matrix
	src MemRows
}

// mxfp4Weight is a 2x32 gpt-oss MXFP4 weight: every code 0 but code at
// row 1, column 5, whose group has E8M0 scale e (row 0's is 127, 1.0).
func mxfp4Weight(e, code byte) piece {
	raw := make([]byte, 32)
	raw[16+5/2] = code << 4 // column 5 is odd: the high nibble
	return piece{Matrix{Format: MXFP4(NamingGptOss, u8, u8), Rows: 2, Cols: 32}, MemRows{Raw: raw, Scale: []byte{127, e}}}
}

// int4Weight is a 2x32 INT4 weight with one BF16 scale a row: every value
// 0 (u = 8) but q = u - 8 at row 0, column 9, whose row has scale s (row
// 1's is 1).
func int4Weight(s float64, q int) piece {
	raw := make([]byte, 2*4*4)
	for w := range 8 {
		binary.LittleEndian.PutUint32(raw[4*w:], 0x88888888)
	}
	word := uint32(0x88888888)&^(0xF<<4) | uint32(q+8)<<4 // column 9: word 1, nibble 1
	binary.LittleEndian.PutUint32(raw[4:], word)
	return piece{Matrix{Format: Int4Pack(32, bf16), Rows: 2, Cols: 32}, MemRows{Raw: raw, Scale: bf16s(s, 1)}}
}

// fp8Weight is a 2x3 FP8 weight with one F32 scale s (its bits): the
// E4M3 code b at row 1, column 2, 0 elsewhere.
func fp8Weight(sBits uint32, b byte) piece {
	raw := make([]byte, 6)
	raw[5] = b
	return piece{Matrix{Format: FP8Tensor(f32), Rows: 2, Cols: 3}, MemRows{Raw: raw, Scale: f32s(math.Float32frombits(sBits))}}
}

// nvfp4Weight is a 1x16 NVFP4 weight: block scale E4M3 448, global g,
// code 7 (6.0) at column 3 and 0 elsewhere.
func nvfp4Weight(f Format, g float32) piece {
	raw := make([]byte, 8)
	raw[1] = 7 << 4
	return piece{Matrix{Format: f, Rows: 1, Cols: 16}, MemRows{Raw: raw, Scale: []byte{0x7e}, Global: f32s(g)}}
}

// --dtype refuses a finite source value whose exact dequantisation the
// target dtype cannot hold, in every target dtype, naming its row, column
// and value: past float32 itself (MXFP4's E8M0 254 = 2^127 times FP4 6,
// which the OCP MX spec defines; INT4's largest bf16 scale times -8),
// which the float32 product meets as an infinity, as well as past the
// target after rounding (bf16's halfway point above its largest value
// rounds up). A value every target holds is written as before, byte for
// byte; an infinity or NaN the source itself holds (an infinite scale,
// E8M0's NaN) is not refused.
func TestDequantRowsRefusesNonFiniteFromFinite(t *testing.T) {
	bf16Max := float64(math.Float32frombits(0x7f7f0000))
	for _, tc := range []struct {
		name string
		w    piece
		want map[safetensors.DType]*overflowWant
	}{
		{"mxfp4 E8M0 254 times FP4 6.0 (code 7)", mxfp4Weight(254, 7),
			every(overflowWant{1, 5, 6 * 0x1p127, "1.0208471007628154e+39"})},
		{"mxfp4 E8M0 254 times FP4 4.0 (code 6)", mxfp4Weight(254, 6),
			every(overflowWant{1, 5, 4 * 0x1p127, "6.80564733841877e+38"})},
		{"int4 scale 3.39e38 (largest bf16) times -8", int4Weight(3.39e38, -8),
			every(overflowWant{0, 9, -8 * bf16Max, "-2.7116251114012284e+39"})},
		{"fp8 448 times 1e36 past float32", fp8Weight(math.Float32bits(1e36), 0x7e),
			every(overflowWant{1, 2, 448 * float64(float32(1e36)), "4.479999828372617e+38"})},
		{"nvfp4 6 times 448 times 2e35 past float32", nvfp4Weight(NVFP4ModelOpt(), 2e35),
			every(overflowWant{0, 3, 6 * float64(float32(448)*float32(2e35)), "5.375999915741598e+38"})},
		// The block's effective scale (448 x 1e36) is past float32: its
		// zeros dequantise to 0 x Inf, NaN, from finite values.
		{"nvfp4 effective scale past float32", nvfp4Weight(NVFP4ModelOpt(), 1e36),
			every(overflowWant{0, 0, math.NaN(), "is NaN from finite source values"})},
		{"nvfp4 compressed-tensors global scale 0", nvfp4Weight(NVFP4CT(), 0),
			every(overflowWant{0, 0, math.NaN(), "is NaN from finite source values"})},
		// bf16 rounds to nearest even: float32 0x7F7F8000 is halfway
		// between bf16's largest value and the next power, and rounds to
		// the infinity; one below it rounds down to the largest value.
		{"fp8 1.0 times bf16's halfway point", fp8Weight(0x7f7f8000, 0x38),
			only(overflowWant{1, 2, float64(math.Float32frombits(0x7f7f8000)), "3.3961775e+38"}, safetensors.BF16, safetensors.F16)},
		{"fp8 1.0 times just under bf16's halfway point", fp8Weight(0x7f7f7fff, 0x38),
			only(overflowWant{1, 2, float64(math.Float32frombits(0x7f7f7fff)), "3.3961773e+38"}, safetensors.F16)},
		{"mxfp4 E8M0 254 times FP4 1.0 (2^127, finite)", mxfp4Weight(254, 2),
			only(overflowWant{1, 5, 0x1p127, "1.7014118e+38"}, safetensors.F16)},
		{"int4 largest bf16 times -1 (finite)", int4Weight(3.39e38, -1),
			only(overflowWant{0, 9, -bf16Max, "-3.3895314e+38"}, safetensors.F16)},
		{"mxfp4 E8M0 127 times 6 (finite)", mxfp4Weight(127, 7), nil},
		{"int4 scale +Inf times -8 (an infinity the source holds)", int4Weight(math.Inf(1), -8), nil},
		{"mxfp4 E8M0 NaN (a NaN the source holds)", mxfp4Weight(0xff, 7), nil},
	} {
		m, src := tc.w.m, tc.w.src
		vals := make([]float32, m.Rows*m.Cols)
		if err := DequantiseWeight(m.Format, src.Raw, int(m.Rows), int(m.Cols), src.Scale, src.Global, vals); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, to := range dequantTargets {
			want := tc.want[to]
			// One call for the whole weight and one a row (the row named
			// is the weight's, wherever the call starts), on the FP8
			// formats' table path and the general one alike.
			steps := []int64{m.Rows}
			if m.Rows > 1 {
				steps = append(steps, 1)
			}
			for _, step := range steps {
				for _, ref := range []bool{false, true} {
					what := fmt.Sprintf("%s to %s, %d rows a call, reference %v", tc.name, to, step, ref)
					d := Dequantiser{Reference: ref}
					var got []byte
					var err error
					for r := int64(0); r < m.Rows && err == nil; r += step {
						out := make([]byte, step*m.Cols*int64(to.Size()))
						err = d.DequantRows(m, src, r, step, to, out)
						got = append(got, out...)
					}
					if want == nil {
						if err != nil {
							t.Errorf("%s: %v, want it written", what, err)
						} else if !bytes.Equal(got, roundedOnce(to, vals)) {
							t.Errorf("%s: not the one rounding of the float32 dequantisation", what)
						}
						continue
					}
					var over *OverflowError
					if !errors.As(err, &over) {
						t.Errorf("%s: %v, want an overflow at row %d, column %d", what, err, want.row, want.col)
						continue
					}
					sameValue := over.Value == want.value || math.IsNaN(over.Value) && math.IsNaN(want.value)
					if over.Row != want.row || over.Col != want.col || !sameValue || over.To != to {
						t.Errorf("%s: %+v, want row %d, column %d, value %g", what, over, want.row, want.col, want.value)
					}
					msg := err.Error()
					for _, s := range []string{fmt.Sprintf("row %d, column %d", want.row, want.col), want.text, string(to)} {
						if !strings.Contains(msg, s) {
							t.Errorf("%s: %q does not say %q", what, msg, s)
						}
					}
				}
			}
		}
	}
}

// Every quantised format tells DequantRows an element's exact value and
// whether its source values are finite: without it an overflow past
// float32 would be written as an infinity.
func TestEveryScaledFormatDequantisesExactly(t *testing.T) {
	for _, f := range AllScaled() {
		if _, ok := f.(exactDequantiser); !ok {
			t.Errorf("%s does not implement exactDequantiser", f)
		}
	}
}

// encode writes every dtype's bytes as Encode always has and finds the
// first value whose encoding is an infinity or NaN, wherever it falls in
// encode32's steps of four (and its tail), and Encode still reports only a
// finite value that rounded to an infinity.
func TestEncodeFindsTheFirstNonFinite(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for n := range 11 {
		for at := -1; at < n; at++ {
			for _, bad := range []float32{inf, -inf, nan, 1e30} {
				vals := make([]float32, n)
				for i := range vals {
					vals[i] = float32(i) + 0.5
				}
				if at >= 0 {
					vals[at] = bad
					if at+2 < n {
						vals[at+2] = nan // a later one does not hide the first
					}
				}
				for _, to := range dequantTargets {
					out := make([]byte, n*to.Size())
					got := encode(to, vals, out)
					if want := roundedOnce(to, vals); !bytes.Equal(out, want) {
						t.Errorf("%s, %d values, %g at %d: bytes differ", to, n, bad, at)
					}
					want := at
					if bad == 1e30 && to != safetensors.F16 { // finite in bf16 and f32
						want = -1
						if at >= 0 && at+2 < n {
							want = at + 2
						}
					}
					if got != want {
						t.Errorf("%s, %d values, %g at %d: first non-finite %d, want %d", to, n, bad, at, got, want)
					}
					wantOver := -1
					if bad == 1e30 && to == safetensors.F16 && at >= 0 {
						wantOver = at
					}
					if i := Encode(to, vals, make([]byte, n*to.Size())); i != wantOver {
						t.Errorf("%s, %d values, %g at %d: Encode's overflow %d, want %d", to, n, bad, at, i, wantOver)
					}
				}
			}
		}
	}
}
