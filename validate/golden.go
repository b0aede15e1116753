package validate

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// GoldenFileName is the golden of MoE layer l inside a golden directory.
func GoldenFileName(l int) string { return fmt.Sprintf("moe-layer-%d.safetensors", l) }

// Golden is one layer's HF reference: x [T,H], y [T,H] (the HF module's
// float32 output), and optionally the router's topk_ids [T,K] and
// topk_weights [T,K] (rsf included).
type Golden struct {
	Path    string
	T, H, K int
	X, Y    []float32
	IDs     []int32   // nil when absent
	Weights []float32 // nil when absent
	// InputIDs [T]: the tokens' ids, which a hash-routed layer routes by
	// (DeepSeek-V4); nil when absent.
	InputIDs []int32
	// TokenTypes [T]: each token's type (0 text, else vision), which picks
	// the routed bank of a layer that has two (ERNIE-4.5-VL); nil when
	// absent: every token text.
	TokenTypes []int32
	// Point is where y was taken, as the file's metadata "point" states it
	// (GoldenPointSum, GoldenPointModule; "" when unstated: the sum).
	Point string
}

// The points a golden's y may be taken at (its metadata's "point").
const (
	// GoldenPointSum: the sum moeprep plans and validates, routed experts
	// plus any shared expert (what the project's exporters write, and
	// what a golden that states no point is taken as).
	GoldenPointSum = "moe-sum"
	// GoldenPointModule: the output of the module transformers calls the
	// MoE block (a forward hook on the decoder layer's mlp,
	// block_sparse_moe, ...): the sum for most families, after the
	// block's post norm for A.X-K1, the routed part alone for Granite
	// (family.ModuleOutput). fixtures/hf/export_module_goldens.py writes them.
	GoldenPointModule = "module-output"
)

// ForBank is the golden's tokens that the routed bank bank of a layer with
// two (family.BankText, BankVision) computes, chosen by their
// token_type_ids: y of a text token is the text bank's output plus the
// shared MLP's, and so on. A golden without token_type_ids is text
// throughout, as transformers takes a prompt without them (and as the
// project's exporter writes a text prompt's). A bank none of whose tokens
// the golden holds is an error; Run asks only for the banks it took
// (TookBank) and reports the others not checked against the golden.
func (g *Golden) ForBank(bank family.Bank, layer string) (*Golden, error) {
	out := &Golden{Path: g.Path, H: g.H, K: g.K, Point: g.Point}
	for i := range g.T {
		if !g.tookBank(i, bank) {
			continue
		}
		out.T++
		out.X = append(out.X, g.X[i*g.H:(i+1)*g.H]...)
		out.Y = append(out.Y, g.Y[i*g.H:(i+1)*g.H]...)
		if g.IDs != nil {
			out.IDs = append(out.IDs, g.IDs[i*g.K:(i+1)*g.K]...)
			out.Weights = append(out.Weights, g.Weights[i*g.K:(i+1)*g.K]...)
		}
		if g.InputIDs != nil {
			out.InputIDs = append(out.InputIDs, g.InputIDs[i])
		}
	}
	if out.T == 0 {
		return nil, fmt.Errorf("%s: no token of the golden took layer %s (token_type_ids), so it cannot check it", g.Path, layer)
	}
	return out, nil
}

// TookBank reports whether some token of the golden took routed bank bank
// of a layer with two (see ForBank).
func (g *Golden) TookBank(bank family.Bank) bool {
	for i := range g.T {
		if g.tookBank(i, bank) {
			return true
		}
	}
	return false
}

// tookBank: token i took bank by its type (0 text, else vision; text
// where the golden says no types).
func (g *Golden) tookBank(i int, bank family.Bank) bool {
	vision := g.TokenTypes != nil && g.TokenTypes[i] != 0
	return vision == (bank == family.BankVision)
}

