package tensorload

import (
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
