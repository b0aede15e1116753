package family

import "github.com/moeprep/moeprep/moe"

// Routing rules shared by several families; each family file names its own.

// biasedSigmoid is a DeepSeek-V3-style router without the choice of scoring:
// s = sigmoid(logit), top-k of s + correction bias (by group when grouped,
// noaux_tc), weights s[ids], normalised to sum 1 (+1e-20) when normKey is
// true in the config (always when normKey is ""), times the scaling factor
// under rsfKey ("" : none).
func biasedSigmoid(rsfKey string, grouped bool, normKey string) func(config, string, *Plan) error {
	return func(c config, _ string, p *Plan) error {
		p.Scoring, p.TopKMethod = moe.Sigmoid, moe.TopKNoAuxTC
		var err error
		if grouped {
			if err = readGroups(c, p); err != nil {
				return err
			}
		}
		p.NormTopKProb = true
		if normKey != "" {
			if p.NormTopKProb, err = c.boolean(normKey, true); err != nil {
				return err
			}
		}
		if rsfKey != "" {
			p.RoutedScalingFactor, err = c.float(rsfKey, 1)
		}
		return err
	}
}

// readGroups reads n_group and topk_group, the groups a grouped top-k
// ranks and the number of them it keeps.
func readGroups(c config, p *Plan) (err error) {
	if p.NGroup, err = c.size("n_group"); err != nil {
		return err
	}
	p.TopKGroup, err = c.size("topk_group")
	return err
}

// readRenorm reads norm_topk_prob (norm when the config has none) and
// routed_scaling_factor (1 when it has none).
func readRenorm(c config, p *Plan, norm bool) (err error) {
	if p.NormTopKProb, err = c.boolean("norm_topk_prob", norm); err != nil {
		return err
	}
	p.RoutedScalingFactor, err = c.float("routed_scaling_factor", 1)
	return err
}

// softmaxNorm is softmax top-k with the renormalisation fixed: Jamba never
// renormalises, ERNIE 4.5 always does (its clamp at 1e-12 never binds on a
// sum of probabilities).
func softmaxNorm(norm bool) func(config, string, *Plan) error {
	return func(_ config, _ string, p *Plan) error {
		p.Scoring, p.NormTopKProb = moe.Softmax, norm
		return nil
	}
}
