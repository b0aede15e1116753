package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/kernels"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr string
	}{
		{"1,16,128,1024,4096", []int{1, 16, 128, 1024, 4096}, ""},
		{" 128 , 1", []int{128, 1}, ""},
		{"7", []int{7}, ""},
		{"65536", []int{65536}, ""},
		{"", nil, "empty entry"},
		{"1,,2", nil, "empty entry"},
		{"1,x", nil, `"x" is not a whole number`},
		{"1.5", nil, "not a whole number"},
		{"0", nil, "0 outside"},
		{"-3", nil, "-3 outside"},
		{"65537", nil, "65537 outside"},
		{"16,1,16", nil, "16 given twice"},
	}
	for _, tt := range tests {
		got, err := ParseTokens(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseTokens(%q) error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Errorf("ParseTokens(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("ParseTokens(%q) = %v, want %v", tt.in, got, tt.want)
			}
		}
	}
}

func TestParseDType(t *testing.T) {
	for in, want := range map[string]DType{"bf16": BF16, "fp8": FP8} {
		if got, err := ParseDType(in); err != nil || got != want {
			t.Errorf("ParseDType(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "BF16", "fp16", "e4m3"} {
		if _, err := ParseDType(bad); err == nil {
			t.Errorf("ParseDType(%q) accepted", bad)
		}
	}
	if !FP8.Folded() || BF16.Folded() {
		t.Error("rsf is folded for fp8 only")
	}
}

// TestBytes checks the DeepSeek-V3 byte arithmetic against hand-computed values.
func TestBytes(t *testing.T) {
	s := DeepSeekV3()
	if s.BankExperts() != 264 || s.Slots() != 9 {
		t.Fatalf("bank %d experts, %d slots; want 264, 9", s.BankExperts(), s.Slots())
	}
	// bf16: 3*7168*2048*2; fp8: 3*7168*2048 + (2*16*56 + 56*16)*4 scale bytes.
	cases := []struct {
		d            DType
		expert, bank int64
		gateUp, down int64
	}{
		{BF16, 88080384, 264 * 88080384, 58720256, 29360128},
		{FP8, 44050944, 264 * 44050944, 29360128 + 2*16*56*4, 14680064 + 56*16*4},
	}
	for _, c := range cases {
		if got := s.ExpertBytes(c.d); got != c.expert {
			t.Errorf("%s expert bytes %d, want %d", c.d, got, c.expert)
		}
		if got := s.BankBytes(c.d); got != c.bank {
			t.Errorf("%s bank bytes %d, want %d", c.d, got, c.bank)
		}
		if s.GateUpBytes(c.d) != c.gateUp || s.DownBytes(c.d) != c.down {
			t.Errorf("%s gate-up %d down %d, want %d %d", c.d, s.GateUpBytes(c.d), s.DownBytes(c.d), c.gateUp, c.down)
		}
	}
	// The layer at T=1 touching 9 experts: weights + router weight + x + bf16 y.
	layer := int64(9*88080384 + 256*7168*2 + 7168*2*2)
	if got := s.FloorBytes(KLayer, BF16, 1, 9); got != layer {
		t.Errorf("layer floor bytes %d, want %d", got, layer)
	}
	if s.FloorBytes(KLayerGraph, BF16, 1, 9) != layer {
		t.Error("the graph's floor differs from the layer's")
	}
	// Router GEMM at T=128: x, weight, f32 logits.
	if got, want := s.FloorBytes(KRouter, BF16, 128, 0), int64(128*7168*2+256*7168*2+128*256*4); got != want {
		t.Errorf("router floor %d, want %d", got, want)
	}
	// Grouped GEMM = gate-up + down; finalize reads [T*K,H] f32 slots.
	g := s.FloorBytes(KGEMM, FP8, 16, 100.5)
	if g != s.FloorBytes(KGateUp, FP8, 16, 100.5)+s.FloorBytes(KDown, FP8, 16, 100.5) {
		t.Error("grouped GEMM floor is not the sum of its stages")
	}
	if got, want := s.FloorBytes(KFinalize, BF16, 2, 0), int64(2*9*7168*4+2*9*4+2*7168*4); got != want {
		t.Errorf("finalize floor %d, want %d", got, want)
	}
	if s.FloorBytes("nonsense", BF16, 2, 3) != 0 {
		t.Error("unknown kernel has a floor")
	}
	// Fractional touched counts (means over input sets) scale the weights.
	d := s.FloorBytes(KDown, BF16, 1, 8.5) - s.FloorBytes(KDown, BF16, 1, 8)
	if d != 29360128/2 {
		t.Errorf("half an expert of down weights = %d bytes, want %d", d, 29360128/2)
	}
}

func TestFLOPs(t *testing.T) {
	s := DeepSeekV3()
	if got, want := s.FLOPs(KGEMM, 4096), 2*4096.0*9*3*7168*2048; got != want {
		t.Errorf("grouped GEMM flops %g, want %g", got, want)
	}
	if got, want := s.FLOPs(KLayer, 1), 2*7168.0*256+2*9*3*7168*2048; got != want {
		t.Errorf("layer flops %g, want %g", got, want)
	}
	if s.FLOPs(KGate, 100) != 0 || s.FLOPs(KAlign, 100) != 0 {
		t.Error("gate/align counted as arithmetic")
	}
}

func TestFloorArithmetic(t *testing.T) {
	if got := CopyBandwidth(2<<30, 1); math.Abs(got-4.294967296e12) > 1 {
		t.Errorf("CopyBandwidth = %g, want 4.294967296e12 (read + write)", got)
	}
	if CopyBandwidth(1, 0) != 0 || FloorMicros(100, 0) != 0 {
		t.Error("zero time or bandwidth must give 0, not Inf")
	}
	if got := FloorMicros(796422144, 4e12); math.Abs(got-199.105536) > 1e-6 {
		t.Errorf("FloorMicros = %v, want 199.105536", got)
	}
	s := DeepSeekV3()
	r := NewRow(s, BF16, KLayer, 1, 9, 4e12, []float64{400, 300, 1000, 310, 290})
	if r.Micros != 310 || r.P10 != 290 || r.P90 != 1000 || r.Iters != 5 {
		t.Errorf("row times %+v", r)
	}
	if math.Abs(r.FloorUs-199.105536) > 1e-6 || math.Abs(r.FloorFrac-199.105536/310) > 1e-12 {
		t.Errorf("row floor %v us, fraction %v", r.FloorUs, r.FloorFrac)
	}
	if want := s.FLOPs(KLayer, 1) / 310e-6 / 1e12; math.Abs(r.TFLOPs-want) > 1e-9 {
		t.Errorf("row TFLOP/s %v, want %v", r.TFLOPs, want)
	}
	if z := NewRow(s, BF16, KGate, 1, 0, 4e12, nil); z.FloorFrac != 0 || z.TFLOPs != 0 || z.Micros != 0 {
		t.Errorf("empty row %+v", z)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ p, want float64 }{{50, 3}, {0, 1}, {100, 5}, {10, 1}, {90, 5}, {25, 2}} {
		if got := Percentile(xs, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 5 {
		t.Error("Percentile sorted its input")
	}
	if got := Percentile([]float64{4, 1, 3, 2}, 50); got != 2.5 {
		t.Errorf("even median %v, want 2.5", got)
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty percentile")
	}
}

func TestItersFor(t *testing.T) {
	tests := []struct {
		est, budget time.Duration
		most, want  int
	}{
		{10 * time.Microsecond, time.Second, 100, 100},
		{100 * time.Millisecond, time.Second, 100, 10},
		{120 * time.Millisecond, time.Second, 100, 8},
		{2 * time.Second, time.Second, 100, MinIters},
		{2 * time.Second, time.Second, 3, 3},
		{0, time.Second, 40, 40},
	}
	for _, tt := range tests {
		if got := itersFor(tt.est, tt.budget, tt.most); got != tt.want {
			t.Errorf("itersFor(%v, %v, %d) = %d, want %d", tt.est, tt.budget, tt.most, got, tt.want)
		}
	}
}

func TestBankCopies(t *testing.T) {
	const gb = int64(1e9)
	bank := int64(23.25 * 1e9)
	tests := []struct {
		req           int
		free, reserve int64
		want          int
		wantErr       bool
	}{
		{0, 140 * gb, 4 * gb, 2, false}, // H200: 5 fit, capped at 2
		{0, 78 * gb, 4 * gb, 2, false},  // H100 bf16: 3 fit
		{0, 40 * gb, 4 * gb, 1, false},
		{0, 20 * gb, 4 * gb, 0, true},
		{0, 2 * gb, 4 * gb, 0, true},
		{3, 140 * gb, 4 * gb, 3, false},
		{4, 78 * gb, 4 * gb, 0, true},
	}
	for _, tt := range tests {
		got, err := bankCopies(tt.req, tt.free, tt.reserve, bank)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("bankCopies(%d, %d GB free) = %d, %v; want %d (error %v)", tt.req, tt.free/gb, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestWorkingBytes(t *testing.T) {
	s := DeepSeekV3()
	w4096 := workingBytes(s, 4096, 16, 4, false)
	// The [T*K,H] f32 expert output alone is 1.06 GB at 4096 tokens.
	if w4096 < 4096*9*7168*4 || w4096 > 3<<30 {
		t.Errorf("working set at T=4096: %d bytes", w4096)
	}
	if workingBytes(s, 1, 16, 4, false) >= workingBytes(s, 16, 16, 4, false) || workingBytes(s, 16, 16, 1, false) >= workingBytes(s, 16, 16, 4, false) {
		t.Error("working set does not grow with tokens and input sets")
	}
	// w8a8 adds the quantised intermediate (T*K*I codes, the larger stage input) and its scales.
	if d := workingBytes(s, 4096, 16, 4, true) - w4096; d != 4096*9*2048+4*4096*9*16 {
		t.Errorf("w8a8 scratch at T=4096: %d bytes", d)
	}
}

func TestConfigCheck(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Check(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	bad := []func(*Config){
		func(c *Config) { c.Tokens = nil },
		func(c *Config) { c.Tokens = []int{0} },
		func(c *Config) { c.Iters = 0 },
		func(c *Config) { c.BlockSize = 24 },
		func(c *Config) { c.BankCopies = -1 },
		func(c *Config) { c.XSets = 0 },
		func(c *Config) { c.DType = "int4" },
		func(c *Config) { c.Shape.TopK = 200 }, // 4 groups of 32 cannot give 200
		func(c *Config) { c.W8A8 = true },      // bf16 weights
		func(c *Config) { c.W8A8, c.DType, c.Path = true, FP8, kernels.PathMMATall },
	}
	for i, f := range bad {
		c := DefaultConfig()
		f(&c)
		if err := c.Check(); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
	w8 := DefaultConfig()
	w8.W8A8, w8.DType = true, FP8
	if err := w8.Check(); err != nil {
		t.Errorf("w8a8 with fp8 weights: %v", err)
	}
}

func TestGateSpecFolding(t *testing.T) {
	s := DeepSeekV3()
	u, f := s.GateSpec(false), s.GateSpec(true)
	if u.Shared.Weight != 0.4 || s.FinalizeScale(false) != 2.5 {
		t.Errorf("unfolded: shared weight %v, finalize scale %v; want 1/2.5, 2.5", u.Shared.Weight, s.FinalizeScale(false))
	}
	if f.Shared.Weight != 1 || s.FinalizeScale(true) != 1 {
		t.Errorf("folded: shared weight %v, finalize scale %v; want 1, 1", f.Shared.Weight, s.FinalizeScale(true))
	}
	if u.NGroup != 8 || u.TopKGroup != 4 || u.TopK != 8 || u.Shared.Replicas != 8 || !u.NormTopKProb {
		t.Errorf("gate spec %+v", u)
	}
}

func TestRandom(t *testing.T) {
	if numfmt.F32ToBF16(1) != 0x3f80 || numfmt.F32ToBF16(-2) != 0xc000 {
		t.Error("bf16 of 1 or -2")
	}
	// 1 + 2^-8 is a tie between 0x3f80 and 0x3f81: to even; 1 + 3*2^-9 rounds up.
	if got := numfmt.F32ToBF16(1 + 1.0/256); got != 0x3f80 {
		t.Errorf("tie rounded to %#x", got)
	}
	if got := numfmt.F32ToBF16(1 + 3.0/512); got != 0x3f81 {
		t.Errorf("1+3*2^-9 rounded to %#x", got)
	}
	u := make([]uint16, 4096)
	RandBF16(u, 1, 0.035)
	distinct := map[uint16]bool{}
	for _, v := range u {
		f := numfmt.BF16ToF32(v)
		if !(math.Abs(float64(f)) <= 0.035) {
			t.Fatalf("bf16 value %v outside (-0.035, 0.035)", f)
		}
		distinct[v] = true
	}
	if len(distinct) < 500 {
		t.Errorf("only %d distinct bf16 values in 4096", len(distinct))
	}
	b := make([]byte, 1<<16)
	RandFP8(b, 2)
	seen := map[byte]bool{}
	for _, v := range b {
		exp := (v >> 3) & 15
		if exp < 1 || exp > 10 {
			t.Fatalf("fp8 byte %#x has exponent field %d", v, exp)
		}
		seen[v] = true
	}
	if len(seen) != 160 { // 2 signs x 10 exponents x 8 mantissas
		t.Errorf("%d distinct fp8 values, want 160", len(seen))
	}
	f := make([]float32, 1000)
	RandF32(f, 3, 0.05)
	g := make([]float32, 1000)
	RandF32(g, 3, 0.05)
	for i := range f {
		if f[i] != g[i] || math.Abs(float64(f[i])) >= 0.05 {
			t.Fatalf("RandF32 not reproducible or out of range at %d: %v %v", i, f[i], g[i])
		}
	}
}

func TestWriteTable(t *testing.T) {
	s := DeepSeekV3()
	res := &Result{Tool: "moeprep", Device: "cuda:0 test", DType: FP8, Shape: s, Folded: true, BlockSize: 16,
		BankCopies: 2, BankBytes: s.BankBytes(FP8), XSets: 4, CopyBytes: 2 << 30, CopyGBps: 4000, Graph: "captured",
		Rows: []Row{
			NewRow(s, FP8, KGate, 16, 0, 4e12, []float64{6.25, 6.5, 6}),
			NewRow(s, FP8, KLayer, 128, 240, 4e12, []float64{5000, 5100, 4900}),
			{Kernel: KLayerGraph, Tokens: 128, Note: "capture failed"},
		}}
	var buf bytes.Buffer
	if err := WriteTable(&buf, res); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("table has %d lines, want 2 header + 1 column line + 3 rows:\n%s", len(lines), out)
	}
	layerFloor := FloorMicros(s.FloorBytes(KLayer, FP8, 128, 240), 4e12)
	for _, want := range []string{
		"dtype fp8 (rsf folded true)", "experts 256+8", "top-8+1", "groups 8/4", "copy bandwidth 4000 GB/s",
		"graph: captured", "% floor", "6.25", "5000", "240.0", fmtUs(layerFloor),
		"capture failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if want := strings.TrimSpace(strings.Fields(lines[4])[8]); want != fmtPct(layerFloor/5000) {
		t.Errorf("layer row's %% floor column %q, want %q:\n%s", want, fmtPct(layerFloor/5000), out)
	}
	if !strings.HasPrefix(strings.TrimSpace(lines[3]), "16") || !strings.Contains(lines[3], "gate") {
		t.Errorf("gate row %q", lines[3])
	}
}

func fmtPct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func TestFmtUs(t *testing.T) {
	for in, want := range map[float64]string{3.14159: "3.14", 42.26: "42.3", 12345.6: "12346"} {
		if got := fmtUs(in); got != want {
			t.Errorf("fmtUs(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestLCM(t *testing.T) {
	for _, c := range [][3]int{{4, 2, 4}, {4, 3, 12}, {1, 1, 1}, {3, 1, 3}} {
		if got := lcm(c[0], c[1]); got != c[2] {
			t.Errorf("lcm(%d,%d) = %d", c[0], c[1], got)
		}
	}
}

// TestRunWithoutDriver: without CUDA, Run fails with ErrNoDriver. On a GPU
// machine the full run belongs to `moeprep bench kernels`, not the tests.
func TestRunWithoutDriver(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("a CUDA device is present; the bench itself runs through `moeprep bench kernels`")
	}
	_, err := Run(context.Background(), DefaultConfig())
	if !errors.Is(err, ErrNoDriver) || !strings.HasPrefix(err.Error(), "bench kernels needs a GPU: cuda: ") || strings.Contains(err.Error(), "no CUDA driver") {
		t.Fatalf("Run without a driver: %v", err)
	}
	bad := DefaultConfig()
	bad.Iters = 0
	if _, err := Run(context.Background(), bad); err == nil || errors.Is(err, ErrNoDriver) {
		t.Fatalf("a bad config must be refused before the driver is looked for: %v", err)
	}
}
