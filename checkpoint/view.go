package checkpoint

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/family"
)

// Views name a 2-D piece of a stored tensor, for families that store their
// experts stacked (Granite MoE: input_linear [E, 2I, H] holds every expert's
// gate rows then up rows). "NAME[i]" is slice i of a 3-D tensor,
// "NAME[r0:r1]" rows r0..r1-1 of a 2-D one, "NAME[i][r0:r1]" both. A view
// is a Tensor of its own whose Data is a section of NAME's bytes, so every
// reader (convert, validate, the GPU stager) takes it like any tensor. No
// stored name contains '[' (safetensors and torch names are module paths).

// BaseName is the stored tensor a name refers to (family.BaseName).
func BaseName(name string) string { return family.BaseName(name) }

// view resolves a view name against the stored tensors.
func (c *Checkpoint) view(name string) (*Tensor, error) {
	base := BaseName(name)
	t, ok := c.byName[base]
	if !ok || base == name {
		return nil, fmt.Errorf("tensor %s is missing", base)
	}
	var args []string
	for rest := name[len(base):]; rest != ""; {
		end := strings.IndexByte(rest, ']')
		if rest[0] != '[' || end < 0 {
			return nil, fmt.Errorf("tensor view %s: malformed", name)
		}
		args = append(args, rest[1:end])
		rest = rest[end+1:]
	}
	shape := t.Shape
	es := int64(t.DType.Size())
	var off int64
	for _, a := range args {
		if lo, hi, isRange := strings.Cut(a, ":"); isRange {
			r0, e1 := strconv.ParseInt(lo, 10, 64)
			r1, e2 := strconv.ParseInt(hi, 10, 64)
			if e1 != nil || e2 != nil || len(shape) != 2 || r0 < 0 || r1 <= r0 || r1 > shape[0] {
				return nil, fmt.Errorf("%s: tensor view %s: rows %s of shape %v", t.File, name, a, shape)
			}
			off += r0 * shape[1] * es
			shape = []int64{r1 - r0, shape[1]}
			continue
		}
		i, err := strconv.ParseInt(a, 10, 64)
		if err != nil || len(shape) != 3 || i < 0 || i >= shape[0] {
			return nil, fmt.Errorf("%s: tensor view %s: slice %s of shape %v", t.File, name, a, shape)
		}
		off += i * shape[1] * shape[2] * es
		shape = shape[1:]
	}
	n := es
	for _, d := range shape {
		n *= d
	}
	return &Tensor{Name: name, DType: t.DType, Shape: shape, File: t.File, Data: io.NewSectionReader(t.Data, off, n)}, nil
}
