package convert

import (
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
)

// resolveTransformers turns --layout transformers into the stored layout
// and orientation of the form transformers 5 holds the family's experts in
// (family.Plan.TransformersOutputForm): gate-up, out-in for most
// families, gate-up in-out for Llama 4, the experts as stored for the
// families transformers converts nothing for and wherever the experts are
// stored quantised. It refuses what would make the output something
// transformers does not load as the original model.
func resolveTransformers(o *Options, fp *family.Plan, dir string) error {
	if o.Layout != layout.Transformers {
		return nil
	}
	form := fp.TransformersOutputForm()
	switch {
	case o.FuseShared:
		return fmt.Errorf("%s: fuse-shared --layout transformers: a fuse-shared output moves the shared expert into the routed stacks, which transformers does not run as shared slots, so it never loads as the original model; use moeprep convert --layout transformers", dir)
	case o.EP > 0:
		return fmt.Errorf("%s: --layout transformers with --ep: transformers loads one whole model, not one rank's experts; leave --ep out", dir)
	case o.orientationSet && !form.AsStored && o.Orientation != orientationOf(form):
		return fmt.Errorf("%s: --layout transformers --orientation %s: transformers 5 holds %s's experts %s; leave --orientation out", dir, o.Orientation, fp.ModelType, orientationOf(form))
	case o.orientationSet && form.AsStored && o.Orientation == layout.InOut:
		return fmt.Errorf("%s: --layout transformers --orientation in-out: %s's experts are written as the checkpoint stores them, which --orientation cannot change (%s); leave it out", dir, fp.ModelType, form.Why)
	case o.FoldScaling == layout.FoldDown:
		return fmt.Errorf("%s: --layout transformers --fold-scaling down: transformers multiplies by routed_scaling_factor itself, so folded down projections would apply it twice; leave --fold-scaling out", dir)
	case form.AsStored && o.DType != "":
		return fmt.Errorf("%s: --layout transformers --dtype %s: %s's experts are written as the checkpoint stores them (%s), so they are copied as they are and not dequantised; leave --dtype out (transformers dequantises what it needs on load)", dir, o.DType, fp.ModelType, form.Why)
	}
	o.Layout, o.Orientation = form.Layout()
	if !form.AsStored {
		o.expertsModule = form.Module
	}
	if o.Notice != nil {
		o.Notice(fmt.Sprintf("--layout transformers: %s; writing layout %s%s", form.Describe(fp.ModelType), o.Layout, inOutNote(o.Orientation)))
	}
	return nil
}

// inTransformersForm reports whether o writes fp's experts in the form
// transformers 5 holds them in, with nothing else changed: what it loads
// as the original model. Call it once o is resolved.
func inTransformersForm(o *Options, fp *family.Plan) bool {
	form := fp.TransformersOutputForm()
	l, or := form.Layout()
	return o.Layout == l && o.Orientation == or && o.expertsModule == form.Module && !o.FuseShared && o.EP == 0 && o.DType == "" && o.FoldScaling != layout.FoldDown
}

// orientationOf is the orientation of a gate-up form.
func orientationOf(f family.TransformersForm) layout.Orientation {
	_, or := f.Layout()
	return or
}

func inOutNote(or layout.Orientation) string {
	if or == layout.InOut {
		return ", orientation in-out"
	}
	return ""
}
