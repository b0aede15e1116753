package family

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// This file checks per-expert weights of the formats whose tensors are
// named and shaped by weightfmt alone (TensorsOf, Matrix): NVFP4
// (ModelOpt's and compressed-tensors') and MXFP4 stored per expert
// (compressed-tensors' mxfp4-pack-quantized, DeepSeek-V4's FP4 experts):
// the packed weight, its block scales, and where the format has them its
// per-tensor global scale and the static activation scale of W4A4 exports.

// packedMLP checks one MLP of such weights and names its tensors.
func (k *checker) packedMLP(where, prefix string, proj [3]string, inter int, hint string) (MLP, error) {
	return k.quantMLP(where, prefix, proj, inter, hint, func(where, role, weight string, rows, cols int64, hint string) (weightfmt.Tensors, error) {
		tn, err := k.packedWeight(where, role, weight, rows, cols, hint)
		if !k.p.NVFP4InputScale { // decided at the first weight: the checkpoint has none
			tn.Input = ""
		}
		return tn, err
	}, layout.RoleWeight, layout.RoleScale, layout.RoleGlobal, layout.RoleInput)
}

// quantMLP checks one MLP of quantised weights, each projection's through
// check (int4Weight, packedWeight), and names of each the tensors of roles.
func (k *checker) quantMLP(where, prefix string, proj [3]string, inter int, hint string,
	check func(where, role, weight string, rows, cols int64, hint string) (weightfmt.Tensors, error), roles ...layout.Role) (MLP, error) {
	var m MLP
	if err := k.eachProj(proj, inter, func(n int, pr string, rows, cols int64) error {
		tn, err := check(where, pr, prefix+"."+pr+".weight", rows, cols, hint)
		if err != nil {
			return err
		}
		for _, r := range roles {
			m.Set(layout.MLPProjs[n], r, roleTensor(tn, r))
		}
		return nil
	}); err != nil {
		return MLP{}, err
	}
	return m, nil
}

// roleTensor is tn's tensor of role r; "" for a role weightfmt.Tensors does
// not name.
func roleTensor(tn weightfmt.Tensors, r layout.Role) string {
	switch r {
	case layout.RoleWeight:
		return tn.Weight
	case layout.RoleScale:
		return tn.Scale
	case layout.RoleShape:
		return tn.Shape
	case layout.RoleGlobal:
		return tn.Global
	case layout.RoleInput:
		return tn.Input
	}
	return ""
}

// packedFormat is the plan's format; at the first expert weight, where
// the format has a choice of weight and scale dtypes (MXFP4: U8 or I8
// weights, U8 or F8_E8M0 scales) and the checkpoint's are not its
// defaults, it takes them from that weight's tensors.
func (k *checker) packedFormat(weight, scale safetensors.DType) (weightfmt.Format, error) {
	f, err := k.p.Format()
	if err != nil || k.dtype != "" {
		return f, err
	}
	if sc, _ := f.Scale(); f.DType() == weight && sc.DType == scale {
		return f, nil
	}
	try := *k.p
	try.WeightDType, try.ScaleDType = weight, scale
	if _, err := try.Format(); err == nil {
		k.p.WeightDType, k.p.ScaleDType = weight, scale
	}
	return k.p.Format()
}

// packedWeight checks one projection (plain name weight, [rows, cols]) and
// names its tensors.
func (k *checker) packedWeight(where, role, weight string, rows, cols int64, hint string) (weightfmt.Tensors, error) {
	f, err := k.p.Format()
	if err != nil {
		return weightfmt.Tensors{}, fmt.Errorf("%s: %w", where, err)
	}
	tn := weightfmt.TensorsOf(f, weight)
	meta, ok := k.t.Lookup(tn.Weight)
	if !ok {
		if _, plain := k.t.Lookup(weight); plain && tn.Weight != weight {
			return tn, fmt.Errorf("%s: %s is stored unpacked (%s) but the quantisation config says %s for this module", where, tn.Weight, weight, f)
		}
		return tn, fmt.Errorf("%s: missing tensor %s", where, tn.Weight)
	}
	sm, hasScale := k.t.Lookup(tn.Scale)
	if f, err = k.packedFormat(meta.DType, sm.DType); err != nil {
		return tn, fmt.Errorf("%s: %w", where, err)
	}
	if meta.DType != f.DType() {
		return tn, fmt.Errorf("%s: %s is %s but the quantisation config says %s (%s, two E2M1 to a byte) for this module", where, tn.Weight, meta.DType, f, f.DType())
	}
	if k.dtype == "" {
		k.dtype, k.dtypeFrom = meta.DType, tn.Weight
	}
	sc, _ := f.Scale()
	if g := sc.Block[1]; cols%g != 0 {
		return tn, fmt.Errorf("%s: %s weight has %d input columns, not a whole number of %d-column %s scale groups", where, role, cols, g, f)
	}
	mx := weightfmt.Matrix{Format: f, Rows: rows, Cols: cols}
	if want := mx.Shape(); !slices.Equal(meta.Shape, want) {
		return tn, fmt.Errorf("%s: %s %s shape %s, expected %s (%s weight [%d, %d], two E2M1 to a byte) %s",
			where, role, tn.Weight, shapeString(meta.Shape), shapeString(want), role, rows, cols, hint)
	}
	if !hasScale {
		return tn, fmt.Errorf("%s: missing tensor %s (%s weights need their block scales)", where, tn.Scale, f)
	}
	r, c := mx.ScaleShape()
	if sm.DType != sc.DType || !slices.Equal(sm.Shape, []int64{r, c}) {
		return tn, fmt.Errorf("%s: %s is %s %s, expected %s [%d, %d] (one per %d input columns of %s weight [%d, %d])",
			where, tn.Scale, sm.DType, shapeString(sm.Shape), sc.DType, r, c, sc.Block[1], role, rows, cols)
	}
	if tn.Global == "" {
		return tn, nil
	}
	if err := k.scalarF32(where, tn.Global, "NVFP4's per-tensor second scale"); err != nil {
		return tn, err
	}
	_, hasIn := k.t.Lookup(tn.Input)
	if !k.nvInputSeen {
		k.nvInputSeen, k.p.NVFP4InputScale, k.nvInputFrom = true, hasIn, tn.Weight
	}
	switch {
	case hasIn && !k.p.NVFP4InputScale:
		leaf := tn.Input[strings.LastIndex(tn.Input, ".")+1:]
		return tn, fmt.Errorf("%s: %s present but %s has no %s: every NVFP4 expert weight has one or none", where, tn.Input, k.nvInputFrom, leaf)
	case !hasIn && k.p.NVFP4InputScale:
		return tn, fmt.Errorf("%s: missing tensor %s (%s has one: every NVFP4 expert weight has one or none)", where, tn.Input, k.nvInputFrom)
	case hasIn:
		return tn, k.scalarF32(where, tn.Input, "NVFP4's static activation scale")
	}
	return tn, nil
}

// scalarF32 checks a per-tensor F32 scale stored as [] or [1].
func (k *checker) scalarF32(where, name, what string) error {
	sm, ok := k.t.Lookup(name)
	if !ok {
		return fmt.Errorf("%s: missing tensor %s (%s)", where, name, what)
	}
	if sm.DType != safetensors.F32 || !(len(sm.Shape) == 0 || slices.Equal(sm.Shape, []int64{1})) {
		return fmt.Errorf("%s: %s is %s %s, expected F32 [] (%s)", where, name, sm.DType, shapeString(sm.Shape), what)
	}
	return nil
}
