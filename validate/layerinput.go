// A layer's inputs: the golden's tokens or drawn ones, and a hash-routed layer's token ids.

package validate

import (
	"fmt"
	"math/rand/v2"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// XDraw documents how token vectors are made when no golden provides them.
const XDraw = "x[t,h] ~ N(0,1) from PCG(seed, layer index) (math/rand/v2 NormFloat64), rounded to nearest-even bf16 so bf16 and fp32 engines see the same input"

// DrawX returns the token vectors for one layer: t x h standard normal
// values (unit variance, the scale of a post-RMSNorm hidden state) from a PCG
// stream seeded by (seed, layer), each rounded to the nearest bf16 so that a
// bf16 engine sees exactly the same x. Both paths get the same x.
func DrawX(seed uint64, layer, t, h int) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(layer)))
	x := make([]float32, t*h)
	for i := range x {
		x[i] = numfmt.RoundBF16(float32(r.NormFloat64()))
	}
	return x
}

// layerStart is how both loops start a layer: its tokens x [T,H] (the
// golden's, or drawn), h = H, the golden if any, a hash-routed layer's
// token ids and the forced coverage tokens (nil without).
func (s *session) layerStart(tg target) (x []float32, t, h int, g *Golden, tokens []int32, cov *moelayer.Coverage, err error) {
	if x, t, g, err = s.layerInput(tg); err != nil {
		return nil, 0, 0, nil, nil, nil, err
	}
	if tokens, err = s.layerTokens(tg, t, g); err != nil {
		return nil, 0, 0, nil, nil, nil, err
	}
	h = len(x) / t
	hb := h // the bank's width: a latent MoE's forced rows are its latent
	if p := s.dstPlanOrSrc(); p.Latent != nil {
		hb = p.HiddenSize
	}
	if cov, err = s.coverageFor(tg, hb); err != nil {
		return nil, 0, 0, nil, nil, nil, err
	}
	return x, t, h, g, tokens, cov, nil
}

// layerInput returns a layer's tokens x [T,H]: the golden's, or drawn.
func (s *session) layerInput(tg target) (x []float32, t int, g *Golden, err error) {
	// Both the CPU and the GPU loop start each layer here, in run order:
	// the byte progress learns which layer is being checked.
	s.meter.startLayer(tg.index)
	h := s.dstPlanOrSrc().ModelHidden()
	if tg.golden != "" {
		if g, err = ReadGolden(tg.golden, h); err != nil {
			return nil, 0, nil, err
		}
		if tg.bank != family.NoBank {
			if g, err = g.ForBank(tg.bank, tg.label()); err != nil {
				return nil, 0, nil, err
			}
		}
		return g.X, g.T, g, nil
	}
	return DrawX(s.o.Seed, tg.index, s.o.Tokens, h), s.o.Tokens, nil, nil
}

// layerTokens returns the token ids of a hash-routed layer's inputs (nil
// for a routed layer): the golden's input_ids, or drawn over the table's
// vocabulary. SRC and DST must agree on which layers are hash-routed.
func (s *session) layerTokens(tg target, t int, g *Golden) ([]int32, error) {
	var table string
	var src tensorload.TensorSource
	if tg.src != nil && tg.src.HashTable != "" {
		table, src = tg.src.HashTable, s.src
	}
	if tg.fused != nil && tg.fused.HashTable != "" {
		table, src = tg.fused.HashTable, s.dst
	}
	if tg.src != nil && tg.fused != nil && (tg.src.HashTable == "") != (tg.fused.HashTable == "") {
		return nil, fmt.Errorf("layer %d: hash-routed in only one of %s and %s", tg.index, s.o.Src, s.o.Dst)
	}
	if table == "" {
		return nil, nil
	}
	if g != nil {
		if g.InputIDs == nil {
			return nil, fmt.Errorf("%s: layer %d routes by token id (%s) and the golden has no input_ids", g.Path, tg.index, table)
		}
		// Ids past the table are the golden's fault (another model's
		// vocabulary), not the table's: checked here, against the table
		// of the model the golden is the reference for (SRC's where
		// given), before a path looks them up and names the checkpoint.
		if tg.src != nil && tg.src.HashTable != "" {
			table, src = tg.src.HashTable, s.src
		}
		vocab, err := moelayer.HashVocab(src, table, s.dstPlanOrSrc().TopK)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", tg.index, err)
		}
		for i, id := range g.InputIDs {
			if int(id) >= vocab {
				return nil, fmt.Errorf("%s: tensor input_ids: token %d has id %d, past the %d rows of layer %s's hash routing table %s: a golden of another vocabulary",
					g.Path, i, id, vocab, tg.label(), table)
			}
		}
		return g.InputIDs, nil
	}
	vocab, err := moelayer.HashVocab(src, table, s.dstPlanOrSrc().TopK)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", tg.index, err)
	}
	return moelayer.DrawTokens(s.o.Seed, tg.index, t, vocab), nil
}
