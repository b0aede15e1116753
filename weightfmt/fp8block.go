package weightfmt

import (
	"fmt"
	"math"
	"strings"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// QuantFP8Block is the quantization of FP8 block-scaled weights.
const QuantFP8Block = "fp8_block_128x128"

// FP8DefaultBlock is the edge of DeepSeek's square quantisation blocks
// (quantization_config.weight_block_size [128, 128]), which Qwen3's,
// GLM's and MiniMax's FP8 releases copy.
const FP8DefaultBlock = 128

// fp8Block is DeepSeek's FP8 format: F8_E4M3 weights, each block of
// block[0] rows by block[1] columns multiplied by one F32 entry of
// weight_scale_inv (a multiplier, despite its name). ue8m0: the entries
// are powers of two (quantization_config.scale_fmt "ue8m0", DeepSeek-V3.1
// on): still stored as F32, but a product with rsf would leave that grid.
//
// DeepSeek-V4's own repo layout (NamingDeepSeek) names the grid x.scale
// beside x.weight and stores it F8_E8M0 (or as its U8 bytes): the same
// blocks and the same product, each entry 2^(e-127).
type fp8Block struct {
	block  [2]int64
	ue8m0  bool
	naming string            // "" (x.weight_scale_inv) or NamingDeepSeek (x.scale)
	scale  safetensors.DType // "" : F32
}

// FP8Block is the FP8 block-scaled format with blocks of bo rows by bi
// columns (both positive); ue8m0 says the scales are powers of two.
func FP8Block(bo, bi int64, ue8m0 bool) Format {
	return fp8Block{block: [2]int64{bo, bi}, ue8m0: ue8m0}
}

// FP8MaxBlock is the largest FP8 block edge read.
const FP8MaxBlock = 1 << 16

func init() {
	register(QuantFP8Block, func(s Spec) (Format, error) {
		b := []int64{FP8DefaultBlock, FP8DefaultBlock}
		if s.Block != nil {
			b = s.Block
		}
		if len(b) != 2 || b[0] <= 0 || b[1] <= 0 {
			return nil, fmt.Errorf("FP8 weight_block_size %v: want two positive integers [rows, cols]", s.Block)
		}
		if b[0] > FP8MaxBlock || b[1] > FP8MaxBlock {
			// producers write 32 to 128; a bound keeps every grid
			// computation (ceil of n/b) far from overflowing
			return nil, fmt.Errorf("FP8 weight_block_size %v: a block edge is at most %d", s.Block, FP8MaxBlock)
		}
		f := fp8Block{block: [2]int64{b[0], b[1]}, ue8m0: s.ScaleFmt == "ue8m0"}
		switch s.Naming {
		case "":
		case NamingDeepSeek:
			f.naming = NamingDeepSeek
		default:
			return nil, fmt.Errorf("FP8 weights named as %q: want %q or DeepSeek's own (%q)", s.Naming, "", NamingDeepSeek)
		}
		switch sd := s.ScaleDType; {
		case sd == "" || sd == safetensors.F32:
		case f.naming == NamingDeepSeek && (sd == safetensors.F8E8M0 || sd == safetensors.U8):
			f.scale, f.ue8m0 = sd, true // E8M0 entries are powers of two whatever scale_fmt says
		default:
			return nil, fmt.Errorf("FP8 128x128 scale dtype %s: want F32 (weight_scale_inv), or F8_E8M0 or U8 under DeepSeek's x.scale", sd)
		}
		return f, nil
	})
}

// FP8BlockDeepSeek is the FP8 block-scaled format in DeepSeek-V4's own
// names: x.weight F8_E4M3, x.scale of dtype scale (F8_E8M0, U8 or F32).
func FP8BlockDeepSeek(bo, bi int64, scale safetensors.DType) Format {
	f, err := New(Spec{Quantization: QuantFP8Block, Block: []int64{bo, bi}, ScaleFmt: "ue8m0", Naming: NamingDeepSeek, ScaleDType: scale})
	if err != nil {
		panic(err)
	}
	return f
}

func (f fp8Block) scaleDType() safetensors.DType {
	if f.scale == "" {
		return safetensors.F32
	}
	return f.scale
}

// Naming is whose tensor names the weights carry (Named): "" for
// transformers' weight_scale_inv, NamingDeepSeek for x.scale.
func (f fp8Block) Naming() string { return f.naming }

// TensorsOf names the weight's tensors (Renamed): x.weight_scale_inv, or
// DeepSeek's x.scale (a stack's: "gate_up_proj_scale").
func (f fp8Block) TensorsOf(weight string) Tensors {
	if f.naming == NamingDeepSeek {
		if base, ok := strings.CutSuffix(weight, ".weight"); ok {
			return Tensors{Weight: weight, Scale: base + ".scale"}
		}
		return Tensors{Weight: weight, Scale: weight + "_scale"}
	}
	return Tensors{Weight: weight, Scale: weight + "_scale_inv"}
}

func (f fp8Block) Quantization() string          { return QuantFP8Block }
func (f fp8Block) DType() safetensors.DType      { return safetensors.F8E4M3 }
func (f fp8Block) Packing() (elems, bytes int64) { return 1, 1 }
func (f fp8Block) String() string                { return "FP8" }

func (f fp8Block) Scale() (Scale, bool) {
	if f.naming == NamingDeepSeek {
		return Scale{Suffix: ".scale", DType: f.scaleDType(), Block: f.block}, true
	}
	return Scale{Suffix: "_scale_inv", DType: safetensors.F32, Block: f.block}, true
}

// Fold multiplies the F32 scales, which moves each by at most half a
// float32 ulp and leaves the FP8 bytes alone; UE8M0 scales cannot take a
// factor that is not a power of two and stay powers of two.
func (f fp8Block) Fold() FoldRule {
	if f.ue8m0 || f.scaleDType() != safetensors.F32 {
		return FoldRule{refusal: "the FP8 scales are UE8M0 (powers of two) and cannot absorb %s exactly"}
	}
	return FoldRule{Into: FoldScales, DType: safetensors.F32, ByDefault: true}
}

func (f fp8Block) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	return dequantE4M3(f, raw, rows, cols, scale, dst)
}

