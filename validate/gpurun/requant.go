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
// weights; FP8 blocks as codes and F32 scales. SRC's shared weights are
// scanned for NaN and Inf as the requantiser reads them, so a non-finite
// one fails its layer by name (tensorbytes.NonFiniteError) as the plain
// shared expert's would, not as a refusal to requantise it.
func RequantisedShared(src tensorload.TensorSource, m family.MLP, f weightfmt.Format) (family.MLP, tensorload.TensorSource, error) {
	scan := map[string]bool{}
	for _, p := range layout.MLPProjs {
		scan[m.Weight(p)] = true
	}
	return tensorload.RequantisedShared(finiteSource{src, scan}, m, f)
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
