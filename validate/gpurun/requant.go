package gpurun

import (
	"github.com/moeprep/moeprep/layout"
	"io"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// RequantisedShared is what the GPU's unfused path runs for a shared
// expert that DST's contract says fuse-shared requantised into format f
// (shared_requantized): m, SRC's plain shared expert, quantised by
// weightfmt's rule from SRC's bytes (tensorload.RequantisedShared, the
// requantisation the CPU reference runs and the byte proof predicts DST's
// replicas with), and the source that serves the requantised weights and
// scales beside src's tensors. They load as any MLP of format f does
// (loadMLPBankOf): a format decoded on the device (INT4, FP8 per channel
// or per tensor) through the same decode as DST's fused bank, which holds
// these bytes in its shared replicas, so both paths run the same bf16
// weights; FP8 blocks as codes and F32 scales.
//
// SRC's shared weights are scanned for NaN and Inf first. Where they are
// finite, the requantisation reads src's own tensors, so it is the one
// the CPU reference and the byte proof read (checkpoint's requantiser is
// shared by tensor): each band is quantised once and cached once, not a
// second time for this path beside the others' (at Kimi-K2's size the
// requantised shared expert is 25 MB of a cache of 32). Where one is not,
// the weights are read through a scan as the requantiser reads them, so
// that the non-finite one fails its layer by name
// (tensorbytes.NonFiniteError) as the plain shared expert's would, not as
// a refusal to requantise it.
func RequantisedShared(src tensorload.TensorSource, m family.MLP, f weightfmt.Format) (family.MLP, tensorload.TensorSource, error) {
	scan := map[string]bool{}
	finite := true
	for _, p := range layout.MLPProjs {
		name := m.Weight(p)
		scan[name] = true
		if t, ok := src.Tensor(name); finite && ok {
			finite = allFinite(t)
		}
	}
	if finite {
		return tensorload.RequantisedShared(src, m, f)
	}
	return tensorload.RequantisedShared(finiteSource{src, scan}, m, f)
}

// finiteScanBytes is what allFinite reads at a time.
const finiteScanBytes = 1 << 20

// allFinite reports whether t's bytes read whole and hold no NaN or Inf.
// A read that fails is not finite either: the scanning reader then meets
// the failure where the requantiser reads, and reports it as it would.
// In a streamed pass the bytes come from the layer's head, which the pass
// holds; elsewhere the requantiser's read after this one finds them in
// the page cache.
func allFinite(t *checkpoint.Tensor) bool {
	size := int64(t.DType.Size())
	if size <= 0 {
		return false
	}
	buf := make([]byte, finiteScanBytes/size*size)
	n := t.NumBytes()
	for off := int64(0); off < n; off += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), n-off)]
		if got, _ := t.Data.ReadAt(b, off); got != len(b) {
			return false
		}
		if i, _ := tensorbytes.FirstNonFinite(t.DType, b); i >= 0 {
			return false
		}
	}
	return true
}

// finiteSource is src, its tensors named in scan read through
// finiteReader.
type finiteSource struct {
	src  tensorload.TensorSource
	scan map[string]bool
}

func (s finiteSource) Tensor(name string) (*checkpoint.Tensor, bool) {
	t, ok := s.src.Tensor(name)
	if !ok || !s.scan[name] {
		return t, ok
	}
	c := *t
	c.Data = finiteReader{t}
	return &c, true
}

// finiteReader reads t's bytes, failing a read that holds a NaN or an Inf
// with the element's index in t (and no bytes, so that no reader takes
// the read for a whole one).
type finiteReader struct{ t *checkpoint.Tensor }

func (r finiteReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.t.Data.ReadAt(p, off)
	size := int64(r.t.DType.Size())
	if size > 0 && off%size == 0 {
		whole := int64(n) - int64(n)%size
		if ferr := tensorbytes.CheckFinite(r.t.File, r.t.Name, r.t.DType, p[:whole], off/size); ferr != nil {
			return 0, ferr
		}
	}
	return n, err
}

var _ io.ReaderAt = finiteReader{}