// exactValues: the E4M3 value times its block's scale (exactDequantiser).
func (f fp8Block) exactValues(raw []byte, rows, cols int, scale, _ []byte) (func(int) (float64, bool), error) {
	return exactE4M3(f, raw, rows, cols, scale)
}

// e4m3Grid is the weight's scale grid decoded to float32 and the block it
// scales (e4m3Scaled).
func (f fp8Block) e4m3Grid(rows, cols int, scale []byte) ([]float32, int, int, error) {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	sr, sc := m.ScaleShape()
	sd := f.scaleDType()
	if rows < 0 || cols < 0 || int64(len(scale)) != sr*sc*int64(sd.Size()) {
		return nil, 0, 0, fmt.Errorf("fp8 dequant: %d scale bytes for a %dx%d weight, want %dx%d %s", len(scale), rows, cols, sr, sc, sd)
	}
	s := make([]float32, sr*sc)
	if sd == safetensors.U8 {
		sd = safetensors.F8E8M0 // the same bytes
	}
	if err := Decode(sd, scale, s); err != nil {
		return nil, 0, 0, err
	}
	return s, int(f.block[0]), int(f.block[1]), nil
}

// DequantE4M3 decodes an F8_E4M3 rows x cols weight whose element (r,c) is
// scaled by scale[r/bo][c/bi] (a [ceil(rows/bo), ceil(cols/bi)] grid),
// writing rows*cols float32 values to dst: fp8 value times scale, rounded
// once to float32, as weight.float() * scale does. It builds one scaled copy
// of the 256-entry table per block so each element costs a single lookup.
func DequantE4M3(src []byte, rows, cols int, scale []float32, bo, bi int, dst []float32) error {
	if bo <= 0 || bi <= 0 {
		return fmt.Errorf("fp8 block size %dx%d", bo, bi)
	}
	// rows*cols must not wrap: a hostile contract could otherwise pair a
	// huge shape with a buffer whose length equals the wrapped product.
	if rows < 0 || cols < 0 || (cols > 0 && rows > math.MaxInt/cols) || len(src) != rows*cols || len(dst) != rows*cols {
		return fmt.Errorf("fp8 dequant: %d bytes, %d outputs for a %dx%d weight", len(src), len(dst), rows, cols)
	}
	sr, sc := rows/bo, cols/bi // ceil, without the overflow of (rows+bo-1)
	if rows%bo != 0 {
		sr++
	}
	if cols%bi != 0 {
		sc++
	}
	if len(scale) != sr*sc {
		return fmt.Errorf("fp8 dequant: %d scales for a %dx%d weight, want %dx%d", len(scale), rows, cols, sr, sc)
	}
	var tab [256]float32
	if useAVX2 && bi%8 == 0 && cols%bi == 0 {
		// Whole blocks across every row: the kernel runs row by row,
		// block after block, so the band is written in order (block
		// column by block column it is written 128 rows apart, which
		// costs more than the decode).
		var small [2 * 64]uint32
		nan := small[:]
		if 2*sc > len(nan) {
			nan = make([]uint32, 2*sc)
		}
		for br := range sr {
			for bc := range sc {
				e4m3Times(&tab, scale[br*sc+bc])
				nan[2*bc], nan[2*bc+1] = math.Float32bits(tab[0x7F]), math.Float32bits(tab[0xFF])
			}
			for r := br * bo; r < min((br+1)*bo, rows); r++ {
				for bc := range sc {
					c0 := r*cols + bc*bi
					e4m3Codes(&src[c0], &dst[c0], bi, scale[br*sc+bc], nan[2*bc], nan[2*bc+1])
				}
			}
		}
		return nil
	}
	for br := range sr {
		r0, r1 := br*bo, min((br+1)*bo, rows)
		for bc := range sc {
			c0, c1 := bc*bi, min((bc+1)*bi, cols)
			e4m3Times(&tab, scale[br*sc+bc])
			for r := r0; r < r1; r++ {
				row := src[r*cols+c0 : r*cols+c1]
				out := dst[r*cols+c0 : r*cols+c1]
				out = out[:len(row)] // lets the compiler drop the bounds check
				for i, b := range row {
					out[i] = tab[b]
				}
			}
		}
	}
	return nil
}

