package kernels_test

import (
	"context"
	"fmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/moe/moetest"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
)

// gemmCase is one grouped-GEMM scenario: T tokens, E experts, K slots a
// token, weights of dtype w in the separate or fused (gate_up / up_gate)
// layout. allOn >= 0 routes every slot to that expert.
type gemmCase struct {
	name          string
	tok, e, k     int
	h, inter      int
	block         int
	w             kernels.MatDType
	fused, upGate bool
	allOn         int
}

// Tolerances, relative L2 against moe.GroupedGEMM fed the same
// dequantised weights (and, in bf16 mode, the same bf16-rounded x):
//   - f32 activations: both sides are f32-accumulated dot products of the
//     same numbers in different orders; their difference is a few ulps of
//     the row sums: <= 1e-5.
//   - bf16 activations: the kernel rounds the intermediate h to bf16 before
//     the down GEMM (relative error <= 2^-9 an element, ~1e-3 in L2 for
//     random signs; the CPU twin keeps f32) and, on tensor cores, applies FP8
//     scales per 128-wide K block to exact products: <= 1e-2.
const (
	tolF32  = 1e-5
	tolBF16 = 1e-2
)

var gemmCases = []gemmCase{
	{name: "T1 bf16", tok: 1, e: 8, k: 2, h: 160, inter: 96, block: 16, w: kernels.MatBF16, allOn: -1},
	{name: "T37 264 experts fp8", tok: 37, e: 264, k: 9, h: 160, inter: 96, block: 16, w: kernels.MatFP8, allOn: -1},
	{name: "sparse fp8 gate_up", tok: 5, e: 64, k: 2, h: 96, inter: 160, block: 32, w: kernels.MatFP8, fused: true, allOn: -1},
	{name: "one expert bf16 up_gate", tok: 70, e: 8, k: 1, h: 160, inter: 96, block: 64, w: kernels.MatBF16, fused: true, upGate: true, allOn: 3},
	{name: "fp8 up_gate partial blocks", tok: 33, e: 16, k: 4, h: 288, inter: 200, block: 16, w: kernels.MatFP8, fused: true, upGate: true, allOn: -1},
	{name: "f32 weights", tok: 20, e: 4, k: 2, h: 64, inter: 48, block: 16, w: kernels.MatF32, allOn: -1},
	// Many rows per expert: PathAuto takes the 64-row tiles. Runs of 3-5
	// sub-blocks of 16 (tiles of 4 plus a partial one), runs of 6 in blocks
	// of 32, and one run of 38 sub-blocks (the run-start scan goes past 32).
	{name: "long runs fp8", tok: 150, e: 5, k: 2, h: 160, inter: 96, block: 16, w: kernels.MatFP8, allOn: -1},
	{name: "long runs bf16 gate_up block 32", tok: 300, e: 7, k: 2, h: 96, inter: 160, block: 32, w: kernels.MatBF16, fused: true, allOn: -1},
	{name: "one expert 600 rows fp8", tok: 600, e: 4, k: 1, h: 96, inter: 64, block: 16, w: kernels.MatFP8, allOn: 2},
	// A run that takes several 192-row wgmma tiles (38 sub-blocks: 12 + 12 +
	// 12 + 2, so the last tile's second and third 64-row groups are all
	// padding) x several column tiles with tails (I 200: three 96-column
	// gate_up tiles; H 224: two 192-column down tiles).
	{name: "one expert 600 rows bf16", tok: 600, e: 4, k: 1, h: 224, inter: 200, block: 16, w: kernels.MatBF16, allOn: 2},
}

// expertWeights holds one layer's logical per-expert matrices: raw device
// encoding (f32 bits, bf16 or fp8 bytes), scales, and the decoded f32 copy.
type expertWeights struct {
	raw   [3][][]byte    // gate, up, down per expert, device encoding
	scale [3][][]float32 // fp8 block scales per expert
	mats  []*moe.ExpertMats
}

