package convert

import (
	"fmt"
	"math"
	"path"
	"strings"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// part is one region of a source tensor, optionally folded on the way out,
// or (dq) a quantised weight dequantised on the way out.
type part struct {
	region
	dtype  safetensors.DType
	fold   bool
	factor float64
	stats  *foldStats
	dq     *dequant // nil: the region's bytes (folded or not)
	// inOut: the region holds its matrix already transposed, [in, out]
	// (a Llama 4 or gpt-oss expert as stored, checkpoint.Untransposed),
	// for --orientation in-out.
	inOut bool
}

// size is the bytes the part puts in the output: its region's, or its
// dequantised values'.
func (p part) size() int64 {
	if p.dq != nil {
		return p.dq.size()
	}
	return p.region.size()
}

// transformed reports whether the part's output bytes are computed from
// its source bytes (folded or dequantised), not copied.
func (p part) transformed() bool { return p.fold || p.dq != nil }

// outTensor is one output tensor: the concatenation of its parts.
type outTensor struct {
	name  string
	dtype safetensors.DType
	shape []int64
	parts []part
	size  int64
}

// entry describes the tensor for its shard's header (the shard writer reads
// the parts itself, so the entry has no Open).
func (t *outTensor) entry() safetensors.Entry {
	return safetensors.Entry{Name: t.name, DType: t.dtype, Shape: t.shape}
}

// shardPlan is one output file, header included.
type shardPlan struct {
	name    string
	tensors []*outTensor
	header  []byte
	size    int64      // whole file
	bands   *bandCache // the band of in-out parts read last (transpose.go); nil: none
}

func (s *shardPlan) entries() []safetensors.Entry {
	out := make([]safetensors.Entry, len(s.tensors))
	for i, t := range s.tensors {
		out[i] = t.entry()
	}
	return out
}

// outPlan is the whole output, planned before any byte is written.
type outPlan struct {
	tensors   []*outTensor
	shards    []*shardPlan
	dataBytes int64 // sum of tensor sizes (the index's total_size)
	contract  *layout.Contract
	stats     *foldStats
	// ranks: the experts are written per rank (ranks.go), their stacks
	// rankTensors in ranks.shards, which shards also lists after the
	// shared files; nil: one bank.
	ranks       *rankPlan
	rankTensors []*outTensor
}

// shardMetadata is the safetensors header metadata of every output shard.
var shardMetadata = map[string]string{"format": "pt"}

// planner builds an outPlan from an opened checkpoint and its family plan.
type planner struct {
	ck *checkpoint.Checkpoint
	fp *family.Plan
	o  *Options
	wf weightfmt.Format // how the expert weights are stored
	// requant: the shared expert is quantised into wf (--requantize-shared);
	// virtual holds, by name, the tensors that requantisation computes
	// (checkpoint.Requantised), found beside the checkpoint's own (tensor).
	requant bool
	virtual map[string]*checkpoint.Tensor
	// out is how the stacks store them: wf, or with --dtype the plain
	// dtype they are dequantised into (dequant.go).
	out  weightfmt.Format
	fold foldChoice
	st   *foldStats
	dq   dequantCounts // with --dtype: what was dequantised
	// ranks: --ep's placement and every rank's stacks; nil without --ep.
	ranks *rankPlan
}

// foldChoice says which routed down tensors get multiplied by rsf: the
// weights, their scales, or none (weightfmt.FoldNowhere).
type foldChoice struct {
	into   weightfmt.FoldTarget
	factor float64
}

func (f foldChoice) any() bool { return f.into != weightfmt.FoldNowhere }

func mul(vals ...int64) (int64, bool) {
	r := int64(1)
	for _, v := range vals {
		if v < 0 || (v != 0 && r > math.MaxInt64/v) {
			return 0, false
		}
		r *= v
	}
	return r, true
}

// checkUngated refuses what ungated experts (Nemotron-H's: up and down
// only) cannot be written as: a gate-up layout has no gate rows to put
// beside the up rows. An expert whose gate is absent must be one the plan
// runs with an ungated activation, and the other way round.
func (p *planner) checkUngated() error {
	for _, l := range p.fp.Layers {
		act := p.fp.RoutedAct(l)
		for e, m := range l.Experts {
			if m.Ungated() != act.Ungated() {
				return fmt.Errorf("%s: layer %d expert %d: the plan names gate %q with activation %s, which disagree", p.ck.Dir, l.Key(), e, m.Weight(layout.ProjGate), act.Describe())
			}
		}
		if act.Ungated() && p.o.Layout.Fused() {
			return fmt.Errorf("%s: --layout %s: %s's experts are ungated (up and down projections only; activation %s), so there are no gate rows to fuse with the up rows; use --layout stacked (all_up, all_down)",
				p.ck.Dir, p.o.Layout, p.fp.ModelType, act.Describe())
		}
	}
	return nil
}

func buildPlan(ck *checkpoint.Checkpoint, fp *family.Plan, o *Options) (*outPlan, error) {
	p := &planner{ck: ck, fp: fp, o: o, st: &foldStats{}}
	var err error
	if p.wf, err = fp.Format(); err != nil {
		return nil, fmt.Errorf("%s/config.json: %w", ck.Dir, err)
	}
	if p.out, err = p.outFormat(); err != nil {
		return nil, err
	}
	if o.Orientation == layout.InOut && o.DType != "" {
		return nil, fmt.Errorf("%s: --orientation in-out with --dtype: writing dequantised experts transposed is not built; use one of them", ck.Dir)
	}
	if why := layout.TransposeRefusal(p.wf); o.Orientation == layout.InOut && why != "" {
		return nil, fmt.Errorf("%s: --orientation in-out: %s", ck.Dir, why)
	}
	if err := p.checkFusable(); err != nil {
		return nil, err
	}
	if err := p.checkUngated(); err != nil {
		return nil, err
	}
	if err := p.chooseFold(); err != nil {
		return nil, err
	}
	if o.EP > 0 {
		if p.ranks, err = p.planRanks(); err != nil {
			return nil, err
		}
	}
	consumed := map[string]int{} // source tensor -> index into fp.Layers
	stacks := make([][]*outTensor, len(fp.Layers))
	for li := range fp.Layers {
		if o.Layout == layout.AsStored {
			break // every expert tensor is copied as it is, with the rest
		}
		ts, names, err := p.layer(&fp.Layers[li])
		if err != nil {
			return nil, err
		}
		stacks[li] = ts
		for _, n := range names {
			consumed[checkpoint.BaseName(n)] = li // a view consumes the stacked tensor it is cut from
		}
	}
	other, dropped, err := p.otherWeights(consumed)
	if err != nil {
		return nil, err
	}
	op := &outPlan{stats: p.st}
	seen := map[string]bool{}
	emitted := make([]bool, len(fp.Layers))
	add := func(t *outTensor) error {
		if seen[t.name] {
			return fmt.Errorf("%s: output tensor %s would be written twice (does SRC already hold stacked experts?)", ck.Dir, t.name)
		}
		seen[t.name] = true
		op.tensors = append(op.tensors, t)
		return nil
	}
	for _, t := range ck.Tensors {
		if li, ok := consumed[t.Name]; ok {
			if !emitted[li] {
				emitted[li] = true
				for _, s := range stacks[li] {
					if err := add(s); err != nil {
						return nil, err
					}
				}
			}
			continue
		}
		if q, ok := other[t.Name]; ok {
			dt, err := p.dequantTensor(q)
			if err != nil {
				return nil, err
			}
			if err := add(dt); err != nil {
				return nil, err
			}
			continue
		}
		if dropped[t.Name] {
			continue
		}
		n := t.NumBytes()
		cp := &outTensor{name: t.Name, dtype: t.DType, shape: t.StoredShape(), size: n,
			parts: []part{{region: region{src: t.Data, file: t.File, tensor: t.Name, rows: 1, rowLen: n, stride: n}, dtype: t.DType}}}
		if err := add(cp); err != nil {
			return nil, err
		}
	}
	for _, t := range op.tensors {
		op.dataBytes += t.size
	}
	if err := op.shard(o.MaxShardSize); err != nil {
		return nil, err
	}
	if p.ranks != nil {
		op.ranks = p.ranks
		if err := op.shardRanks(p.ranks, o.MaxShardSize); err != nil {
			return nil, err
		}
	}
	for _, s := range op.shards {
		s.shareBands()
	}
	op.contract = p.contract()
	if p.ranks != nil {
		op.contract.ExpertParallel = p.ranks.record(fp)
	}
	return op, nil
}

func (p *planner) checkFusable() error {
	if !p.o.FuseShared {
		return nil
	}
	fp := p.fp
	if fp.SharedGated {
		return fmt.Errorf("%s: %s (model_type %s) gates its shared expert per token (shared_expert_gate): it cannot become extra experts with a constant slot weight; use moeprep convert instead", p.ck.Dir, fp.Family, fp.ModelType)
	}
	if fp.SharedRouted {
		return fmt.Errorf("%s: %s (model_type %s) weights each shared expert per token by its router row (in one normalisation with the routed experts): it cannot become extra experts with a constant slot weight; use moeprep convert instead", p.ck.Dir, fp.Family, fp.ModelType)
	}
	if fp.NumSharedExperts == 0 {
		return fmt.Errorf("%s: %s (model_type %s) has no shared expert, so there is nothing to fuse; use moeprep convert instead", p.ck.Dir, fp.Family, fp.ModelType)
	}
	if fp.Latent != nil {
		return fmt.Errorf("%s: %s (model_type %s) is a latent MoE: its shared experts run on the hidden state (%d wide) and its routed experts on routed_expert_down_proj's latent (%d wide), so they cannot be slots of one bank; use moeprep convert instead", p.ck.Dir, fp.Family, fp.ModelType, fp.Latent.Hidden, fp.HiddenSize)
	}
	if fp.SharedQuantization != "" && p.o.DType != "" {
		switch {
		case p.o.RequantizeShared:
			return fmt.Errorf("%s: --requantize-shared with --dtype %s: the routed experts are dequantised, so there is no quantised format to requantise the shared expert into; leave --requantize-shared out",
				p.ck.Dir, strings.ToLower(string(p.o.DType)))
		case fp.SharedQuantization != family.QuantNone:
			// quantised unlike the routed experts (DeepSeek-V4's FP8 beside
			// FP4): dequantised by its own format into the plain stacks
		case !p.sharedDequantMatches():
			return fmt.Errorf("%s: routed experts %s, shared expert %s, --dtype %s: fusing would round the shared expert to %s; use --dtype %s, or moeprep convert",
				p.ck.Dir, p.wf, fp.SharedWeightDType, strings.ToLower(string(p.o.DType)), p.o.DType, strings.ToLower(string(fp.SharedWeightDType)))
		}
	} else if err := p.checkRequant(); err != nil {
		return err
	}
	if fp.RoutedInputScaled {
		return fmt.Errorf("%s: %s (model_type %s) scales the routed experts' input by the routing weight, and a fused shared slot would need the unscaled input in the same grouped GEMM; use moeprep convert instead", p.ck.Dir, fp.Family, fp.ModelType)
	}
	for _, l := range fp.Layers {
		if l.Bank != family.NoBank {
			return fmt.Errorf("%s: %s (model_type %s) adds its shared MLP to the tokens of both routed banks of a layer (text and vision), whose experts differ in width, so it cannot become slots of one bank; use moeprep convert instead", p.ck.Dir, fp.Family, fp.ModelType)
		}
		if l.SharedGate != "" {
			return fmt.Errorf("%s: layer %d: shared expert is gated per token by %s: it cannot be fused with a constant slot weight; use moeprep convert instead", p.ck.Dir, l.Key(), l.SharedGate)
		}
		if l.Shared == nil {
			return fmt.Errorf("%s: layer %d has no shared expert to fuse", p.ck.Dir, l.Key())
		}
		if sa, ra := fp.SharedActOf(l), fp.RoutedAct(l); sa != ra {
			return fmt.Errorf("%s: layer %d: %s (model_type %s) runs its shared MLP with another activation (%s) than its routed experts (%s), and a fused bank applies one activation to every slot; use moeprep convert instead",
				p.ck.Dir, l.Key(), fp.Family, fp.ModelType, sa.Describe(), ra.Describe())
		}
		if l.Shared.Get(layout.ProjGate, layout.RoleBias) != "" {
			return fmt.Errorf("%s: layer %d: the shared expert has biases (%s) and the routed experts none, so its fused slots would need bias stacks of their own; use moeprep convert instead", p.ck.Dir, l.Key(), l.Shared.Get(layout.ProjGate, layout.RoleBias))
		}
	}
	if si, s := fp.SharedIntermediateSize, fp.NumSharedExperts*fp.MoEIntermediateSize; si != 0 && si != s {
		return fmt.Errorf("%s: the shared expert's intermediate size %d is not %d x the routed experts' %d, so it cannot be split into experts of the bank; use moeprep convert instead", p.ck.Dir, si, fp.NumSharedExperts, fp.MoEIntermediateSize)
	}
	if S, I, sf := int64(fp.NumSharedExperts), int64(fp.MoEIntermediateSize), p.sharedFormat(); S > 1 && !sliceable(sf, S, I, int64(fp.HiddenSize)) {
		sc, _ := sf.Scale()
		if p.requant {
			return fmt.Errorf("%s: --requantize-shared: n_shared_experts %d with moe_intermediate_size %d, not a multiple of the %s scale block %dx%d: the requantised shared expert's down_proj scale groups along its %d-wide input would straddle the %d slices, so it cannot be split exactly",
				p.ck.Dir, S, I, sf, sc.Block[0], sc.Block[1], S*I, S)
		}
		return fmt.Errorf("%s: n_shared_experts %d with moe_intermediate_size %d, not a multiple of the %s block %dx%d: the shared expert's scale blocks straddle the slices, so it cannot be split exactly", p.ck.Dir, S, I, sf, sc.Block[0], sc.Block[1])
	}
	return nil
}

// checkRequant decides whether fuse-shared requantises the shared expert:
// only where it is stored unlike the routed experts (SharedQuantization)
// and --requantize-shared asks, into a format that has a rule for it.
func (p *planner) checkRequant() error {
	fp := p.fp
	rf, _ := p.wf.Scale()
	switch {
	case fp.SharedQuantization == "" && p.o.RequantizeShared:
		return fmt.Errorf("%s: --requantize-shared: the shared expert is stored like the routed experts (%s, quantization %s), so there is nothing to requantise; leave the flag out",
			p.ck.Dir, p.wf, p.wf.Quantization())
	case fp.SharedQuantization == "":
		return nil
	case !p.o.RequantizeShared:
		return fmt.Errorf("%s: routed experts %s (%s, %s scales), shared expert %s: fusing would requantise the shared expert; pass --requantize-shared to quantise it by the %s format's own rule (recorded in the contract; validate reports the error it adds), or use moeprep convert instead",
			p.ck.Dir, p.wf, p.wf.Quantization(), rf.DType, fp.SharedWeightDType, p.wf)
	}
	if _, err := weightfmt.Requantisable(p.wf); err != nil {
		return fmt.Errorf("%s: --requantize-shared: shared expert %s, routed experts %s: %v; use moeprep convert instead", p.ck.Dir, fp.SharedWeightDType, p.wf, err)
	}
	p.requant = true
	return nil
}

// tensor finds a tensor of the checkpoint, or one the plan computes.
func (p *planner) tensor(name string) (*checkpoint.Tensor, bool) {
	if t, ok := p.virtual[name]; ok {
		return t, true
	}
	return p.ck.Tensor(name)
}

// requantMLP is the shared expert m quantised into the routed format: an
// MLP naming the computed tensors, which the planner then finds by name.
func (p *planner) requantMLP(m family.MLP) (family.MLP, error) {
	if p.virtual == nil {
		p.virtual = map[string]*checkpoint.Tensor{}
	}
	out, err := checkpoint.RequantisedMLP(p.ck, m, p.wf, func(t *checkpoint.Tensor) { p.virtual[t.Name] = t })
	if err != nil {
		return family.MLP{}, fmt.Errorf("%s: %w", p.ck.Dir, err)
	}
	return out, nil
}

// sliceable reports whether a shared expert of intermediate S*I in format
// f splits exactly into S experts of intermediate I: its gate and up rows
// and its down columns at every multiple of I.
func sliceable(f weightfmt.Format, S, I, H int64) bool {
	gate := weightfmt.Matrix{Format: f, Rows: S * I, Cols: H}
	down := weightfmt.Matrix{Format: f, Rows: H, Cols: S * I}
	for s := int64(1); s < S; s++ {
		if !gate.RowSplitExact(s*I) || !down.ColSplitExact(s*I) {
			return false
		}
	}
	return true
}

func (p *planner) chooseFold() error {
	fp := p.fp
	rsf := fp.RoutedScalingFactor
	if math.IsNaN(rsf) || math.IsInf(rsf, 0) || rsf <= 0 {
		return fmt.Errorf("%s/config.json: routed_scaling_factor %v: want a positive number", p.ck.Dir, rsf)
	}
	p.fold.factor = rsf
	if p.o.FoldScaling == layout.FoldNone || rsf == 1 {
		return nil
	}
	if p.o.DType != "" {
		// Dequantised weights are plain: auto folds none of those.
		if p.o.FoldScaling == layout.FoldDown {
			return fmt.Errorf("%s: --fold-scaling down with --dtype: folding routed_scaling_factor %v into dequantised weights is not built (it would need the fold inside the one rounding); use --fold-scaling auto or none", p.ck.Dir, rsf)
		}
		return nil
	}
	if fp.ExpertBias {
		return fmt.Errorf("%s: the experts have biases, and folding routed_scaling_factor %v would have to scale the down biases too, which moeprep does not do; use --fold-scaling none", p.ck.Dir, rsf)
	}
	rule := p.wf.Fold()
	// The format states its scales' dtype; a scale tensor of another
	// would be multiplied in a dtype the rule does not round to.
	sc, scaled := p.wf.Scale()
	scalesAsStated := true
	for _, l := range fp.Layers {
		for _, e := range l.Experts {
			if t, ok := p.ck.Tensor(e.Get(layout.ProjDown, layout.RoleScale)); ok && scaled && t.DType != sc.DType {
				scalesAsStated = false
			}
		}
	}
	switch {
	case rule.Into != weightfmt.FoldNowhere && rule.ByDefault && scalesAsStated:
		p.fold.into = rule.Into
	case p.o.FoldScaling == layout.FoldAuto:
		// auto folds only where it is exact: leave everything else unfolded.
	case rule.Into == weightfmt.FoldNowhere:
		return fmt.Errorf("%s: --fold-scaling down: %s; use --fold-scaling auto or none", p.ck.Dir, rule.Refusal(fmt.Sprintf("routed_scaling_factor %v", rsf)))
	case !scalesAsStated:
		return fmt.Errorf("%s: --fold-scaling down: the %s scales are not %s, so routed_scaling_factor cannot be folded into them; use --fold-scaling auto or none", p.ck.Dir, p.wf, sc.DType)
	default:
		p.fold.into = rule.Into
	}
	return nil
}

func (p *planner) contract() *layout.Contract {
	fp := p.fp
	c := &layout.Contract{
		Version:             layout.ContractVersion,
		Tool:                p.o.Tool,
		Layout:              p.o.Layout,
		SourceFormat:        p.ck.Format,
		Family:              fp.Family,
		NumExperts:          fp.NumExperts,
		SharedFirstID:       fp.NumExperts,
		RoutedScalingFactor: fp.RoutedScalingFactor,
		FoldMode:            p.o.FoldScaling,
		TP:                  p.o.TP,
		Manifest:            layout.ManifestFileName,
	}
	c.Quantization, c.WeightDType, c.WeightBlockSize, c.ScaleDType, c.Naming = layout.FormatFields(p.out)
	if p.o.FuseShared {
		c.SharedReplicas = p.o.Replicas
		c.SharedSlices = fp.NumSharedExperts
		c.NumFusedSharedExperts = c.SharedReplicas * c.SharedSlices
	}
	if p.o.Orientation == layout.InOut {
		c.Orientation = layout.InOut // out-in, the default, is left out
	}
	c.ExpertsModule = p.o.expertsModule
	c.RoutedInputScaled = fp.RoutedInputScaled
	c.ZeroExperts = fp.ZeroExperts
	c.ExpertBias = fp.ExpertBias
	if !fp.Act.SwiGLU() {
		act := fp.Act
		c.Activation = &act
	}
	if fp.SharedAct != nil && *fp.SharedAct != fp.Act && !p.o.FuseShared {
		act := *fp.SharedAct
		c.SharedActivation = &act
	}
	if s := fp.Output(); s != 1 {
		c.OutputScale = s
	}
	c.RoutedScalingFactorFolded = p.fold.any()
	c.SharedSlotWeight = 1
	if !c.RoutedScalingFactorFolded {
		c.SharedSlotWeight = 1 / fp.RoutedScalingFactor
	}
	c.InputScales = fp.NVFP4InputScale && p.o.DType == ""
	if fp.SharedQuantization != "" && !p.o.FuseShared && !p.sharedDequantMatches() && !p.sharedDequantised() {
		c.SharedQuantization, c.SharedWeightDType = string(fp.SharedQuantization), string(fp.SharedWeightDType)
		c.SharedScaleDType, c.SharedNaming = string(fp.SharedScaleDType), fp.SharedNaming
		c.SharedWeightBlockSize = fp.SharedBlock()
	}
	if p.requant {
		c.SharedRequantized, _ = layout.NewRequantization(p.wf, fp.SharedWeightDType) // checkRequant made sure it can
	}
	c.Dequantized = p.dequantRecord()
	for _, l := range fp.Layers {
		// The contract's index and bank are the layer's written forms
		// (family.Layer.Key: a second bank's index offset by 65536, as
		// contracts already converted carry it).
		li := layout.LayerInfo{Index: l.Key(), MTP: l.MTP, Prefix: l.Prefix, Bank: l.Bank.String()}
		// A layer's own activations, where they differ from the
		// contract-wide ones it would otherwise read (Step-3.7).
		if a := fp.RoutedAct(l); a != c.Act() {
			li.Activation = &a
		}
		if a := fp.SharedActOf(l); l.Shared != nil && !p.o.FuseShared && a != c.SharedAct(li) {
			li.SharedActivation = &a
		}
		c.Layers = append(c.Layers, li)
	}
	return c
}

// shard packs the tensors, in order, into files of at most max tensor
// bytes; a tensor bigger than max gets a file of its own.
func (op *outPlan) shard(max int64) error {
	ss, err := planShards(op.tensors, max, "")
	op.shards = append(op.shards, ss...)
	return err
}

// planShards packs ts, in order, into files of at most max tensor bytes
// named model-0000i-of-0000N.safetensors under dir ("": the top level).
func planShards(ts []*outTensor, max int64, dir string) ([]*shardPlan, error) {
	var groups [][]*outTensor
	var cur []*outTensor
	var curBytes int64
	for _, t := range ts {
		if len(cur) > 0 && curBytes+t.size > max {
			groups = append(groups, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, t)
		curBytes += t.size
	}
	if len(cur) > 0 || len(groups) == 0 {
		groups = append(groups, cur)
	}
	var out []*shardPlan
	for i, g := range groups {
		g = pageOrder(g)
		s := &shardPlan{name: path.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(groups))), tensors: g}
		var h []byte
		var err error
		if phase, ok := dataPhase(g); ok {
			h, err = safetensors.PlanHeaderAt(shardMetadata, s.entries(), phase, pageSize)
		} else {
			h, err = safetensors.PlanHeader(shardMetadata, s.entries())
		}
		if err != nil {
			return nil, fmt.Errorf("planning %s: %w", s.name, err)
		}
		s.header = h
		s.size = int64(len(h))
		for _, t := range g {
			s.size += t.size
		}
		out = append(out, s)
	}
	return out, nil
}