// e4m3Times fills tab with every E4M3 code's value times s, each rounded
// once to float32: a block's decode is then one lookup an element.
func e4m3Times(tab *[256]float32, s float32) {
	for i := range tab {
		tab[i] = numfmt.E4M3ToF32(byte(i)) * s
	}
}

// RequantRule is the E4M3 rule (requant.go): scale_inv = amax / 448 per
// block, F32, a power of two (rounded up) where the scales are UE8M0.
func (f fp8Block) RequantRule() RequantRule { return e4m3Rule(f.ue8m0) }

func (f fp8Block) encodeRow(vals, scales []float32, bc int, dst []byte) {
	encodeE4M3Row(vals, scales, bc, dst)
}

// e4m3Rule is how a plain weight becomes E4M3 codes under its scales:
// scale = amax / 448, codes clamped to +-448.
func e4m3Rule(pow2 bool) RequantRule {
	return RequantRule{Name: "absmax-e4m3", Divisor: numfmt.E4M3Max, Lo: -numfmt.E4M3Max, Hi: numfmt.E4M3Max,
		MinScale: MinRequantScale, PowerOfTwo: pow2, Rounding: RoundingNearestEven}
}

// encodeE4M3Row stores each value over its scale as the nearest E4M3 code
// (ties to even, saturating at +-448, which clamping first gives too).
func encodeE4M3Row(vals, scales []float32, bc int, dst []byte) {
	for c, v := range vals {
		dst[c] = numfmt.F32ToE4M3(v / scales[c/bc])
	}
}
