package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moeprep/moeprep/kernels"
)

// DefaultTokens are the token counts timed when none are given.
var DefaultTokens = []int{1, 16, 128, 1024, 4096}

// MaxTokens bounds --tokens: the [T*K,H] f32 expert output alone is 1 GB at 4096.
const MaxTokens = 65536

// Config is one bench run.
type Config struct {
	Shape  Shape
	DType  DType
	Tokens []int
	// Iters is the most timed runs per measurement (median reported); fewer
	// run when they would exceed Budget, never fewer than MinIters.
	Iters  int
	Budget time.Duration
	// BlockSize is moe_align_block_size's block (a multiple of 16).
	BlockSize int
	// BankCopies is how many copies of the expert bank rotate (0: as many as
	// fit, at most 2, from cuMemGetInfo).
	BankCopies int
	// XSets is how many input sets (x, logits, routing) rotate.
	XSets int
	// Graph captures the layer as a CUDA graph and times its replays too.
	Graph bool
	// Path is the grouped GEMM kernel variant (PathAuto: the one validate
	// and serving use); naming one compares the variants at every T.
	Path kernels.GEMMPath
	// W8A8 runs the grouped GEMM in the block-FP8 serving numerics
	// (kernels.GEMMOptions.W8A8: activations quantised to e4m3 per token
	// per 128 channels, e4m3 x e4m3 wgmma); needs fp8 weights and a
	// compute capability 9.0 device. False: bf16 activations.
	W8A8 bool
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// Defaults for Config fields left zero.
const (
	DefaultIters     = 100
	MinIters         = 5
	DefaultBudget    = time.Second
	DefaultBlockSize = 16
	DefaultXSets     = 4
	maxBankCopies    = 2
)

// DefaultConfig is DeepSeek-V3 in bf16 at the default token counts.
func DefaultConfig() Config {
	return Config{Shape: DeepSeekV3(), DType: BF16, Tokens: slices.Clone(DefaultTokens),
		Iters: DefaultIters, Budget: DefaultBudget, BlockSize: DefaultBlockSize, XSets: DefaultXSets, Graph: true}
}

// Check rejects a configuration Run cannot time.
func (c Config) Check() error {
	if err := c.Shape.Check(); err != nil {
		return err
	}
	if _, err := ParseDType(string(c.DType)); err != nil {
		return err
	}
	switch {
	case len(c.Tokens) == 0:
		return fmt.Errorf("bench: no token counts")
	case c.Iters < 1:
		return fmt.Errorf("--iters %d: want at least 1", c.Iters)
	case c.BlockSize <= 0 || c.BlockSize%16 != 0:
		return fmt.Errorf("--block-size %d: want a positive multiple of 16", c.BlockSize)
	case c.BankCopies < 0:
		return fmt.Errorf("--bank-copies %d: want 0 (auto) or more", c.BankCopies)
	case c.XSets < 1:
		return fmt.Errorf("bench: %d input sets", c.XSets)
	case c.W8A8 && c.DType != FP8:
		return fmt.Errorf("--precision fp8 (w8a8) needs fp8 weights, not --dtype %s", c.DType)
	case c.W8A8 && c.Path != kernels.PathAuto && c.Path != kernels.PathWGMMA:
		return fmt.Errorf("--precision fp8 (w8a8) runs on the wgmma kernels only, not --gemm-path %v", c.Path)
	}
	for _, t := range c.Tokens {
		if t < 1 || t > MaxTokens {
			return fmt.Errorf("--tokens: %d outside 1..%d", t, MaxTokens)
		}
	}
	return nil
}

// ParseTokens reads a comma-separated list of token counts ("1,16,128"),
// each in 1..MaxTokens, without duplicates, returned in the order given.
func ParseTokens(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, fmt.Errorf("--tokens %q: empty entry", s)
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("--tokens %q: %q is not a whole number", s, f)
		}
		if n < 1 || n > MaxTokens {
			return nil, fmt.Errorf("--tokens %q: %d outside 1..%d", s, n, MaxTokens)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("--tokens %q: %d given twice", s, n)
		}
		out = append(out, n)
	}
	return out, nil
}

// itersFor is how many timed runs fit the budget when one run takes about
// est, clamped to [min(MinIters, most), most].
func itersFor(est, budget time.Duration, most int) int {
	lo := min(MinIters, most)
	if est <= 0 {
		return most
	}
	return min(most, max(int(budget/est), lo))
}
