package rankproof

import (
	"context"
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/validate/judge"
)

// checkGPU recomposes layer l on the GPU through each replica choice: SRC's
// layer and every MoE-TP part of the ranks' run by the GPU's unfused path
// (gpurun.Runner.UnfusedLayer: router and gate on the device, each chosen
// expert's slot uploaded as a bank of one and run through the grouped
// GEMM, finalize), the same kernels whole-model validate runs, over the
// same views of the ranks' slots the CPU recomposition reads. The parts'
// outputs are summed on the host.
func (rc *recomposer) checkGPU(ctx context.Context, g *gpurun.Runner, l *recomposedLayer, x []float32, o Options) ([]LayerCheck, error) {
	var fr gpurun.Frees
	defer fr.Release(g)
	h := rc.plan.HiddenSize
	xAll := append(append([]float32(nil), x...), l.cov.X...) // the forced tokens follow the seeded ones
	in, err := g.Input(xAll, len(xAll)/h, h, &fr)
	if err != nil {
		return nil, err
	}
	want, err := g.UnfusedLayer(ctx, rc.src, rc.plan, &l.routed, in, l.cov, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rc.srcDir, err)
	}
	tol := rc.dequantisedTolerance(gpuTolerance(o.Precision, rc.roundedFold()))
	var out []LayerCheck
	for rep := range l.most {
		got, err := rc.sumParts(l, rep, func(_ int, part *family.Plan, pl *family.Layer, vs *views) ([]float32, error) {
			res, err := g.UnfusedLayer(ctx, vs, part, pl, in, l.cov, nil, nil)
			if err != nil {
				return nil, err
			}
			return res.Y, nil
		})
		if err != nil {
			return nil, err
		}
		out = append(out, judged(rc.c.Layers[l.i].Index, rep, "cuda", got, want.Y, tol))
	}
	return out, nil
}

// gpuTolerance is judge's for two GPU paths on the same weights at
// precision (the parts' GEMMs round and sum in another order than the
// whole expert's), widened where folding rsf rounded DST's weights.
func gpuTolerance(precision string, roundedFold bool) float64 {
	n := judge.GPUF32
	switch precision {
	case gpurun.PrecisionBF16:
		n = judge.GPUBF16
	case gpurun.PrecisionFP8:
		n = judge.GPUW8A8
	}
	return judge.Lookup(judge.GPUFusedVsGPUUnfused).Tolerance(judge.Situation{Numerics: n, RoundedFold: roundedFold}).MaxRelL2
}