func makeExperts(r *rand.Rand, c gemmCase) *expertWeights {
	ew := &expertWeights{mats: make([]*moe.ExpertMats, c.e)}
	shapes := [3][2]int{{c.inter, c.h}, {c.inter, c.h}, {c.h, c.inter}}
	for e := range c.e {
		var dec [3][]float32
		for m, sh := range shapes {
			rows, cols := sh[0], sh[1]
			std := 1 / math.Sqrt(float64(cols))
			var raw []byte
			var sc []float32
			dec[m] = make([]float32, rows*cols)
			switch c.w {
			case kernels.MatF32:
				v := randn(r, rows*cols, std)
				copy(dec[m], v)
				raw = f32Bytes(v)
			case kernels.MatBF16:
				b := toBF16(randn(r, rows*cols, std))
				copy(dec[m], fromBF16(b))
				raw = u16Bytes(b)
			case kernels.MatFP8:
				raw = randFP8(r, rows*cols)
				sr, scn := scaleDims(rows, cols, 128, 128)
				sc = make([]float32, sr*scn)
				for i := range sc {
					sc[i] = float32((0.5 + r.Float64()) * std / 2)
				}
				dequantFP8(raw, rows, cols, sc, 128, 128, dec[m])
			}
			ew.raw[m] = append(ew.raw[m], raw)
			ew.scale[m] = append(ew.scale[m], sc)
		}
		ew.mats[e] = &moe.ExpertMats{Gate: dec[0], Up: dec[1], Down: dec[2]}
	}
	return ew
}

// bank uploads the weights in the case's layout.
func (ew *expertWeights) bank(t *testing.T, dev *cuda.Device, c gemmCase) *kernels.ExpertBank {
	b := &kernels.ExpertBank{NumExperts: c.e, H: c.h, I: c.inter, DType: c.w, UpFirst: c.upGate}
	cat := func(parts ...[][]byte) kernels.Mat {
		var all []byte
		for e := range c.e {
			for _, p := range parts {
				all = append(all, p[e]...)
			}
		}
		return deviceMat(t, dev, c.w, all)
	}
	catScale := func(parts ...[][]float32) *cuda.Buffer[float32] {
		if c.w != kernels.MatFP8 {
			return nil
		}
		var all []float32
		for e := range c.e {
			for _, p := range parts {
				all = append(all, p[e]...)
			}
		}
		return toDevice(t, dev, all)
	}
	switch {
	case c.fused && c.upGate:
		b.GateUp, b.GateUpScale = cat(ew.raw[1], ew.raw[0]), catScale(ew.scale[1], ew.scale[0])
	case c.fused:
		b.GateUp, b.GateUpScale = cat(ew.raw[0], ew.raw[1]), catScale(ew.scale[0], ew.scale[1])
	default:
		b.Gate, b.GateScale = cat(ew.raw[0]), catScale(ew.scale[0])
		b.Up, b.UpScale = cat(ew.raw[1]), catScale(ew.scale[1])
	}
	b.Down, b.DownScale = cat(ew.raw[2]), catScale(ew.scale[2])
	return b
}

