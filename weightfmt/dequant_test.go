package weightfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// roundedOnce is the expected bytes of vals in dtype to: each value
// rounded once from its exact float64 (numfmt's F64 encoders, which round
// to odd first, a path apart from Encode's float32 one).
func roundedOnce(to safetensors.DType, vals []float32) []byte {
	var out []byte
	for _, v := range vals {
		switch to {
		case safetensors.BF16:
			out = binary.LittleEndian.AppendUint16(out, numfmt.F64ToBF16(float64(v)))
		case safetensors.F16:
			out = binary.LittleEndian.AppendUint16(out, numfmt.F64ToF16(float64(v)))
		default:
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
	}
	return out
}

// dequantFormats are a weight of every quantised format (FP8 blocks with
// ragged edges and with small blocks, so that pieces span several).
func dequantFormats(rng *rand.Rand) []struct {
	m                  Matrix
	raw, scale, global []byte
} {
	var out []struct {
		m                  Matrix
		raw, scale, global []byte
	}
	for _, m := range []Matrix{
		{FP8Block(128, 128, false), 300, 200}, {FP8Block(4, 8, false), 18, 20},
		// more rows than one group of dequantGroupElems values: several
		// groups a call, ragged column blocks
		{FP8Block(128, 128, false), 300, 2100}, {FP8Channel(f32), 2000, 200}, {Int4Pack(32, bf16), 1500, 192},
		{FP8Channel(bf16), 9, 40}, {FP8Tensor(f32), 9, 40}, {FP8Tensor(bf16), 5, 3},
		{Int4Pack(32, bf16), 7, 96}, {Int4Pack(0, safetensors.F16), 5, 40},
		{MXFP4(NamingGptOss, u8, u8), 6, 64}, {NVFP4ModelOpt(), 7, 48}, {NVFP4CT(), 3, 32},
	} {
		var raw, scale, global []byte
		if _, ok := m.Format.(fp8Block); ok {
			raw, scale = randomWeight(rng, m.Format, m.Rows*m.Cols), randomScales(rng, m)
		} else {
			raw, scale, global = randomPacked(rng, m)
		}
		out = append(out, struct {
			m                  Matrix
			raw, scale, global []byte
		}{m, raw, scale, global})
	}
	return out
}

// DequantRows gives, for every format and target dtype, the format's
// exact float32 dequantisation of the whole weight rounded once to nearest
// even (F32: as it is), whatever pieces of whole scale blocks of rows it is
// asked for: one call, one scale block of rows at a time, or uneven runs;
// the FP8 formats' table path and the general path (Reference) alike.
func TestDequantRowsRoundsTheWholeOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 6))
	for _, w := range dequantFormats(rng) {
		m := w.m
		vals := make([]float32, m.Rows*m.Cols)
		if err := DequantiseWeight(m.Format, w.raw, int(m.Rows), int(m.Cols), w.scale, w.global, vals); err != nil {
			t.Fatalf("%s: %v", m.Format, err)
		}
		for _, to := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
			want := roundedOnce(to, vals)
			unit := m.RowUnit()
			for i, step := range []int64{m.Rows, unit, 2 * unit, 3 * unit, m.Rows, unit} {
				d := Dequantiser{Reference: i >= 4} // the FP8 formats' fast path, and the general one
				var got []byte
				for r := int64(0); r < m.Rows; r += step {
					n := min(step, m.Rows-r)
					out := make([]byte, n*m.Cols*int64(to.Size()))
					err := d.DequantRows(m, MemRows{w.raw, w.scale, w.global}, r, n, to, out)
					var over *OverflowError
					if errors.As(err, &over) && to == safetensors.F16 {
						continue // random FP8 values may pass 65504: TestDequantRowsOverflow
					}
					if err != nil {
						t.Fatalf("%s to %s, rows %d+%d: %v", m.Format, to, r, n, err)
					}
					got = append(got, out...)
				}
				if to == safetensors.F16 && len(got) != len(want) {
					continue
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s %dx%d to %s in steps of %d rows: not the one rounding of the whole", m.Format, m.Rows, m.Cols, to, step)
				}
			}
		}
	}
}

// A piece must start on a scale block of rows, and every size is checked.
func TestDequantRowsRefusals(t *testing.T) {
	m := Matrix{Format: FP8Block(4, 8, false), Rows: 12, Cols: 8}
	src := MemRows{Raw: make([]byte, 96), Scale: make([]byte, 12)}
	var d Dequantiser
	for _, tc := range []struct {
		r0, n int64
		to    safetensors.DType
		out   int
		want  string
	}{
		{2, 4, safetensors.BF16, 64, "not on a 4-row scale block"},
		{0, 13, safetensors.BF16, 208, "rows 0..13 of a 12x8"},
		{-4, 4, safetensors.BF16, 64, "rows -4..0"},
		{0, 4, safetensors.BF16, 63, "63 output bytes"},
		{0, 4, safetensors.I32, 128, "want BF16, F16 or F32"},
	} {
		err := d.DequantRows(m, src, tc.r0, tc.n, tc.to, make([]byte, tc.out))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rows %d+%d to %s: %v, want %q", tc.r0, tc.n, tc.to, err, tc.want)
		}
	}
}

