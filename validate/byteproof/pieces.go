// The prediction opened to a reader that checks DST's tensors piece by piece rather than shard by
// shard: the per-rank proof (validate/rankproof), whose ranks hold slots cut from the whole model's
// stacks. It is the prediction CheckBytes compares with, so every option the byte proof predicts
// (--dtype, --orientation in-out, --requantize-shared, the rsf fold) is predicted once, here.

package byteproof

import (
	"fmt"
	"io"
	"slices"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Prediction is what every tensor of a DST written from SRC under a
// contract must hold.
type Prediction struct{ p *prediction }

// Predict predicts every DST tensor from src and contract c alone. A
// per-rank contract (expert_parallel) is predicted as the whole-model
// output its ranks are cut from: each stack holds all E routed experts as
// bank experts 0..E-1 and, fused, the shared expert's slices as E+s (the
// replicas past the first are the same bytes again).
func Predict(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract) (*Prediction, error) {
	p, err := predict(src, plan, c)
	if err != nil {
		return nil, err
	}
	return &Prediction{p}, nil
}

// Want is the dtype and shape of tensor name (a stack's: the whole
// model's), and whether it is a stack; ok is false for a name the
// prediction does not hold.
func (pr *Prediction) Want(name string) (d safetensors.DType, shape []int64, stack, ok bool) {
	w, ok := pr.p.meta[name]
	return w.dtype, w.shape, w.layer >= 0 && w.expert < 0, ok
}

// Others lists the tensors outside the stacks, sorted: SRC's copies and
// the weights a dequantised DST holds under their plain names.
func (pr *Prediction) Others() []string {
	var out []string
	for n, w := range pr.p.meta {
		if w.layer < 0 || w.expert >= 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Reader reads the predicted bytes of name, a tensor outside the stacks
// (Others): SRC's bytes, or a dequantised DST's rounding of their values.
func (pr *Prediction) Reader(name string) (io.Reader, error) {
	segs, ok := pr.p.tensors[name]
	if _, _, stack, _ := pr.Want(name); !ok || stack {
		return nil, fmt.Errorf("tensor %s is not one the prediction holds outside the stacks", name)
	}
	return &segReader{segs: segs}, nil
}

// ExpertBytes is bank expert b's bytes in stack name as DST holds them:
// SRC's bytes cut, transposed (in-out), dequantised or requantised as the
// contract says, with a folded routed_scaling_factor applied as
// weightfmt.FoldInPlace rounds it (CheckBytes holds a fold only within one
// rounding; a reader comparing these bytes exactly holds convert to that
// rounding). It holds the expert's bytes in memory: one expert's piece of
// one stack. read is the SRC bytes the prediction read.
func (pr *Prediction) ExpertBytes(name string, b int) (out []byte, read int64, err error) {
	var segs []segment
	var n int64
	for _, sg := range pr.p.tensors[name] {
		if sg.expert == b {
			segs = append(segs, sg)
			n += sg.n
			read += sg.n
			if sg.dq != nil {
				read += sg.dq.srcBytes(sg.ranges) - sg.n
			}
		}
	}
	if len(segs) == 0 {
		return nil, 0, fmt.Errorf("stack %s: the prediction holds no bank expert %d", name, b)
	}
	out = make([]byte, n)
	if _, err := io.ReadFull(&segReader{segs: segs}, out); err != nil {
		return nil, 0, fmt.Errorf("stack %s bank expert %d: %w", name, b, err)
	}
	var at int64
	for _, sg := range segs {
		if sg.fold != 0 && sg.dq == nil {
			weightfmt.FoldInPlace(sg.src.DType, out[at:at+sg.n], sg.fold)
		}
		at += sg.n
	}
	return out, read, nil
}

// CheckConfig proves DST's config.json at p is SRC's (srcJSON, read from
// srcPath) plus exactly the contract c, as CheckBytes does: SRC's keys and
// values, but those a dequantised DST drops, and the contract as moeprep
// encodes it. A mismatch is returned; an input that cannot be read is an
// error.
func CheckConfig(p, srcPath string, srcJSON []byte, c *layout.Contract) (*ByteMismatch, error) {
	_, mm, err := checkConfigFile(p, layout.FileInfo{}, srcPath, srcJSON, c)
	return mm, err
}