func deviceMat(t *testing.T, dev *cuda.Device, d kernels.MatDType, raw []byte) kernels.Mat {
	switch d {
	case kernels.MatF32:
		v := make([]float32, len(raw)/4)
		for i := range v {
			v[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		return kernels.F32Mat(toDevice(t, dev, v))
	case kernels.MatBF16:
		v := make([]uint16, len(raw)/2)
		for i := range v {
			v[i] = uint16(raw[2*i]) | uint16(raw[2*i+1])<<8
		}
		return kernels.BF16Mat(toDevice(t, dev, v))
	}
	return kernels.FP8Mat(toDevice(t, dev, raw))
}

func f32Bytes(v []float32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, f := range v {
		u := math.Float32bits(f)
		out = append(out, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	}
	return out
}

func u16Bytes(v []uint16) []byte {
	out := make([]byte, 0, 2*len(v))
	for _, u := range v {
		out = append(out, byte(u), byte(u>>8))
	}
	return out
}

// routeIDs draws K distinct experts per token (or all on one expert).
func routeIDs(r *rand.Rand, c gemmCase) []int32 {
	return moetest.RouteIDs(r, c.tok, c.k, c.e, c.allOn)
}

// uploadSorted puts the CPU alignment on the device (sortedWithTail: a
// kernel that ignored the total would overwrite slot 0's row).
func uploadSorted(t *testing.T, dev *cuda.Device, al *moe.Alignment, e int) *kernels.Sorted {
	t.Helper()
	s, err := sortedWithTail(dev, al, e)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Free)
	return s
}

// gemmMode is an activation dtype and kernel path GroupedGEMM is run in,
// with the tolerance it is held to.
type gemmMode struct {
	name string
	opt  kernels.GEMMOptions
	tol  float64
}

// gemmInputs uploads x in the mode's activation dtype with an intermediate
// of n elements: f32 x and a poisoned f32 intermediate, or x rounded to bf16
// (xin is then the rounded copy the CPU twin takes) and a bf16 intermediate
// of fill.
func gemmInputs(t *testing.T, dev *cuda.Device, x []float32, act kernels.MatDType, n int, fill uint16) (xin []float32, xm, inter kernels.Mat) {
	t.Helper()
	if act != kernels.MatBF16 {
		return x, kernels.F32Mat(toDevice(t, dev, x)), kernels.F32Mat(poisoned(t, dev, n))
	}
	xb := toBF16(x)
	bits := make([]uint16, n)
	for i := range bits {
		bits[i] = fill
	}
	return fromBF16(xb), kernels.BF16Mat(toDevice(t, dev, xb)), kernels.BF16Mat(toDevice(t, dev, bits))
}

// checkTwin holds the kernel's output out to moe.GroupedGEMM of the same
// x (xin), routing and experts within relative L2 tol, and returns the
// twin's answer.
func checkTwin(t *testing.T, out *cuda.Buffer[float32], xin []float32, c gemmCase, al *moe.Alignment, load moe.ExpertLoader, tol float64) []float32 {
	t.Helper()
	got := fromDevice(t, out)
	want, err := moe.GroupedGEMM(context.Background(), xin, c.tok, c.h, c.inter, c.k, al, load, moe.GEMMOptions{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	e := relL2(got, want)
	t.Logf("rel_l2 %.3g (tolerance %g)", e, tol)
	if !(e <= tol) {
		t.Fatalf("rel_l2 %.3g over %g", e, tol)
	}
	return want
}

func TestGroupedGEMM(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(7, 8))
	modes := []gemmMode{
		{"f32", kernels.GEMMOptions{Act: kernels.MatF32}, tolF32},
		{"bf16 simt", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathSIMT}, tolBF16},
		{"bf16 mma", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMA}, tolBF16},
		{"bf16 auto", kernels.GEMMOptions{Act: kernels.MatBF16}, tolBF16},
		{"bf16 tall", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMATall}, tolBF16},
		{"bf16 wgmma", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathWGMMA}, tolBF16},
		{"bf16 mma3", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMA3}, tolBF16},
	}
	hopper := dev.Major == 9 && dev.Minor == 0
	for _, c := range gemmCases {
		ew, bank, _, al, sorted := routedBank(t, r, dev, c)
		load := func(_ context.Context, e int) (*moe.ExpertMats, error) { return ew.mats[e], nil }
		x := randn(r, c.tok*c.h, 1)
		numel := c.tok * c.k
		for _, m := range modes {
			t.Run(fmt.Sprintf("%s/%s", c.name, m.name), func(t *testing.T) {
				xin, xm, inter := gemmInputs(t, dev, x, m.opt.Act, numel*c.inter, 0x7fc0)
				out := poisoned(t, dev, numel*c.h)
				err := kernels.GroupedGEMM(dev, 0, bank, sorted, xm, c.tok, c.k, inter, out, m.opt)
				if c.w == kernels.MatF32 && (m.opt.Path == kernels.PathMMA || m.opt.Path == kernels.PathMMATall) {
					// f32 weights have no tensor-core kernel: asking for one is an error.
					if err == nil {
						t.Fatal("tensor-core path accepted f32 weights")
					}
					return
				}
				if m.opt.Path == kernels.PathWGMMA && (!hopper || c.w != kernels.MatBF16 || c.h%8 != 0 || c.inter%8 != 0) {
					// sm_90a only, bf16 weights, 16-byte row starts.
					if err == nil {
						t.Fatalf("wgmma path accepted %v weights, H %d, I %d on compute capability %d.%d", c.w, c.h, c.inter, dev.Major, dev.Minor)
					}
					return
				}
				if m.opt.Path == kernels.PathMMA3 && (c.w != kernels.MatBF16 || c.h%8 != 0 || c.inter%8 != 0) {
					// bf16 weights only, 16-byte row starts.
					if err == nil {
						t.Fatalf("mma3 path accepted %v weights, H %d, I %d", c.w, c.h, c.inter)
					}
					return
				}
				if vec := vecElems(c.w); m.opt.Path == kernels.PathMMATall && (c.h%vec != 0 || c.inter%vec != 0) {
					// 16-byte loads need row starts on 16 bytes.
					if err == nil {
						t.Fatalf("tall path accepted H %d, I %d with %v weights", c.h, c.inter, c.w)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				checkTwin(t, out, xin, c, al, load, m.tol)
			})
		}
	}
}

// TestGroupedGEMMMMA3Exact checks that the pipelined mma3 kernels compute
// exactly what mma2 computes (same tile, same k16 products in the same
// order): every word of the bf16 intermediate and the f32 output equal,
// including the poison of rows neither kernel writes. The shapes take more
// K steps of 64 than the ring has stages (the ring wraps), K and N tails,
// 264 experts of mostly one-row blocks, fused and separate gate/up, block
// sizes 16 and 32. Both stages of mma3 read mma2's intermediate, so a stage
// 1 difference cannot hide a stage 2 one.
func TestGroupedGEMMMMA3Exact(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(31, 32))
	cases := append([]gemmCase{
		{name: "264 experts", tok: 37, e: 264, k: 9, h: 1032, inter: 712, block: 16, w: kernels.MatBF16, allOn: -1},
		{name: "fused gate_up block 32 tails", tok: 90, e: 8, k: 3, h: 584, inter: 1096, block: 32, w: kernels.MatBF16, fused: true, allOn: -1},
		{name: "up_gate one expert", tok: 50, e: 4, k: 1, h: 264, inter: 456, block: 16, w: kernels.MatBF16, fused: true, upGate: true, allOn: 1},
	}, gemmCases...)
	mma2 := kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMAVec}
	mma3 := kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMA3}
	ran := 0
	for _, c := range cases {
		if c.w != kernels.MatBF16 || c.h%8 != 0 || c.inter%8 != 0 {
			continue
		}
		ran++
		t.Run(c.name, func(t *testing.T) {
			_, bank, _, _, sorted := routedBank(t, r, dev, c)
			numel := c.tok * c.k
			xm := kernels.BF16Mat(toDevice(t, dev, toBF16(randn(r, c.tok*c.h, 1))))
			nan := make([]uint16, numel*c.inter)
			for i := range nan {
				nan[i] = 0x7fc1
			}
			var inter [2]*cuda.Buffer[uint16]
			var out [2]*cuda.Buffer[float32]
			for i, opt := range []kernels.GEMMOptions{mma2, mma3} {
				inter[i] = toDevice(t, dev, nan)
				out[i] = poisoned(t, dev, numel*c.h)
				if err := kernels.MoEGateUp(dev, 0, bank, sorted, xm, c.tok, c.k, kernels.BF16Mat(inter[i]), opt); err != nil {
					t.Fatal(err)
				}
				if err := kernels.MoEDown(dev, 0, bank, sorted, kernels.BF16Mat(inter[0]), out[i], opt); err != nil {
					t.Fatal(err)
				}
			}
			ib := [2][]uint16{fromDevice(t, inter[0]), fromDevice(t, inter[1])}
			ob := [2][]float32{fromDevice(t, out[0]), fromDevice(t, out[1])}
			diff, written := 0, 0
			for i := range ib[0] {
				if ib[0][i] != ib[1][i] {
					diff++
				}
				if ib[0][i] != 0x7fc1 {
					written++
				}
			}
			if diff != 0 || written == 0 {
				t.Fatalf("intermediate: %d of %d words differ from mma2 (%d written)", diff, len(ib[0]), written)
			}
			diff = 0
			for i := range ob[0] {
				if math.Float32bits(ob[0][i]) != math.Float32bits(ob[1][i]) {
					diff++
				}
			}
			if diff != 0 {
				t.Fatalf("output: %d of %d words differ from mma2", diff, len(ob[0]))
			}
			t.Logf("bit-identical to mma2: %d intermediate and %d output words", len(ib[0]), len(ob[0]))
		})
	}
	if ran < 6 {
		t.Fatalf("only %d cases ran", ran)
	}
}

