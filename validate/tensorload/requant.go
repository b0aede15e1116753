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
// tensors (checkpoint.RequantisedPrefix: RequantisedShared's) computed
// once, now, so that a reader pays for the computation ahead of the read
// (the GPU's unfused path quantises the shared expert on the host while
// the routed experts run). Where they fit in three quarters of the
// requantiser's band cache (weightfmt.RequantCacheBytes: the rest for
// what other readers compute meanwhile), they are computed into it and
// nothing is held apart: the CPU reference and the byte proof read the
// same bands from there (Kimi-K2's requantised shared expert, 24 MB, was
// held a second time here). Larger ones are read into memory: their bytes,
// one MLP's. A tensor whose computation fails is left as it was, so
// reading it fails as it would have.
func Computed(src TensorSource, names []string) TensorSource {
	var computed []*checkpoint.Tensor
	var total int64
	for _, name := range names {
		if t, ok := src.Tensor(name); ok && strings.HasPrefix(name, checkpoint.RequantisedPrefix) {
			computed = append(computed, t)
			total += t.NumBytes()
		}
	}
	if total <= aheadInCache() {
		buf := make([]byte, computeAheadBytes)
		for _, t := range computed {
			for off := int64(0); off < t.NumBytes(); off += int64(len(buf)) {
				if n, _ := t.Data.ReadAt(buf[:min(int64(len(buf)), t.NumBytes()-off)], off); n == 0 {
					break
				}
			}
		}
		return src
	}
	extra := map[string]*checkpoint.Tensor{}
	for _, t := range computed {
		b := make([]byte, t.NumBytes())
		if n, _ := t.Data.ReadAt(b, 0); n != len(b) {
			continue
		}
		c := *t
		c.Data = bytes.NewReader(b)
		extra[t.Name] = &c
	}
	return overlay{src, extra}
}

// aheadInCache is the most Computed computes into the requantiser's cache
// rather than holding apart (a variable for tests).
var aheadInCache = func() int64 { return weightfmt.RequantCacheBytes() / 4 * 3 }

// computedByBands is the most of a computed weight's bytes read a band at
// a time (a quarter of the requantiser's cache: a projection of a shared
// expert that fits in it whole, with room for its neighbours'; a variable
// for tests).
var computedByBands = func() int64 { return weightfmt.RequantCacheBytes() / 4 }

// computeAheadBytes is what Computed reads at a time of tensors it computes
// into the requantiser's cache: bands of many rows, which it computes on
// every core at once.
const computeAheadBytes = 4 << 20
