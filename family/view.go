package family

import (
	"strconv"
	"strings"
)

// Tensor views: the names checkpoint.Checkpoint resolves to a 2-D piece of
// a stored tensor (see checkpoint/view.go), for families that store their
// experts stacked on disk.

// ViewName builds a view name: slice index (>= 0) of a 3-D tensor and/or
// rows r0..r1-1 (when r1 > r0).
func ViewName(name string, index, r0, r1 int) string {
	s := name
	if index >= 0 {
		s += "[" + strconv.Itoa(index) + "]"
	}
	if r1 > r0 {
		s += "[" + strconv.Itoa(r0) + ":" + strconv.Itoa(r1) + "]"
	}
	return s
}

// BaseName is the stored tensor a name refers to: itself, or a view's.
func BaseName(name string) string {
	if i := strings.IndexByte(name, '['); i > 0 && strings.HasSuffix(name, "]") {
		return name[:i]
	}
	return name
}

// TransposedViewName names columns c0, c0+step, ... (n of them) of slice
// index of a 3-D tensor, transposed (checkpoint/view.go): Llama 4's
// gate_up_proj [E, H, 2I] holds expert e's gate as columns 0..I-1.
func TransposedViewName(name string, index int, c0, n, step int) string {
	return ViewName(name, index, 0, 0) + "[T:" + strconv.Itoa(c0) + ":" + strconv.Itoa(n) + ":" + strconv.Itoa(step) + "]"
}

// StridedRowsViewName names rows r0, r0+step, ... (n of them) of slice
// index of a 3-D or 4-D tensor (checkpoint/view.go): gpt-oss's MXFP4
// gate_up_proj_blocks [E, 2I, H/32, 16] holds expert e's gate as its even
// rows, its up as the odd ones; so does Inkling's hub w13_weight [E, 2I, H].
func StridedRowsViewName(name string, index int, r0, n, step int) string {
	return ViewName(name, index, 0, 0) + "[R:" + strconv.Itoa(r0) + ":" + strconv.Itoa(n) + ":" + strconv.Itoa(step) + "]"
}
