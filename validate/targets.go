// The layers a run checks: SRC's and DST's MoE layers paired, selected by --layers, each with its
// golden.

package validate

import (
	"fmt"
	"path/filepath"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// target is one layer to check, on whichever sides exist.
type target struct {
	index int         // family.Layer.Key: the index the report writes
	layer int         // family.Layer.Index: the decoder layer
	bank  family.Bank // which of a decoder layer's two routed banks, NoBank if it has one
	mtp   bool
	src   *family.Layer
	dst   *family.Layer // DST's planned layer, beside fused (its carried tensors: a post norm)
	fused *moelayer.FusedLayer
	// stored is DST's layer where its experts are stored as SRC stores
	// them (layout as-stored): no stacks, so no fused layer.
	stored *family.Layer
	golden string // path, "" if none
}

// label names the target's layer for people (family.Layer.Label).
func (t target) label() string { return family.LayerLabel(t.layer, t.bank) }

// targets lists the layers to check, per the --layers spec.
func (s *session) targets() ([]target, []string, error) {
	byIndex := map[int]*target{}
	var order []int
	get := func(i int, mtp bool) *target {
		if t, ok := byIndex[i]; ok {
			return t
		}
		t := &target{index: i, mtp: mtp}
		byIndex[i] = t
		order = append(order, i)
		return t
	}
	if s.srcPlan != nil {
		for i := range s.srcPlan.Layers {
			l := &s.srcPlan.Layers[i]
			t := get(l.Key(), l.MTP)
			t.src, t.layer, t.bank = l, l.Index, l.Bank
		}
	}
	if s.dstPlan != nil {
		info := map[int]layout.LayerInfo{}
		for _, li := range s.contract.Layers {
			info[li.Index] = li
		}
		for i := range s.dstPlan.Layers {
			l := &s.dstPlan.Layers[i]
			li, ok := info[l.Key()] // the contract's written index (Layer.Key)
			if !ok {
				return nil, nil, misfit(fmt.Errorf("%s: MoE layer %d is not in the moeprep contract", s.o.Dst, l.Key()))
			}
			if li.Prefix != l.Prefix {
				return nil, nil, misfit(fmt.Errorf("%s: layer %d: contract prefix %q, checkpoint has %q", s.o.Dst, l.Key(), li.Prefix, l.Prefix))
			}
			t := get(l.Key(), l.MTP)
			t.layer, t.bank, t.dst = l.Index, l.Bank, l
			if s.asStored() {
				t.stored = l
				continue
			}
			t.fused = &moelayer.FusedLayer{Index: l.Key(), Router: l.Router, RouterBias: l.RouterBias, RouterLogitBias: l.RouterLogitBias, HashTable: l.HashTable,
				Spec: s.dstPlan.RouteSpec(), Contract: s.contract, Names: s.contract.Names(li), Shared: l.Shared, SharedGate: l.SharedGate,
				SharedExperts: l.SharedExperts, RouterScale: l.RouterScale, ExpertScale: l.ExpertScale, Prep: moelayer.PrepOf(s.dstPlan, l), Info: li}
			if b, ok := s.contract.Biases(li); ok {
				t.fused.Biases = &b
			}
			lt, err := moelayer.LatentOf(s.dstPlan, l)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", s.o.Dst, err)
			}
			t.fused.Latent = lt
		}
		if len(s.contract.Layers) != len(s.dstPlan.Layers) {
			return nil, nil, misfit(fmt.Errorf("%s: the contract lists %d MoE layers, the checkpoint has %d", s.o.Dst, len(s.contract.Layers), len(s.dstPlan.Layers)))
		}
	}
	sortLayers(order)
	s.moeLayers = order
	if s.src != nil && s.dst != nil {
		for _, i := range order {
			if t := byIndex[i]; t.src == nil || (t.fused == nil && t.stored == nil) {
				return nil, nil, misfit(fmt.Errorf("layer %d is a MoE layer of only one of %s and %s", i, s.o.Src, s.o.Dst))
			}
			s.allLayers = append(s.allLayers, *byIndex[i])
		}
	}
	chosen, explicit, err := selectLayers(s.o.Layers, order)
	if err != nil {
		return nil, nil, err
	}
	var out []target
	var notes []string
	took := map[string]*Golden{} // a two-bank layer's golden, read once for both banks
	for _, i := range chosen {
		t := byIndex[i]
		if s.golden != "" {
			d := t.layer
			if p, ok := goldenPath(s.golden, d); ok {
				t.golden = p
				if t.bank != family.NoBank {
					g, ok := took[p]
					if !ok {
						if g, err = ReadGolden(p, s.dstPlanOrSrc().ModelHidden()); err != nil {
							return nil, nil, err
						}
						took[p] = g
					}
					if !g.TookBank(t.bank) {
						// A text prompt's golden leaves the vision bank
						// (and an image's the text bank) to the rest of
						// the run: with SRC, its drawn and forced tokens.
						t.golden = ""
						label := fmt.Sprintf("layer %d (%s bank)", d, t.bank)
						if s.src == nil || s.dst == nil {
							notes = append(notes, fmt.Sprintf("%s not checked: no token of its golden %s took it (token_type_ids; a golden without them is text throughout), and without SRC and DST nothing else checks it", label, p))
							continue
						}
						notes = append(notes, fmt.Sprintf("%s not checked against the golden: no token of %s took it (token_type_ids; a golden without them is text throughout); its drawn and forced tokens checked it against SRC", label, p))
						s.goldenUnchecked = append(s.goldenUnchecked, i)
					}
				}
			} else if explicit {
				return nil, nil, fmt.Errorf("%s: no golden for layer %s", filepath.Join(s.golden, GoldenFileName(d)), t.label())
			} else {
				notes = append(notes, fmt.Sprintf("layer %s has no golden in %s", t.label(), s.golden))
				if s.src == nil || s.dst == nil {
					continue
				}
				s.goldenUnchecked = append(s.goldenUnchecked, i)
			}
		}
		out = append(out, *t)
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("no layer to check (--layers %s)", s.o.Layers)
	}
	return out, notes, nil
}