func TestGroupedGEMMRejects(t *testing.T) {
	// NewSorted checks its arrays before touching the device.
	if _, err := kernels.NewSorted(nil, make([]int32, 32), make([]int32, 2), 32, 8, 4); err == nil {
		t.Fatal("NewSorted accepted block size 8")
	}
	if _, err := kernels.NewSorted(nil, make([]int32, 32), make([]int32, 2), 48, 16, 4); err == nil {
		t.Fatal("NewSorted accepted a total past the sorted ids")
	}
	if _, err := kernels.NewSorted(nil, make([]int32, 32), make([]int32, 1), 32, 16, 4); err == nil {
		t.Fatal("NewSorted accepted too few expert ids")
	}
	m := kernels.Mat{DType: kernels.MatBF16, Ptr: 256, Len: 1 << 20}
	bank := &kernels.ExpertBank{NumExperts: 2, H: 16, I: 16, DType: kernels.MatBF16, Gate: m, Up: m, Down: m}
	buf := &cuda.Buffer[int32]{}
	bad := &kernels.Sorted{SortedIDs: buf, ExpertIDs: buf, Total: buf, BlockSize: 8, Numel: 2}
	if err := kernels.MoEGateUp(nil, 0, bank, bad, m, 1, 2, m, kernels.GEMMOptions{Act: kernels.MatBF16}); err == nil {
		t.Fatal("block size 8 accepted")
	}
	fp8 := *bank
	fp8.DType = kernels.MatFP8
	if err := kernels.MoEDown(nil, 0, &fp8, bad, m, nil, kernels.GEMMOptions{Act: kernels.MatBF16}); err == nil {
		t.Fatal("bf16 weights accepted as fp8")
	}
}