// Limits on what a golden may make validate read and hold. A golden's
// shapes are checked against each other and these before any data is read:
// a sparse file can claim gigabytes of tensors for nothing (a 4 GiB one cost
// 3.1 GB of RSS).
const (
	// maxGoldenTokens: fixtures/hf/export.py writes 32 tokens a layer and
	// validate draws 128 by default; a golden is compared token by token.
	maxGoldenTokens = 1 << 12
	// maxGoldenElems bounds x and y, [T,H] each: 1,024 tokens of
	// DeepSeek-V3's 7,168 are 7.3 M values; 8 Mi keeps x and y to 32 MB
	// each once widened to float32.
	maxGoldenElems = 8 << 20
	// maxGoldenTopK bounds K of topk_ids and topk_weights [T,K]: routers
	// pick 1 to 8 experts a token.
	maxGoldenTopK = 1 << 10
	// maxGoldenOther bounds the bytes of tensors a golden holds besides its
	// own five, which are never read: a little room for an exporter's
	// extras (router logits), none for a file out of all proportion.
	maxGoldenOther = 16 << 20
	// goldenChunk is how much raw data is read at a time while widening.
	goldenChunk = 1 << 20
)

// goldenNames are the tensors a golden may hold and validate reads.
var goldenNames = map[string]bool{"x": true, "y": true, "topk_ids": true, "topk_weights": true, "input_ids": true, "token_type_ids": true}

