package validate

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/moeprep/moeprep/safetensors"
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
}

// maxGoldenElems bounds what a golden file may make validate allocate: 1M
// tokens x 7168 would be absurd; 64M floats (256 MB) is far above any real one.
const maxGoldenElems = 64 << 20

// ReadGolden reads and checks dir/moe-layer-l.safetensors. wantH is the
// layer's hidden size (0: not checked).
func ReadGolden(path string, wantH int) (*Golden, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g := &Golden{Path: path}
	x, xs, err := goldenTensor(f, "x", true)
	if err != nil {
		return nil, err
	}
	y, ys, err := goldenTensor(f, "y", true)
	if err != nil {
		return nil, err
	}
	if len(xs) != 2 || len(ys) != 2 || xs[0] != ys[0] || xs[1] != ys[1] || xs[0] <= 0 || xs[1] <= 0 {
		return nil, fmt.Errorf("%s: x %v and y %v must both be [T,H] with T, H > 0", path, xs, ys)
	}
	g.T, g.H = int(xs[0]), int(xs[1])
	if wantH != 0 && g.H != wantH {
		return nil, fmt.Errorf("%s: x is [%d,%d], the layer's hidden size is %d", path, g.T, g.H, wantH)
	}
	g.X, g.Y = x, y
	for i, v := range g.X {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%s: x[%d] is %v", path, i, v)
		}
	}
	ids, is, err := goldenInts(f, "topk_ids")
	if err != nil {
		return nil, err
	}
	w, ws, err := goldenTensor(f, "topk_weights", false)
	if err != nil {
		return nil, err
	}
	if (ids == nil) != (w == nil) {
		return nil, fmt.Errorf("%s: topk_ids and topk_weights come together", path)
	}
	if ids != nil {
		if len(is) != 2 || len(ws) != 2 || is[0] != int64(g.T) || ws[0] != is[0] || ws[1] != is[1] || is[1] <= 0 {
			return nil, fmt.Errorf("%s: topk_ids %v and topk_weights %v must both be [%d,K]", path, is, ws, g.T)
		}
		g.K, g.IDs, g.Weights = int(is[1]), ids, w
	}
	tok, ts, err := goldenInts(f, "input_ids")
	if err != nil {
		return nil, err
	}
	if tok != nil {
		if len(ts) != 1 || ts[0] != int64(g.T) {
			return nil, fmt.Errorf("%s: input_ids %v must be [%d]", path, ts, g.T)
		}
		g.InputIDs = tok
	}
	return g, nil
}

// goldenTensor reads a float tensor (F32, or any float dtype validate decodes).
func goldenTensor(f *safetensors.File, name string, required bool) ([]float32, []int64, error) {
	ti, ok := f.Lookup(name)
	if !ok {
		if required {
			return nil, nil, fmt.Errorf("%s: no tensor %q (a golden needs x and y)", f.Path, name)
		}
		return nil, nil, nil
	}
	if !Decodable(ti.DType) {
		return nil, nil, fmt.Errorf("%s: tensor %s is %s, want F32", f.Path, name, ti.DType)
	}
	raw, err := goldenBytes(f, ti)
	if err != nil {
		return nil, nil, err
	}
	out := make([]float32, len(raw)/ti.DType.Size())
	if err := Decode(ti.DType, raw, out); err != nil {
		return nil, nil, fmt.Errorf("%s: tensor %s: %w", f.Path, name, err)
	}
	return out, ti.Shape, nil
}

// goldenInts reads an optional non-negative integer tensor (I32 or I64).
func goldenInts(f *safetensors.File, name string) ([]int32, []int64, error) {
	ti, ok := f.Lookup(name)
	if !ok {
		return nil, nil, nil
	}
	if ti.DType != safetensors.I32 && ti.DType != safetensors.I64 {
		return nil, nil, fmt.Errorf("%s: tensor %s is %s, want I32 or I64", f.Path, name, ti.DType)
	}
	raw, err := goldenBytes(f, ti)
	if err != nil {
		return nil, nil, err
	}
	n := len(raw) / ti.DType.Size()
	out := make([]int32, n)
	for i := range out {
		var v int64
		if ti.DType == safetensors.I32 {
			v = int64(int32(binary.LittleEndian.Uint32(raw[4*i:])))
		} else {
			v = int64(binary.LittleEndian.Uint64(raw[8*i:]))
		}
		if v < 0 || v > math.MaxInt32 {
			return nil, nil, fmt.Errorf("%s: %s[%d] = %d", f.Path, name, i, v)
		}
		out[i] = int32(v)
	}
	return out, ti.Shape, nil
}

func goldenBytes(f *safetensors.File, ti safetensors.TensorInfo) ([]byte, error) {
	if n := ti.NumBytes(); n < 0 || n > maxGoldenElems*8 {
		return nil, fmt.Errorf("%s: tensor %s is %d bytes, more than a golden should hold", f.Path, ti.Name, n)
	}
	sec, err := f.Section(ti.Name)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, ti.NumBytes())
	if n, err := sec.ReadAt(buf, 0); n != len(buf) {
		return nil, fmt.Errorf("%s: reading tensor %s: %v", f.Path, ti.Name, err)
	}
	return buf, nil
}

// goldenPath finds layer l's golden in dir; ok is false when there is none.
func goldenPath(dir string, l int) (string, bool) {
	p := filepath.Join(dir, GoldenFileName(l))
	st, err := os.Stat(p)
	return p, err == nil && st.Mode().IsRegular()
}