// vecElems is the elements of a 16-byte load of weight type w.
func vecElems(w kernels.MatDType) int {
	if w == kernels.MatFP8 {
		return 16
	}
	return 8
}

// TestGroupedGEMMFP8Decode checks both in-kernel e4m3 -> bf16 decoders (the
// hardware conversion on sm_89+, the bit trick that sm_80 runs) on all 256
// codes against dequantFP8 (the e4m3 table): bit-exact, NaN for NaN codes.
func TestGroupedGEMMFP8Decode(t *testing.T) {
	dev := testDevice(t)
	codes := make([]byte, 256)
	for i := range codes {
		codes[i] = byte(i)
	}
	want := make([]float32, 256)
	dequantFP8(codes, 1, 256, []float32{1, 1}, 128, 128, want)
	m, err := kernels.Load(dev, "grouped_gemm")
	if err != nil {
		t.Fatal(err)
	}
	hw := toDevice(t, dev, make([]uint16, 256))
	bits := toDevice(t, dev, make([]uint16, 256))
	if err := m.Launch("gg_fp8_decode_check", kernels.Grid(1), kernels.Block(64), 0, 0, hw, bits); err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		name string
		buf  *cuda.Buffer[uint16]
	}{{"hardware", hw}, {"bit trick", bits}} {
		got := fromDevice(t, d.buf)
		bad := 0
		for i, g := range got {
			w := want[i]
			ok := uint32(g)<<16 == math.Float32bits(w)
			if math.IsNaN(float64(w)) {
				ok = g&0x7f80 == 0x7f80 && g&0x7f != 0
			}
			if !ok {
				if bad < 5 {
					t.Errorf("%s: code %#02x decoded to bf16 %#04x, want %v", d.name, i, g, w)
				}
				bad++
			}
		}
		t.Logf("fp8 decode %s: %d of 256 codes wrong", d.name, bad)
	}
}