// ReadGolden reads and checks dir/moe-layer-l.safetensors. wantH is the
// layer's hidden size (0: not checked). Every shape and dtype is checked
// before any tensor data is read; errors name the file and the tensor.
func ReadGolden(path string, wantH int) (*Golden, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fail := func(format string, args ...any) (*Golden, error) {
		return nil, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
	}
	x, hasX := f.Lookup("x")
	y, hasY := f.Lookup("y")
	switch {
	case !hasX:
		return fail("no tensor %q (a golden needs x and y)", "x")
	case !hasY:
		return fail("no tensor %q (a golden needs x and y)", "y")
	}
	xs, ys := x.Shape, y.Shape
	if len(xs) != 2 || len(ys) != 2 || xs[0] != ys[0] || xs[1] != ys[1] || xs[0] <= 0 || xs[1] <= 0 {
		return fail("x %v and y %v must both be [T,H] with T, H > 0", xs, ys)
	}
	t, h := xs[0], xs[1]
	switch {
	case wantH != 0 && h != int64(wantH):
		return fail("x is [%d,%d], the layer's hidden size is %d", t, h, wantH)
	case t > maxGoldenTokens:
		return fail("tensor x: %d tokens, over the limit of %d (export.py writes 32)", t, maxGoldenTokens)
	case h > family.MaxHidden: // H where the layer's is not given: a config's bound
		return fail("tensor x: hidden size %d, over the limit of %d", h, family.MaxHidden)
	case t*h > maxGoldenElems:
		return fail("tensor x: [%d,%d] is %d values, over the limit of %d", t, h, t*h, maxGoldenElems)
	}
	for _, ti := range []safetensors.TensorInfo{x, y} {
		if !tensorload.Decodable(ti.DType) {
			return fail("tensor %s is %s, want F32", ti.Name, ti.DType)
		}
	}
	ids, hasIDs := f.Lookup("topk_ids")
	w, hasW := f.Lookup("topk_weights")
	if hasIDs != hasW {
		return fail("topk_ids and topk_weights come together")
	}
	if hasIDs {
		is, ws := ids.Shape, w.Shape
		if len(is) != 2 || len(ws) != 2 || is[0] != t || ws[0] != is[0] || ws[1] != is[1] || is[1] <= 0 {
			return fail("topk_ids %v and topk_weights %v must both be [%d,K]", is, ws, t)
		}
		if is[1] > maxGoldenTopK {
			return fail("tensor topk_ids: K=%d, over the limit of %d", is[1], maxGoldenTopK)
		}
		if ids.DType != safetensors.I32 && ids.DType != safetensors.I64 {
			return fail("tensor topk_ids is %s, want I32 or I64", ids.DType)
		}
		if !tensorload.Decodable(w.DType) {
			return fail("tensor topk_weights is %s, want F32", w.DType)
		}
	}
	// Per-token integer tensors [T]: the token ids (hash routing), the
	// token types (a layer's two routed banks).
	perToken := func(name string) (safetensors.TensorInfo, bool, error) {
		ti, ok := f.Lookup(name)
		switch {
		case !ok:
		case len(ti.Shape) != 1 || ti.Shape[0] != t:
			_, err := fail("%s %v must be [%d]", name, ti.Shape, t)
			return ti, ok, err
		case ti.DType != safetensors.I32 && ti.DType != safetensors.I64:
			_, err := fail("tensor %s is %s, want I32 or I64", name, ti.DType)
			return ti, ok, err
		}
		return ti, ok, nil
	}
	tok, hasTok, err := perToken("input_ids")
	if err != nil {
		return nil, err
	}
	types, hasTypes, err := perToken("token_type_ids")
	if err != nil {
		return nil, err
	}
	other := int64(0)
	for _, ti := range f.Tensors {
		if goldenNames[ti.Name] {
			continue
		}
		if other += ti.NumBytes(); other > maxGoldenOther {
			return fail("tensor %s: the file holds over %d bytes of tensors besides x, y, topk_ids, topk_weights, input_ids and token_type_ids (not a golden?)", ti.Name, maxGoldenOther)
		}
	}

	g := &Golden{Path: path, T: int(t), H: int(h), Point: f.Metadata["point"]}
	if g.Point != "" && g.Point != GoldenPointSum && g.Point != GoldenPointModule {
		return fail("metadata point %q: a golden's y is taken at %q (the sum moeprep plans) or %q (the output of the module transformers calls the MoE block)", g.Point, GoldenPointSum, GoldenPointModule)
	}
	if g.X, err = goldenFloats(f, x); err != nil {
		return nil, err
	}
	for i, v := range g.X {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fail("x[%d] is %v", i, v)
		}
	}
	if g.Y, err = goldenFloats(f, y); err != nil {
		return nil, err
	}
	if hasIDs {
		g.K = int(ids.Shape[1])
		if g.IDs, err = goldenInts(f, ids); err != nil {
			return nil, err
		}
		if g.Weights, err = goldenFloats(f, w); err != nil {
			return nil, err
		}
	}
	if hasTok {
		if g.InputIDs, err = goldenInts(f, tok); err != nil {
			return nil, err
		}
	}
	if hasTypes {
		if g.TokenTypes, err = goldenInts(f, types); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// goldenRead calls each with consecutive pieces of a checked tensor's raw
// bytes, at most goldenChunk at a time, whole elements each, and the index
// of the piece's first element.
func goldenRead(f *safetensors.File, ti safetensors.TensorInfo, each func(raw []byte, first int) error) error {
	sec, err := f.Section(ti.Name)
	if err != nil {
		return err
	}
	size := int64(ti.DType.Size())
	buf := make([]byte, min(ti.NumBytes(), goldenChunk/size*size))
	for off := int64(0); off < ti.NumBytes(); {
		raw := buf[:min(int64(len(buf)), ti.NumBytes()-off)]
		if n, err := sec.ReadAt(raw, off); n != len(raw) {
			return fmt.Errorf("%s: reading tensor %s: %v", f.Path, ti.Name, err)
		}
		if err := each(raw, int(off/size)); err != nil {
			return err
		}
		off += int64(len(raw))
	}
	return nil
}

// goldenFloats reads a checked float tensor, widened to float32 a piece at
// a time, so that only the result is held.
func goldenFloats(f *safetensors.File, ti safetensors.TensorInfo) ([]float32, error) {
	size := ti.DType.Size()
	out := make([]float32, ti.NumBytes()/int64(size))
	err := goldenRead(f, ti, func(raw []byte, first int) error {
		if err := tensorload.Decode(ti.DType, raw, out[first:first+len(raw)/size]); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", f.Path, ti.Name, err)
		}
		return nil
	})
	return out, err
}

// goldenInts reads a checked non-negative integer tensor (I32 or I64).
func goldenInts(f *safetensors.File, ti safetensors.TensorInfo) ([]int32, error) {
	size := ti.DType.Size()
	out := make([]int32, ti.NumBytes()/int64(size))
	err := goldenRead(f, ti, func(raw []byte, first int) error {
		for j := 0; j < len(raw)/size; j++ {
			var v int64
			if ti.DType == safetensors.I32 {
				v = int64(int32(binary.LittleEndian.Uint32(raw[4*j:])))
			} else {
				v = int64(binary.LittleEndian.Uint64(raw[8*j:]))
			}
			if v < 0 || v > math.MaxInt32 {
				return fmt.Errorf("%s: %s[%d] = %d", f.Path, ti.Name, first+j, v)
			}
			out[first+j] = int32(v)
		}
		return nil
	})
	return out, err
}

// goldenPath finds layer l's golden in dir; ok is false when there is none.
func goldenPath(dir string, l int) (string, bool) {
	p := filepath.Join(dir, GoldenFileName(l))
	st, err := os.Stat(p)
	return p, err == nil && st.Mode().IsRegular()
}
