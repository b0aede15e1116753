package tensorload

import (
	"bytes"
	"strings"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/weightfmt"
)

// overlay finds tensors computed beside a source's own.
type overlay struct {
	TensorSource
	extra map[string]*checkpoint.Tensor
}

func (o overlay) Tensor(name string) (*checkpoint.Tensor, bool) {
	if t, ok := o.extra[name]; ok {
		return t, true
	}
	return o.TensorSource.Tensor(name)
}

// RequantisedShared is m, a plain shared expert of src, quantised into
// format f as fuse-shared --requantize-shared quantises it
// (checkpoint.RequantisedMLP: weightfmt's rule, from src's bytes): the MLP
// naming the requantised weights and scales, and a source that serves them
// beside src's own tensors, each computing its bytes from src's as it is
// read. The CPU reference and the GPU's unfused path both run the
// requantised shared expert from it, so they run the same bytes as DST's
// fused replicas.
func RequantisedShared(src TensorSource, m family.MLP, f weightfmt.Format) (family.MLP, TensorSource, error) {
	extra := map[string]*checkpoint.Tensor{}
	names, err := checkpoint.RequantisedMLP(src, m, f, func(t *checkpoint.Tensor) { extra[t.Name] = t })
	if err != nil {
		return family.MLP{}, nil, err
	}
	return names, overlay{src, extra}, nil
}

// Computed is src with those of names that are computed from other
// tensors (checkpoint.RequantisedPrefix: RequantisedShared's) read once
// into memory, so that a reader pays for the computation once, where it
// is done ahead of the read (the GPU's unfused path quantises the shared
// expert on the host while the routed experts run). Its memory is the
// computed tensors' bytes: one MLP's. A tensor whose computation fails is
// left as it was, so reading it fails as it would have.
func Computed(src TensorSource, names []string) TensorSource {
	extra := map[string]*checkpoint.Tensor{}
	for _, name := range names {
		t, ok := src.Tensor(name)
		if !ok || !strings.HasPrefix(name, checkpoint.RequantisedPrefix) {
			continue
		}
		b := make([]byte, t.NumBytes())
		if n, _ := t.Data.ReadAt(b, 0); n != len(b) {
			continue
		}
		c := *t
		c.Data = bytes.NewReader(b)
		extra[name] = &c
	}
	return overlay{src, extra}
}