// TestGroupedGEMMActivations runs the fallback for experts with biases and
// gated activations other than SwiGLU (act.go: ungated projections, then
// moe_act_*, then moe_down_bias) against moe.GroupedGEMM with the same
// biases and activation. Limits are small enough that the clamps bind on
// these unit-scale projections. Tolerances as TestGroupedGEMM's.
func TestGroupedGEMMActivations(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(17, 18))
	acts := []struct {
		name   string
		act    layout.Activation
		biases bool
	}{
		{"gpt-oss clamped swiglu + biases", layout.Activation{Alpha: 1.702, Limit: 0.6, UpOffset: 1}, true},
		{"deepseek-v4 clamp", layout.Activation{Limit: 0.5}, false},
		{"step-3.7 clamp after silu", layout.Activation{Limit: 0.3, ClampAfter: true}, false},
		{"gemma-4 geglu tanh", layout.GeGLUTanh(), false},
		// Kimi K3's SiTU, with betas narrow enough that both tanh bend on
		// these unit-scale projections (the release's 4 and 25 are close to
		// SwiGLU here; validate's GPU tests run them), and without the up's
		{"kimi-k3 situ", layout.SiTU(0.7, 0.4), false},
		{"situ, no linear beta", layout.SiTU(0.5, 0), false},
		{"swiglu + biases", layout.Activation{}, true},
		// Nemotron-H: no gate weights at all, relu(up)^2 (separate stacks only)
		{"nemotron-h ungated relu2", layout.ReLU2(), false},
	}
	cases := []gemmCase{
		{name: "bf16 separate", tok: 23, e: 8, k: 3, h: 96, inter: 64, block: 16, w: kernels.MatBF16, allOn: -1},
		{name: "fp8 gate_up", tok: 19, e: 16, k: 4, h: 160, inter: 96, block: 16, w: kernels.MatFP8, fused: true, allOn: -1},
		{name: "f32 up_gate", tok: 11, e: 4, k: 2, h: 64, inter: 48, block: 32, w: kernels.MatF32, fused: true, upGate: true, allOn: -1},
	}
	modes := []gemmMode{
		{"f32", kernels.GEMMOptions{Act: kernels.MatF32}, tolF32},
		{"bf16", kernels.GEMMOptions{Act: kernels.MatBF16}, tolBF16},
	}
	for _, c := range cases {
		ew, plainBank, _, al, sorted := routedBank(t, r, dev, c)
		x := randn(r, c.tok*c.h, 1)
		numel := c.tok * c.k
		for _, a := range acts {
			bank := new(*plainBank) // the same weights, with this activation and biases
			bank.Act = a.act
			if a.act.Ungated() {
				if c.fused || c.w == kernels.MatFP8 {
					continue // ungated experts are stacked all_up/all_down, unquantised
				}
				// a bank that still holds gate weights is refused, not half-run
				t.Run(c.name+"/"+a.name+"/gate refused", func(t *testing.T) {
					_, xm, inter := gemmInputs(t, dev, x, kernels.MatF32, numel*c.inter, 0)
					opt := kernels.GEMMOptions{Act: kernels.MatF32, Scratch: poisoned(t, dev, 2*numel*c.inter)}
					err := kernels.GroupedGEMM(dev, 0, bank, sorted, xm, c.tok, c.k, inter, poisoned(t, dev, numel*c.h), opt)
					testkit.ErrorContains(t, err, "ungated", "an ungated bank with gate weights")
				})
				bank.Gate = kernels.Mat{}
			}
			var gb, ub, db []float32
			if a.biases {
				gb, ub, db = randn(r, c.e*c.inter, 0.5), randn(r, c.e*c.inter, 0.5), randn(r, c.e*c.h, 0.5)
				bank.GateBias, bank.UpBias, bank.DownBias = toDevice(t, dev, gb), toDevice(t, dev, ub), toDevice(t, dev, db)
			}
			load := func(_ context.Context, e int) (*moe.ExpertMats, error) {
				m := ew.mats[e]
				out := &moe.ExpertMats{Gate: m.Gate, Up: m.Up, Down: m.Down, Act: a.act}
				if a.act.Ungated() {
					out.Gate = nil
				}
				if a.biases {
					out.GateBias, out.UpBias, out.DownBias = gb[e*c.inter:(e+1)*c.inter], ub[e*c.inter:(e+1)*c.inter], db[e*c.h:(e+1)*c.h]
				}
				return out, nil
			}
			for _, m := range modes {
				t.Run(fmt.Sprintf("%s/%s/%s", c.name, a.name, m.name), func(t *testing.T) {
					xin, xm, inter := gemmInputs(t, dev, x, m.opt.Act, numel*c.inter, 0)
					out := poisoned(t, dev, numel*c.h)
					opt := m.opt
					if err := kernels.GroupedGEMM(dev, 0, bank, sorted, xm, c.tok, c.k, inter, out, opt); err == nil {
						t.Fatal("no scratch accepted")
					}
					opt.Scratch = poisoned(t, dev, 2*numel*c.inter)
					if err := kernels.GroupedGEMM(dev, 0, bank, sorted, xm, c.tok, c.k, inter, out, opt); err != nil {
						t.Fatal(err)
					}
					want := checkTwin(t, out, xin, c, al, load, m.tol)
					// The details matter: the plain SwiGLU bank is far from it,
					// ten times the tolerance at least (GeGLU is 0.14 from
					// SwiGLU on these unit-scale projections, the clamps more).
					if err := kernels.GroupedGEMM(dev, 0, plainBank, sorted, xm, c.tok, c.k, inter, out, opt); err != nil {
						t.Fatal(err)
					}
					if d := relL2(fromDevice(t, out), want); !(d > 10*m.tol) {
						t.Fatalf("without biases and activation rel_l2 is only %.3g", d)
					}
				})
			}
		}
	}
}

