// Whether DST was converted from SRC: routing, sizes and every layer's activations.

package validate

import (
	"fmt"
)

// sameModel checks that DST was converted from SRC: same routing and sizes.
func (s *session) sameModel() error {
	a, b := s.srcPlan.RouteSpec(), s.dstPlan.RouteSpec()
	if a != b {
		return fmt.Errorf("%s: routing differs from SRC %s's (%s): DST was not converted from SRC", s.o.Dst, s.o.Src, fieldDiff(b, a))
	}
	if s.srcPlan.HiddenSize != s.dstPlan.HiddenSize || s.srcPlan.MoEIntermediateSize != s.dstPlan.MoEIntermediateSize {
		return fmt.Errorf("%s: H %d I %d, SRC has H %d I %d", s.o.Dst, s.dstPlan.HiddenSize, s.dstPlan.MoEIntermediateSize, s.srcPlan.HiddenSize, s.srcPlan.MoEIntermediateSize)
	}
	if s.contract.NumExperts != s.srcPlan.NumExperts || s.contract.RoutedScalingFactor != s.srcPlan.RoutedScalingFactor {
		return fmt.Errorf("%s: contract has %d experts, rsf %v; SRC has %d, rsf %v", s.o.Dst, s.contract.NumExperts, s.contract.RoutedScalingFactor, s.srcPlan.NumExperts, s.srcPlan.RoutedScalingFactor)
	}
	if s.contract.ExpertBias != s.srcPlan.ExpertBias || s.contract.Act() != s.srcPlan.Act {
		return fmt.Errorf("%s: contract has expert_bias %v, activation %s; SRC's family (%s) has %v, %s", s.o.Dst, s.contract.ExpertBias, jsonText(s.contract.Act()), s.srcPlan.ModelType, s.srcPlan.ExpertBias, jsonText(s.srcPlan.Act))
	}
	if err := s.checkLayerActs(); err != nil {
		return err
	}
	if s.contract.ZeroExperts != s.srcPlan.ZeroExperts {
		return fmt.Errorf("%s: contract has zero_experts %d, SRC's config gives %d", s.o.Dst, s.contract.ZeroExperts, s.srcPlan.ZeroExperts)
	}
	if s.contract.RoutedInputScaled != s.srcPlan.RoutedInputScaled {
		return fmt.Errorf("%s: contract has routed_input_scaled %v, SRC's family (%s) %v", s.o.Dst, s.contract.RoutedInputScaled, s.srcPlan.ModelType, s.srcPlan.RoutedInputScaled)
	}
	if s.contract.Output() != s.srcPlan.Output() {
		return fmt.Errorf("%s: contract has output_scale %v, SRC's config gives %v", s.o.Dst, s.contract.Output(), s.srcPlan.Output())
	}
	return nil
}

// checkLayerActs: every layer's routed and (unfused) shared activation in
// the contract is SRC's family's (Step-3.7's per-layer limits, HY-V4's
// plain shared MLP).
func (s *session) checkLayerActs() error {
	for _, li := range s.contract.Layers {
		for _, l := range s.srcPlan.Layers {
			if l.Key() != li.Index { // the contract writes Layer.Key
				continue
			}
			if a, w := s.contract.RoutedAct(li), s.srcPlan.RoutedAct(l); a != w {
				return fmt.Errorf("%s: layer %d: contract has activation %s; SRC's family (%s) has %s", s.o.Dst, li.Index, jsonText(a), s.srcPlan.ModelType, jsonText(w))
			}
			if l.Shared == nil || s.contract.NumFusedSharedExperts > 0 {
				continue
			}
			if a, w := s.contract.SharedAct(li), s.srcPlan.SharedActOf(l); a != w {
				return fmt.Errorf("%s: layer %d: contract has shared_activation %s; SRC's family (%s) has %s", s.o.Dst, li.Index, jsonText(a), s.srcPlan.ModelType, jsonText(w))
			}
		}
	}
	return nil
}
