package family

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/quantdesc"
)

// ErrAlreadyConverted marks a checkpoint that is already moeprep (or other
// stacked-expert) output. Callers that only need the non-expert parts can
// test for it with errors.Is and use PlanConverted instead.
var ErrAlreadyConverted = errors.New("already converted")

func errConvertedConfig() error {
	return fmt.Errorf("%w by moeprep (config.json has a moeprep section); use the original checkpoint", ErrAlreadyConverted)
}

// plan is the one planner every family runs. converted plans a checkpoint
// whose experts are already stacked: routers, biases, shared experts and
// layer selection are planned and checked, Experts stays nil.
func (s *spec) plan(raw map[string]any, t Tensors, converted bool) (*Plan, error) {
	if raw == nil {
		return nil, errors.New("config.json: no configuration")
	}
	if t == nil {
		return nil, errors.New("no tensors to plan from")
	}
	if len(s.names.layersAlt) > 0 {
		in := *s
		in.names.layers = s.layerPrefix(t)
		s = &in
	}
	c := config{m: raw}
	mt, err := c.str("model_type", "")
	if err != nil {
		return nil, err
	}
	if mt == "" {
		return nil, c.missing("model_type")
	}
	if !slices.Contains(s.types(), mt) {
		return nil, fmt.Errorf("config.json: model_type %q is not handled by family %s (it handles %s)",
			mt, s.name, strings.Join(s.types(), ", "))
	}
	if !converted && c.has("moeprep") {
		return nil, errConvertedConfig()
	}
	c = s.withDefaults(raw, mt)
	if s.lift != nil {
		if c, err = s.lift(c); err != nil {
			return nil, err
		}
	}
	p := &Plan{Family: s.name, ModelType: mt, Scoring: moe.Softmax, TopKMethod: moe.TopKGreedy,
		NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 1, ModuleOutput: s.moduleOutput,
		Transformers: s.transformers}
	if err := s.readSizes(c, p, converted); err != nil {
		return nil, err
	}
	if s.refuse != nil {
		if err := s.refuse(c); err != nil {
			return nil, err
		}
	}
	if err := s.routing(c, mt, p); err != nil {
		return nil, err
	}
	if err := checkRouting(p); err != nil {
		return nil, err
	}
	if s.textLayers != "" {
		// The wrapper completes it (wrapper.plan).
		p.Wrapper = &Wrapper{Layers: s.textLayers}
	}
	if err := refuseQuant(raw, t, p.textLayers()); err != nil {
		return nil, err
	}
	if p.Quantization, p.ScaleFmt, err = readQuant(c); err != nil {
		return nil, err
	}
	readQuantDetails(c, p)
	if err := readExpertFP4(c, p); err != nil {
		return nil, err
	}
	// ModelOpt may describe NVFP4 (or MXFP8) in hf_quant_config.json alone; beside
	// another format in config.json it is refused as before.
	if hq, err := readHF(t); err != nil {
		return nil, err
	} else if hq != QuantNone && p.Quantization == QuantNone {
		p.Quantization = hq // NVFP4 or MXFP8
	} else if hq != QuantNone && p.Quantization != hq {
		descs, err := detectQuant(raw, t, p.textLayers())
		if err != nil {
			return nil, err
		}
		return nil, quantdesc.Conflicting(descs)
	}
	if p.Quantization == QuantMXFP4 && p.Naming == "" && s.name != "gpt_oss" {
		return nil, fmt.Errorf("config.json: quantization_config: quant_method mxfp4 is carried for gpt-oss (experts stacked on disk as *_blocks and *_scales) only, not %s", p.ModelType)
	}
	if p.Quantization == QuantInt4Pack {
		if p.GroupSize, err = quantdesc.Int4Group(c.j()); err != nil {
			return nil, err
		}
	}
	if err := checkQuantGroups(raw, t, p); err != nil {
		return nil, err
	}
	isMoE, err := s.layers.moe(c, s.keys, p)
	if err != nil {
		return nil, err
	}

	names := t.Names()
	st := storages{routed: s.names.storage(), shared: s.names.sharedStorage()}
	if _, perExp := st.routed.(perExpert); perExp && !converted {
		if err := s.refuseStacked(names); err != nil {
			return nil, err
		}
	}
	byLayer := s.groupByLayer(names)
	var moe []int
	for l := 0; l < p.NumHiddenLayers; l++ {
		if isMoE(l) {
			moe = append(moe, l)
		}
	}
	if len(moe) == 0 {
		return nil, fmt.Errorf("config.json: none of the %d layers is a MoE layer", p.NumHiddenLayers)
	}
	module := s.pickModule(t, moe[0])
	if err := s.refuseDenseExperts(p, byLayer, module, isMoE); err != nil {
		return nil, err
	}
	mtp, err := s.mtpLayers(c, p, byLayer, module)
	if err != nil {
		return nil, err
	}
	if err := s.checkLayersPresent(p, moe, byLayer); err != nil {
		return nil, err
	}
	// Every expert of every MoE layer is planned (names, views): bounded in
	// all, since a sparse file can back stacked experts of any count.
	if slots := (len(moe) + len(mtp)) * (p.NumExperts + p.NumSharedExperts); slots > maxExpertSlots {
		return nil, fmt.Errorf("config.json: %d MoE layers of %d routed and %d shared experts are %d experts to plan, over the limit of %d (released models have about 25,000)",
			len(moe)+len(mtp), p.NumExperts, p.NumSharedExperts, slots, maxExpertSlots)
	}

	k := &checker{t: t, p: p}
	if s.keys.sharedBias != "" {
		if k.sharedBias, err = c.boolean(s.keys.sharedBias, false); err != nil {
			return nil, err
		}
	}
	if s.keys.biasIf != "" {
		has, err := c.boolean(s.keys.biasIf, true)
		if err != nil {
			return nil, err
		}
		k.noBias = !has
	}
	if s.names.hashTable != "" {
		if k.hash, err = hashLayers(c, p.NumHiddenLayers); err != nil {
			return nil, err
		}
	}
	for _, l := range append(moe, mtp...) {
		layer, err := s.layer(k, st, l, l >= p.NumHiddenLayers, module, byLayer[l], converted)
		if err != nil {
			return nil, err
		}
		p.Layers = append(p.Layers, layer)
	}
	p.WeightDType = k.dtype
	if p.Quantization == QuantNVFP4 && !converted {
		if err := checkMixedCovers(raw, t, p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// checkLayersPresent refuses a config.json that places MoE layers past the
// last layer the checkpoint holds any tensor of: a truncated checkpoint, or
// the config of a deeper model. Every decoder layer has tensors (norms,
// attention) under its prefix, so a missing layer at the end is a
// num_hidden_layers the tensors do not bear out; a layer missing in the
// middle is left to the layer's own checks, which name the tensor.
func (s *spec) checkLayersPresent(p *Plan, moe []int, byLayer map[int][]string) error {
	last := -1
	for l := range byLayer {
		if l < p.NumHiddenLayers {
			last = max(last, l)
		}
	}
	if len(moe) == 0 || moe[len(moe)-1] <= last {
		return nil
	}
	first, which := last+1, fmt.Sprintf("layer %d", last+1)
	if first < p.NumHiddenLayers-1 {
		which = fmt.Sprintf("layers %d to %d", first, p.NumHiddenLayers-1)
	}
	return fmt.Errorf("config.json: num_hidden_layers=%d, but the checkpoint holds no tensor of %s (none named %s%d.*): truncated, or the config.json of another model",
		p.NumHiddenLayers, which, s.names.layers, first)
}

// storages are a family's on-disk expert storages, picked once per plan
// from its naming.
type storages struct {
	routed expertStorage
	shared sharedStorage
}

// layer plans and checks one MoE layer; st says how its experts are stored.
func (s *spec) layer(k *checker, st storages, l int, mtp bool, module string, names []string, converted bool) (Layer, error) {
	p, n := k.p, s.names
	where := "layer " + strconv.Itoa(l)
	if mtp {
		where += " (MTP)"
	}
	prefix := s.modulePrefix(l, module)
	out := Layer{Index: l, MTP: mtp, Prefix: prefix, Router: prefix + "." + n.router + ".weight"}
	if err := s.routerTensors(k, where, l, &out); err != nil {
		return Layer{}, err
	}
	// The post norm is named where the checkpoint holds it: nothing moeprep
	// writes needs it (it is carried), only a golden taken after it.
	if pn := n.layers + strconv.Itoa(l) + "." + n.postNorm; n.postNorm != "" && hasTensor(k.t, pn) {
		if err := k.small(where, "post norm", pn, []int64{int64(p.HiddenSize)}, "(the RMSNorm the MoE module applies to its output)"); err != nil {
			return Layer{}, err
		}
		out.PostNorm = pn
	}
	if !converted {
		var err error
		if out.Experts, err = st.routed.experts(k, where, prefix, names); err != nil {
			return Layer{}, err
		}
	}
	sp := prefix + "." + n.shared
	if n.sharedAtLayer {
		sp = n.layers + strconv.Itoa(l) + "." + n.shared
	}
	present := st.shared.present(k, sp)
	if p.NumSharedExperts == 0 {
		if present {
			return Layer{}, fmt.Errorf("%s: holds shared expert tensors under %s but config.json gives no shared experts", where, sp)
		}
		return out, nil
	}
	if converted && !present {
		return out, nil // fused into the stacked experts by fuse-shared
	}
	if err := st.shared.plan(k, where, sp, &out); err != nil {
		return Layer{}, err
	}
	if out.Shared != nil && p.SharedGated {
		out.SharedGate = prefix + "." + n.sharedGate + ".weight"
		if err := k.sharedGate(where, out.SharedGate); err != nil {
			return Layer{}, err
		}
	}
	return out, nil
}

// routerTensors checks layer l's routing tensors beyond the router and names
// them in out: the router's logit bias, the per-expert and input scales, the
// hash table and the correction bias, where the family has them.
func (s *spec) routerTensors(k *checker, where string, l int, out *Layer) error {
	p, n, prefix := k.p, s.names, out.Prefix
	if err := k.router(where, out.Router); err != nil {
		return err
	}
	if n.routerLogitBias != "" {
		out.RouterLogitBias = prefix + "." + n.routerLogitBias
		if err := k.small(where, "router bias", out.RouterLogitBias, []int64{int64(p.NumExperts)}, fmt.Sprintf("(E=%d)", p.NumExperts)); err != nil {
			return err
		}
	}
	for _, v := range []struct {
		rel, role string
		dst       *string
		size      int
	}{{n.expertScale, "per-expert scale", &out.ExpertScale, p.NumExperts},
		{n.routerInputScale, "router input scale", &out.RouterInputScale, p.HiddenSize},
		{n.expertInputNorm, "experts' input norm", &out.ExpertInputNorm, p.HiddenSize}} {
		if v.rel == "" {
			continue
		}
		*v.dst = prefix + "." + v.rel
		if err := k.small(where, v.role, *v.dst, []int64{int64(v.size)}, ""); err != nil {
			return err
		}
	}
	if err := k.latent(where, prefix, n.latent, out); err != nil {
		return err
	}
	if n.routerScale != "" {
		out.RouterScale = prefix + "." + n.routerScale
		if err := k.small(where, "router scale", out.RouterScale, []int64{1}, "(a scalar the routing weights are multiplied by)"); err != nil {
			return err
		}
	}
	hashed := k.hash != nil && k.hash(l)
	if n.hashTable != "" {
		table := prefix + "." + n.hashTable
		_, present := k.t.Lookup(table)
		switch {
		case hashed:
			out.HashTable = table
			if err := k.hashTable(where, table); err != nil {
				return err
			}
		case present:
			return fmt.Errorf("%s: holds a hash routing table %s but config.json (mlp_layer_types) routes it by top-k", where, table)
		}
	}
	if n.bias != "" && k.noBias {
		if _, present := k.t.Lookup(prefix + "." + n.bias); present {
			return fmt.Errorf("%s: holds a correction bias %s.%s but config.json says %s=false", where, prefix, n.bias, s.keys.biasIf)
		}
	} else if n.bias != "" && !hashed && (p.Scoring.PerExpert() || s.softmaxBias) {
		out.RouterBias = prefix + "." + n.bias
		if err := k.bias(where, out.RouterBias, s.biasRow); err != nil {
			return err
		}
	}
	return nil
}

// parseIndex reads a layer or expert index: decimal digits, no sign, no
// leading zeros, so that each index has exactly one spelling.
func parseIndex(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// layerPrefix is the family's decoder layer prefix that t's tensors use:
// names.layers, or else the first of names.layersAlt a tensor name starts
// with (names.layers when none does: the plan then names what is missing).
func (s *spec) layerPrefix(t Tensors) string {
	names := t.Names()
	for _, pre := range append([]string{s.names.layers}, s.names.layersAlt...) {
		for _, n := range names {
			if strings.HasPrefix(n, pre) {
				return pre
			}
		}
	}
	return s.names.layers
}

// groupByLayer buckets tensor names by decoder layer index.
func (s *spec) groupByLayer(names []string) map[int][]string {
	out := map[int][]string{}
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, s.names.layers)
		if !ok {
			continue
		}
		seg, _, _ := strings.Cut(rest, ".")
		if l, ok := parseIndex(seg); ok {
			out[l] = append(out[l], name)
		}
	}
	return out
}

// refuseStacked rejects expert tensors that are not per-expert: a stacked or
// fused bank (experts.all_gate.weight, experts.gate_up_proj) means some
// converter already ran, and stacking it again would be wrong.
func (s *spec) refuseStacked(names []string) error {
	marker := "." + s.names.experts + "."
	for _, name := range names {
		i := strings.Index(name, marker)
		if i < 0 || s.names.biasInExperts(name) {
			continue
		}
		seg, _, _ := strings.Cut(name[i+len(marker):], ".")
		if _, ok := parseIndex(seg); !ok {
			return fmt.Errorf("%w: tensor %s holds stacked experts (moeprep or another converter's layout); use the original per-expert checkpoint",
				ErrAlreadyConverted, name)
		}
	}
	return nil
}

// modulePrefix is layer l's MoE module: the decoder layer itself where
// module is "" (Gemma 4).
func (s *spec) modulePrefix(l int, module string) string {
	if module == "" {
		return s.names.layers + strconv.Itoa(l)
	}
	return s.names.layers + strconv.Itoa(l) + "." + module
}

// pickModule chooses the MoE module name by the first MoE layer's router.
func (s *spec) pickModule(t Tensors, l int) string {
	for _, m := range s.names.modules {
		if _, ok := t.Lookup(s.modulePrefix(l, m) + "." + s.names.router + ".weight"); ok {
			return m
		}
	}
	return s.names.modules[0]
}

// moeTensor returns the first of names that belongs to the MoE module of
// layer l (an expert or the router), or "".
func (s *spec) moeTensor(l int, module string, names []string) string {
	prefix := s.modulePrefix(l, module) + "."
	router := prefix + s.names.router + ".weight"
	for _, name := range names {
		if name == router || strings.HasPrefix(name, prefix+s.names.experts+".") {
			return name
		}
	}
	return ""
}

// refuseDenseExperts rejects a layer the config calls dense that holds experts:
// the config and the weights disagree, and either reading could be wrong.
func (s *spec) refuseDenseExperts(p *Plan, byLayer map[int][]string, module string, isMoE func(int) bool) error {
	for _, l := range sortedKeys(byLayer) {
		if l >= p.NumHiddenLayers || isMoE(l) {
			continue
		}
		if name := s.moeTensor(l, module, byLayer[l]); name != "" {
			return fmt.Errorf("layer %d: dense by config.json but holds MoE tensor %s", l, name)
		}
	}
	return nil
}

// mtpLayers finds the layers past num_hidden_layers that hold MoE tensors:
// DeepSeek-V3's multi-token-prediction layers (model.layers.61). Other
// families have none, so such a layer there is an error.
func (s *spec) mtpLayers(c config, p *Plan, byLayer map[int][]string, module string) ([]int, error) {
	limit, bounded := 0, false
	if s.keys.mtpCount != "" && c.has(s.keys.mtpCount) {
		var err error
		if limit, err = c.count(s.keys.mtpCount, 0); err != nil {
			return nil, err
		}
		bounded = true
	}
	var out []int
	for _, l := range sortedKeys(byLayer) {
		if l < p.NumHiddenLayers {
			continue
		}
		name := s.moeTensor(l, module, byLayer[l])
		if name == "" {
			continue
		}
		if !s.mtp {
			return nil, fmt.Errorf("layer %d: beyond num_hidden_layers=%d but holds MoE tensor %s", l, p.NumHiddenLayers, name)
		}
		if bounded && l-p.NumHiddenLayers >= limit {
			return nil, fmt.Errorf("layer %d (MTP): holds MoE tensor %s but config.json %s=%d", l, name, s.keys.mtpCount, limit)
		}
		out = append(out, l)
	}
	return out, nil
}

func sortedKeys(m map[int][]string) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