// TestAddBiasRows checks the router logit bias kernel against the f32 sum.
func TestAddBiasRows(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(19, 20))
	rows, cols := 37, 129
	m, b := randn(r, rows*cols, 3), randn(r, cols, 1)
	dm := toDevice(t, dev, m)
	if err := kernels.AddBiasRows(dev, 0, dm, toDevice(t, dev, b), rows, cols); err != nil {
		t.Fatal(err)
	}
	got := fromDevice(t, dm)
	for i, v := range got {
		if want := m[i] + b[i%cols]; v != want {
			t.Fatalf("element %d: %v, want %v", i, v, want)
		}
	}
	if err := kernels.AddBiasRows(dev, 0, dm, toDevice(t, dev, b[:5]), rows, cols); err == nil {
		t.Fatal("short bias accepted")
	}
}

// TestScaleByExpert checks Gemma 4's per_expert_scale kernel against its
// CPU twin bit for bit, a fused shared slot (id past the routed experts)
// keeping its weight, and refuses a scale shorter than the experts.
func TestScaleByExpert(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(21, 22))
	tok, k, e := 300, 3, 8
	ids := make([]int32, tok*k)
	for i := range ids {
		ids[i] = int32(r.IntN(e + 2)) // e and e+1: fused shared slots
	}
	w, scale := randn(r, tok*k, 1), randn(r, e, 1)
	dw, di := toDevice(t, dev, w), toDevice(t, dev, ids)
	if err := kernels.ScaleByExpert(dev, 0, dw, di, toDevice(t, dev, scale), tok*k, e); err != nil {
		t.Fatal(err)
	}
	got := fromDevice(t, dw)
	for i, v := range got {
		want := w[i]
		if ids[i] < int32(e) {
			want = w[i] * scale[ids[i]]
		}
		if v != want {
			t.Fatalf("slot %d (expert %d): %v, want %v", i, ids[i], v, want)
		}
	}
	routed := slices.DeleteFunc(slices.Clone(ids), func(id int32) bool { return id >= int32(e) })
	twin := &moe.Routing{T: len(routed), K: 1, IDs: routed, Weights: make([]float32, len(routed))}
	for i := range twin.Weights {
		twin.Weights[i] = 1
	}
	if err := moe.ScaleByExpert(twin, scale); err != nil {
		t.Fatal(err)
	}
	for i, id := range routed {
		if twin.Weights[i] != scale[id] {
			t.Fatalf("CPU twin slot %d: %v, want %v", i, twin.Weights[i], scale[id])
		}
	}
	if err := kernels.ScaleByExpert(dev, 0, dw, di, toDevice(t, dev, scale[:e-1]), tok*k, e); err == nil {
		t.Fatal("short scale accepted")
	}
}