// Encode rounds to nearest, ties to even: a tie goes to the even
// neighbour, where truncating would always go down; a finite value past
// F16's range is reported, an infinity or NaN is not.
func TestEncodeRoundsOnceToNearestEven(t *testing.T) {
	one := float32(1)
	tieDown := one + 0x1p-8 // half-way between 1 and 1+2^-7: even is 1
	tieUp := one + 3*0x1p-8 // half-way between 1+2^-7 and 1+2^-6: even is 1+2^-6
	above := one + 0x1.8p-8 // past the half-way: up, where truncation stays at 1
	out := make([]byte, 8)
	if i := Encode(safetensors.BF16, []float32{tieDown, tieUp, above, -above}, out); i >= 0 {
		t.Fatalf("overflow at %d", i)
	}
	want := []uint16{0x3f80, 0x3f82, 0x3f81, 0xbf81}
	for i, w := range want {
		if got := binary.LittleEndian.Uint16(out[2*i:]); got != w {
			t.Errorf("bf16 %d: %#04x, want %#04x", i, got, w)
		}
	}
	inf := float32(math.Inf(1))
	if i := Encode(safetensors.F16, []float32{1, float32(math.NaN()), inf, 70000}, out); i != 3 {
		t.Errorf("f16 overflow at %d, want 3 (not the NaN or the infinity)", i)
	}
	if i := Encode(safetensors.BF16, []float32{math.MaxFloat32}, out); i != 0 {
		t.Errorf("bf16 of the largest float32 (which rounds to infinity): overflow at %d, want 0", i)
	}
}

// A value that overflows the target dtype is an error naming its place.
func TestDequantRowsOverflow(t *testing.T) {
	m := Matrix{Format: FP8Tensor(f32), Rows: 2, Cols: 3}
	raw := []byte{0x38, 0x38, 0x38, 0x38, 0x7e, 0x38} // 1s, and 448 at row 1, column 1
	src := MemRows{Raw: raw, Scale: f32s(200)}
	var d Dequantiser
	err := d.DequantRows(m, src, 0, 2, safetensors.F16, make([]byte, 12))
	var over *OverflowError
	if !errors.As(err, &over) || over.Row != 1 || over.Col != 1 || over.Value != 89600 {
		t.Fatalf("%v, want an overflow of 89600 at row 1, column 1", err)
	}
	if err := d.DequantRows(m, src, 0, 2, safetensors.BF16, make([]byte, 12)); err != nil {
		t.Fatalf("bf16 holds it: %v", err)
	}
}

// The Dequantiser's float32 buffer stays at one group of rows however many
// rows a call asks for (what bounds convert's and validate's memory), and
// one scale block of rows where a block is larger.
func TestDequantRowsBoundedBuffers(t *testing.T) {
	for _, tc := range []struct {
		m    Matrix
		most int
	}{
		{Matrix{Format: FP8Channel(bf16), Rows: 20000, Cols: 64}, dequantGroupElems},
		{Matrix{Format: FP8Block(128, 128, false), Rows: 256, Cols: 4096}, 128 * 4096},
	} {
		rng := rand.New(rand.NewPCG(29, 7))
		raw, scale := randomWeight(rng, tc.m.Format, tc.m.Rows*tc.m.Cols), make([]byte, tc.m.ScaleBytes())
		var d Dequantiser
		out := make([]byte, tc.m.Rows*tc.m.Cols*2)
		if err := d.DequantRows(tc.m, MemRows{Raw: raw, Scale: scale}, 0, tc.m.Rows, safetensors.BF16, out); err != nil {
			t.Fatal(err)
		}
		if cap(d.vals) > tc.most || int64(cap(d.raw)) > int64(tc.most) {
			t.Errorf("%s %dx%d: buffers of %d values and %d bytes, want at most %d", tc.m.Format, tc.m.Rows, tc.m.Cols, cap(d.vals), cap(d.raw), tc.most)
		}
	}
}

func TestRoundingOf(t *testing.T) {
	for d, want := range map[safetensors.DType]string{safetensors.BF16: RoundNearestEven, safetensors.F16: RoundNearestEven, safetensors.F32: RoundExact} {
		if got := RoundingOf(d); got != want || !Dequantisable(d) {
			t.Errorf("%s: %s %v", d, got, Dequantisable(d))
		}
	}
	if Dequantisable(safetensors.F8E4M3) || Dequantisable(safetensors.F64) {
		t.Error("only bf16, f16 and f32 are dequantisation targets")
	}
}