// TestIdentityRows checks LongCat-Flash's zero-compute rows kernel against
// moe.IdentityRows bit for bit over an alignment of E routed and Z
// zero-compute experts: every slot of experts E..E+Z-1 gets its token's
// row, every other row stays as it was (poisoned NaN), and a short output
// is refused.
func TestIdentityRows(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(23, 24))
	tok, k, e, z, h, block := 37, 3, 8, 4, 96, 16
	ids := make([]int32, tok*k)
	for i := range ids {
		ids[i] = int32(r.IntN(e + z))
	}
	al, err := moe.AlignBlockSize(ids, e+z, block)
	if err != nil {
		t.Fatal(err)
	}
	x := randn(r, tok*h, 1)
	sorted := uploadSorted(t, dev, al, e+z)
	out := poisoned(t, dev, tok*k*h)
	if err := kernels.IdentityRows(dev, 0, sorted, toDevice(t, dev, x), out, k, h, e, e+z); err != nil {
		t.Fatal(err)
	}
	got := fromDevice(t, out)
	want := make([]float32, tok*k*h)
	for i := range want {
		want[i] = float32(math.NaN())
	}
	if err := moe.IdentityRows(x, h, k, al, e, e+z, want); err != nil {
		t.Fatal(err)
	}
	n := 0
	for s, id := range ids {
		for j := range h {
			g, w := got[s*h+j], want[s*h+j]
			if id >= int32(e) {
				if g != x[(s/k)*h+j] || g != w {
					t.Fatalf("slot %d (zero-compute expert %d) column %d: %v, twin %v, want x %v", s, id, j, g, w, x[(s/k)*h+j])
				}
				n++
			} else if !math.IsNaN(float64(g)) || !math.IsNaN(float64(w)) {
				t.Fatalf("slot %d (bank expert %d) column %d written: %v, twin %v", s, id, j, g, w)
			}
		}
	}
	if n == 0 {
		t.Fatal("no slot chose a zero-compute expert")
	}
	if err := kernels.IdentityRows(dev, 0, sorted, toDevice(t, dev, x), poisoned(t, dev, tok*k*h-1), k, h, e, e+z); err == nil {
		t.Fatal("short output accepted")
	}
}

// routedBank draws c's experts and routing, uploads the bank and the aligned
// slots, and returns them with the CPU-side alignment the twins take.
func routedBank(t *testing.T, r *rand.Rand, dev *cuda.Device, c gemmCase) (*expertWeights, *kernels.ExpertBank, []int32, *moe.Alignment, *kernels.Sorted) {
	t.Helper()
	ew := makeExperts(r, c)
	bank := ew.bank(t, dev, c)
	ids := routeIDs(r, c)
	al, err := moe.AlignBlockSize(ids, c.e, c.block)
	if err != nil {
		t.Fatal(err)
	}
	return ew, bank, ids, al, uploadSorted(t, dev, al, c.e)
}
