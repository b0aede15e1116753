package family

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/moe"
)

// A family is data: where its tensors live (naming), which config keys give
// which sizes (configKeys), which layers are MoE (layerRule), plus one small
// function for the routing rules that genuinely differ. The planner in
// plan_common.go does the rest the same way for every family.
type spec struct {
	name       string
	modelTypes []string // the config.json model_types it plans; nil: just name
	names      naming
	keys       configKeys
	layers     layerRule
	mtp        bool // layers >= num_hidden_layers that hold experts are MTP layers
	// textLayers is the wrapper's text layer prefix when the family plans
	// the text model inside a multimodal wrapper ("" otherwise): ignore
	// lists are resolved against the group names under it.
	textLayers string
	// defaults for keys a config.json may leave out (or set to null): the
	// values of transformers' configuration class, where it agrees with the
	// model's own remote code. Sizes and expert counts have none. A family of
	// several model types whose classes differ gives them per model type
	// (defaultsByType) instead.
	defaults       map[string]any
	defaultsByType map[string]map[string]any
	routing        func(c config, modelType string, p *Plan) error
	// lift, when set, rewrites config.json (defaults filled) into the keys
	// the planner reads: DBRX keeps its sizes under ffn_config and names
	// hidden_size and num_hidden_layers d_model and n_layers.
	lift func(c config) (config, error)
	// softmaxBias: the correction bias also steers softmax routing (ERNIE
	// 4.5: top-k of softmax + bias, weights from the unbiased softmax).
	softmaxBias bool
	// biasRow: the correction bias is stored [1, E] (ERNIE 4.5's
	// moe_statics), not [E].
	biasRow bool
	// refuse, when set, turns a config into the one-line reason this family
	// cannot be planned (an option moeprep cannot express).
	refuse func(c config) error
	// sharedUnfusable, when set, is why fuse-shared cannot append this
	// family's shared expert as constant-weight slots, beyond what the
	// naming says (a per-token shared gate, sharedGated).
	sharedUnfusable string
	// modalityBanks: each MoE layer holds a text and a vision routed bank
	// (ERNIE-4.5-VL), planned as a layer each (planBanks).
	modalityBanks bool
	// moduleOutput is what the module transformers calls the MoE block
	// returns (Plan.ModuleOutput); zero: the planned sum.
	moduleOutput ModuleOutput
	// aloneNames rewrites the naming of a text family planned only inside
	// its wrapper (wrapped_text.go) for the text model saved alone, where
	// transformers writes it otherwise than inside the wrapper (MiniMax-M3:
	// no conversion mapping for the text model, so its in-memory names);
	// nil: the same names.
	aloneNames func(*naming)
	// transformers is how transformers 5 holds the experts in memory
	// (Plan.Transformers); the zero value is gate-up, out-in.
	transformers TransformersForm
}

// withDefaults returns config.json with the model type's defaults filled in
// where a key is absent or null.
func (s *spec) withDefaults(raw map[string]any, modelType string) config {
	m := make(map[string]any, len(raw)+len(s.defaults)+len(s.defaultsByType[modelType]))
	for k, v := range s.defaults {
		m[k] = v
	}
	for k, v := range s.defaultsByType[modelType] {
		m[k] = v
	}
	for k, v := range raw {
		if v != nil {
			m[k] = v
		}
	}
	return config{m: m}
}

// naming is where a family keeps its MoE tensors. Full names are
// layers + index + "." + module + "." + (router | experts.<id>.<proj> | shared.<proj>) + ".weight".
type naming struct {
	layers string // decoder layer prefix, followed by the index: "model.layers."
	// layersAlt: the decoder layer prefixes of the family's other repo
	// layouts, tried in order where no tensor name starts with layers
	// (DeepSeek-V4's official repo: "layers.", no "model."). Everything
	// below the layer prefix is named alike in all of them.
	layersAlt []string
	// modules: the MoE module in a layer; the first whose router exists
	// wins. "" is the decoder layer itself (Gemma 4's router and experts).
	modules    []string
	experts    string    // container of routed experts, followed by ".<id>."
	proj       [3]string // gate, up, down projection of one expert (Mixtral: w1, w3, w2)
	router     string    // router module, relative to the MoE module ("gate", "router.gate")
	bias       string    // correction bias, relative to the MoE module ("gate.e_score_correction_bias", "expert_bias"); "" if none
	shared     string    // shared expert module; "" if none
	sharedGate string    // per-token shared-expert gate module; "" if none
	// stackedGateUp / stackedDown: where a family stores its experts stacked
	// on disk (Granite MoE), relative to the MoE module: [E, 2I, H] holding
	// each expert's gate rows then up rows, and [E, H, I]. Each expert is
	// planned as views of them (view.go), read in place by every command.
	stackedGateUp, stackedDown string
	// stackedProj: experts stacked on disk one tensor per projection
	// (Step-3.5/3.7's moe.gate_proj.weight, up_proj, down_proj): gate and
	// up [E, I, H], down [E, H, I], relative to the MoE module; each expert
	// is planned as views of them.
	stackedProj [3]string
	// stackedTransposed: the stacked tensors hold W transposed (Llama 4's
	// x @ W): gate-up [E, H, 2I], gate columns then up columns, and down
	// [E, I, H]; the views read them transposed.
	stackedTransposed bool
	// stackedEitherWay: the stacked tensors may be stored either way, as
	// stackedTransposed says or not (Qwen3-VL-MoE: the hub transposed,
	// transformers' own save untransposed); each layer's two shapes say
	// which (stackedOrientation).
	stackedEitherWay bool
	// stackedInterleaved: the gate-up rows (transposed: columns) alternate
	// gate, up, gate, up instead of all gate rows then all up: gpt-oss's
	// columns, Inkling's hub rows (and its shared sharedStackedGateUp's).
	stackedInterleaved bool
	// stackedGateUpBias [E, 2I] (laid out as the gate-up columns) and
	// stackedDownBias [E, H]: per-expert biases, relative to the MoE module.
	stackedGateUpBias, stackedDownBias string
	// routerLogitBias: the router's own bias, added to the logits
	// (gpt-oss's "router.bias"), relative to the MoE module.
	routerLogitBias string
	// hashTable: a hash-routed layer's token-to-experts table, relative to
	// the MoE module (DeepSeek-V4's "gate.tid2eid" [vocab, k] int64). Which
	// layers are hash-routed the layer rule says (hashOrMoE).
	hashTable string
	// flat: experts flattened on disk (DBRX's experts.mlp.w1, v1, w2),
	// relative to the MoE module: gate, up and down of every expert in one
	// [E*I, H] tensor each, expert e's rows e*I..(e+1)*I-1; the down
	// tensor's rows hold each expert's down projection transposed.
	flat [3]string
	// sharedGateUp / sharedDown: a shared MLP that stores gate and up rows
	// in one [2I, H] tensor, relative to the shared module.
	sharedGateUp, sharedDown string
	// sharedStacked: the shared module holds its S experts stacked, one
	// tensor per projection named proj without ".weight": gate and up
	// [S, I, H], down [S, H, I] (Inkling); each is planned as views.
	sharedStacked bool
	// sharedStackedGateUp / sharedStackedDown: the S shared experts stacked
	// with gate and up in one tensor [S, 2I, H] (rows interleaved where
	// stackedInterleaved says so) and down [S, H, I], relative to the shared
	// module (Inkling's hub layout: shared_w13_weight, shared_w2_weight);
	// each is planned as views.
	sharedStackedGateUp, sharedStackedDown string
	// routerScale: a scalar [1] multiplying the routing weights, relative
	// to the MoE module (Inkling's "gate.global_scale"), "" if none.
	routerScale string
	// expertScale [E], routerInputScale [H] and expertInputNorm [H]:
	// Layer.ExpertScale, RouterInputScale and ExpertInputNorm, relative to
	// the MoE module (Gemma 4's router.per_expert_scale, router.scale,
	// pre_feedforward_layernorm_2.weight), "" if none.
	expertScale, routerInputScale, expertInputNorm string
	// latent: a latent MoE's projections and norm around the routed
	// experts, relative to the MoE module, each followed by ".weight"
	// (Kimi K3's routed_expert_down_proj, routed_expert_norm,
	// routed_expert_up_proj); planned only where config.json makes the
	// plan latent (Plan.Latent).
	latent [3]string
	// sharedAtLayer: the shared module hangs off the decoder layer, not the
	// MoE module (Granite: model.layers.L.shared_mlp beside block_sparse_moe);
	// the layer's output is still routed + shared.
	sharedAtLayer bool
	// postNorm: the RMSNorm weight [H] the MoE module applies to its sum,
	// relative to the decoder layer (A.X-K1's "post_mlp_layernorm.weight",
	// which its checkpoints keep at the layer); "" if none.
	postNorm string
	// sharedProj: the shared expert's projections where they are named
	// otherwise than the routed experts' (Kimi-Linear and MiniMax-M3:
	// routed w1, w3, w2, shared gate_proj, up_proj, down_proj); zero: proj.
	sharedProj [3]string
}

// sharedProjections are the shared expert's projection names.
func (n naming) sharedProjections() [3]string {
	if n.sharedProj[0] != "" {
		return n.sharedProj
	}
	return n.proj
}

// storage is the on-disk storage of the family's routed experts, read from
// its naming: a family names at most one of the stacked layouts.
func (n naming) storage() expertStorage {
	switch {
	case n.stackedGateUp != "":
		return stackedGateUp{gateUp: n.stackedGateUp, down: n.stackedDown, gateUpBias: n.stackedGateUpBias, downBias: n.stackedDownBias,
			transposed: n.stackedTransposed, eitherWay: n.stackedEitherWay, interleaved: n.stackedInterleaved}
	case n.stackedProj[0] != "":
		return stackedPerProj{proj: n.stackedProj}
	case n.flat[0] != "":
		return flatExperts{proj: n.flat}
	}
	return perExpert{n: n}
}

// sharedStorage is the on-disk storage of the family's shared experts, read
// from its naming (the stacked layouts before the gate-up one before the
// per-projection one, where a naming sets more than one).
func (n naming) sharedStorage() sharedStorage {
	switch {
	case n.sharedStackedGateUp != "":
		return sharedStacked{n: n, first: n.sharedStackedGateUp}
	case n.sharedStacked:
		return sharedStacked{n: n, first: n.proj[0]}
	case n.sharedGateUp != "":
		return sharedGateUp{gateUp: n.sharedGateUp, down: n.sharedDown}
	}
	return sharedPerProj{named: n.shared != "", proj: n.sharedProjections()}
}

// biasInExperts says whether name is the family's correction bias kept
// under its experts container (Laguna's mlp.experts.e_score_correction_bias):
// a router tensor, not an expert's.
func (n naming) biasInExperts(name string) bool {
	return strings.HasPrefix(n.bias, n.experts+".") && strings.HasSuffix(name, "."+n.bias)
}

// hubProj are the hub's projection names of one SwiGLU MLP.
var hubProj = [3]string{"gate_proj", "up_proj", "down_proj"}

// hubLayoutNames is the layout transformers saves most MoE families in (its
// qwen2_moe conversion pattern): model.layers.L.<module> holding the router,
// experts.E.{gate,up,down}_proj and, where named, the correction bias and
// the shared expert, all relative to the module.
func hubLayoutNames(module, router, bias, shared string) naming {
	return naming{layers: "model.layers.", modules: []string{module}, experts: "experts",
		proj: hubProj, router: router, bias: bias, shared: shared}
}

// stackedHubNames is the hub's layout with the routed experts stacked on
// disk (Llama 4, Aria, Qwen3-VL-MoE, Mistral 4): model.layers.L.<module>
// holding the router, the stacks gateUp (gate, then up) and down, and the
// shared expert, where named, with the hub's projection names, all relative
// to the module. orient says how the stacks are held where not [E, 2I, H]
// and [E, H, I] (transposedStacks, eitherWayStacks).
func stackedHubNames(module, router, shared, gateUp, down string, orient ...func(*naming)) naming {
	n := naming{layers: "model.layers.", modules: []string{module}, proj: hubProj, router: router,
		shared: shared, stackedGateUp: gateUp, stackedDown: down}
	for _, o := range orient {
		o(&n)
	}
	return n
}

// transposedStacks: the stacks hold W transposed, [E, H, 2I] and [E, I, H].
func transposedStacks(n *naming) { n.stackedTransposed = true }

// eitherWayStacks: the stacks may be held either way; their shapes say which.
func eitherWayStacks(n *naming) { n.stackedEitherWay = true }

// mixtralNames is Mixtral's layout: model.layers.L.block_sparse_moe.{gate,
// experts.E.w1|w3|w2} (w1 gate, w3 up, w2 down), the module named "mlp" in
// transformers 5's own saves; bias is a correction bias on the module, if any.
func mixtralNames(bias string) naming {
	return naming{layers: "model.layers.", modules: []string{"block_sparse_moe", "mlp"}, experts: "experts",
		proj: [3]string{"w1", "w3", "w2"}, router: "gate", bias: bias}
}

// configKeys says which config.json keys give a family's sizes.
type configKeys struct {
	intermediate string   // I of one routed expert
	numExperts   []string // aliases of E; those present must agree; nil: expertsFirst
	sharedCount  string   // key giving S; "" means sharedFixed
	sharedFixed  int
	sharedSize   string // key giving the shared intermediate size; "" means S*I
	sharedGated  bool
	// sharedBias: the key of a bool saying the shared MLP's projections
	// have biases (ERNIE 4.5's use_bias); "" when they never do.
	sharedBias string
	// biasIf: the key of a bool saying the router has its correction bias
	// (LFM2-MoE's use_expert_bias); "" when names.bias always exists.
	biasIf string
	// sharedIfSized: the shared expert exists only when the sharedSize key
	// is present and non-zero (Granite: shared_intermediate_size 0 = none).
	sharedIfSized bool
	mtpCount      string // key bounding the MTP layers; "" if none
	topK          string // key of top-k; "" means num_experts_per_tok
	// denseKey / denseFixed: the leading dense layers of the firstDense and
	// layerTypes rules (a key, or a fixed count when the key is "").
	denseKey   string
	denseFixed int
}

// The usual aliases of the routed expert count, in the order a family's
// configs write them: num_experts (transformers 5 aliases num_local_experts
// to it), Mixtral's num_local_experts first, or DeepSeek's n_routed_experts.
var (
	expertsFirst      = []string{"num_experts", "num_local_experts"}
	localExpertsFirst = []string{"num_local_experts", "num_experts"}
	routedExperts     = []string{"n_routed_experts", "num_local_experts"}
)

// expertKeys are the aliases of E a family reads.
func (k configKeys) expertKeys() []string {
	if k.numExperts == nil {
		return expertsFirst
	}
	return k.numExperts
}

// layerRule picks the MoE layers among 0..num_hidden_layers-1.
type layerRule int

const (
	everyLayer       layerRule = iota // Mixtral
	denseReplace                      // DeepSeek: L >= first_k_dense_replace && L % moe_layer_freq == 0
	sparseStep                        // Qwen: L not in mlp_only_layers && (L+1) % decoder_sparse_step == 0
	firstDense                        // AFMoE: L >= the dense count (keys.denseKey or denseFixed)
	layerTypes                        // mlp_layer_types[L] == "sparse"; without the list, L >= the dense count
	periodOffset                      // Jamba: L % expert_layer_period == expert_layer_offset
	startEndInterval                  // ERNIE 4.5: start <= L <= end (-1: last) && (L+1) % interval == 0
	moeLayerList                      // Llama 4: L in moe_layers, else (L+1) % interleave_moe_layer_step == 0
	hashOrMoE                         // DeepSeek-V4: every layer; mlp_layer_types[L] is "moe" or "hash_moe"
)

// hashLayers says which layers route by token id (DeepSeek-V4's "hash_moe"
// entries of mlp_layer_types; without the list, the first num_hash_layers,
// 3 by default, as DeepseekV4Config fills it).
func hashLayers(c config, layers int) (func(int) bool, error) {
	if c.has("mlp_layer_types") {
		types, err := c.strs("mlp_layer_types")
		if err != nil {
			return nil, err
		}
		return func(l int) bool { return l < len(types) && types[l] == "hash_moe" }, nil
	}
	n, err := c.count("num_hash_layers", 3)
	if err != nil {
		return nil, err
	}
	return func(l int) bool { return l < n && l < layers }, nil
}

// moe returns which of p's num_hidden_layers layers are MoE. What the
// config names and the rule ignores, as transformers does, becomes one of
// p.Notices.
func (r layerRule) moe(c config, k configKeys, p *Plan) (func(int) bool, error) {
	layers := p.NumHiddenLayers
	dense := func() (int, error) {
		if k.denseKey == "" {
			return k.denseFixed, nil
		}
		return c.count(k.denseKey, k.denseFixed)
	}
	switch r {
	case firstDense:
		n, err := dense()
		if err != nil {
			return nil, err
		}
		return func(l int) bool { return l >= n }, nil
	case layerTypes:
		if c.has("mlp_layer_types") {
			types, err := c.strs("mlp_layer_types")
			if err != nil {
				return nil, err
			}
			if len(types) != layers {
				return nil, fmt.Errorf("config.json: mlp_layer_types has %d entries for num_hidden_layers=%d", len(types), layers)
			}
			for i, t := range types {
				if t != "sparse" && t != "dense" {
					return nil, fmt.Errorf("config.json: mlp_layer_types[%d] = %q (want sparse or dense)", i, t)
				}
			}
			return func(l int) bool { return l < len(types) && types[l] == "sparse" }, nil
		}
		n, err := dense()
		if err != nil {
			return nil, err
		}
		return func(l int) bool { return l >= n }, nil
	case periodOffset:
		period, err := c.intIn("expert_layer_period", 2, 1, maxDim)
		if err != nil {
			return nil, err
		}
		offset, err := c.intIn("expert_layer_offset", 1, 0, int64(period-1))
		if err != nil {
			return nil, err
		}
		return func(l int) bool { return l%period == offset }, nil
	case startEndInterval:
		start, err := c.intIn("moe_layer_start_index", 1, 0, maxDim)
		if err != nil {
			return nil, err
		}
		end, err := c.intIn("moe_layer_end_index", -1, -1, maxDim)
		if err != nil {
			return nil, err
		}
		if end == -1 {
			end = layers - 1
		}
		every, err := c.intIn("moe_layer_interval", 1, 1, maxDim)
		if err != nil {
			return nil, err
		}
		return func(l int) bool { return l >= start && l <= end && (l+1)%every == 0 }, nil
	case hashOrMoE:
		types, err := c.strs("mlp_layer_types")
		if err != nil {
			return nil, err
		}
		if types != nil && len(types) != layers {
			return nil, fmt.Errorf("config.json: mlp_layer_types has %d entries for num_hidden_layers=%d", len(types), layers)
		}
		for i, t := range types {
			if t != "moe" && t != "hash_moe" {
				return nil, fmt.Errorf("config.json: mlp_layer_types[%d] = %q (want moe or hash_moe)", i, t)
			}
		}
		return func(int) bool { return true }, nil
	case moeLayerList:
		if c.has("moe_layers") {
			list, err := c.ints("moe_layers")
			if err != nil {
				return nil, err
			}
			// transformers asks `layer_idx in config.moe_layers` of each of
			// its layers, so an entry past the last (a config trimmed for
			// tests keeps the full model's list) names nothing.
			in := make([]bool, layers)
			var beyond []int
			for _, l := range list {
				if l >= layers {
					beyond = append(beyond, l)
					continue
				}
				in[l] = true
			}
			if len(beyond) > 0 {
				p.Notices = append(p.Notices, fmt.Sprintf("config.json: moe_layers lists %s beyond num_hidden_layers=%d: ignored, as transformers ignores them",
					listSome(beyond, 8), layers))
			}
			return func(l int) bool { return l < len(in) && in[l] }, nil
		}
		step, err := c.intIn("interleave_moe_layer_step", 1, 1, maxDim)
		if err != nil {
			return nil, err
		}
		return func(l int) bool { return (l+1)%step == 0 }, nil
	case denseReplace:
		return c.denseReplaced(0)
	case sparseStep:
		step, err := c.intIn("decoder_sparse_step", 1, 1, maxDim)
		if err != nil {
			return nil, err
		}
		only, err := c.ints("mlp_only_layers")
		if err != nil {
			return nil, err
		}
		mlpOnly := make([]bool, layers) // entries past the last layer name nothing
		for _, l := range only {
			if l < layers {
				mlpOnly[l] = true
			}
		}
		return func(l int) bool { return !(l < len(mlpOnly) && mlpOnly[l]) && (l+1)%step == 0 }, nil
	}
	return func(int) bool { return true }, nil
}

func (s *spec) Name() string         { return s.name }
func (s *spec) ModelTypes() []string { return slices.Clone(s.types()) }

// types are the model types the family plans.
func (s *spec) types() []string {
	if s.modelTypes == nil {
		return []string{s.name}
	}
	return s.modelTypes
}

// Plan implements Family.
func (s *spec) Plan(cfg map[string]any, t Tensors) (*Plan, error) {
	return s.planBare(cfg, t, false)
}

// planBare plans a text model's config.json: each of its two routed banks
// where a layer holds two (ERNIE-4.5-VL), else its one bank.
func (s *spec) planBare(cfg map[string]any, t Tensors, converted bool) (*Plan, error) {
	if s.modalityBanks {
		return s.planBanks(cfg, t, converted)
	}
	return s.plan(cfg, t, converted)
}

// readSizes fills the sizes every family shares. In a converted checkpoint
// the routed count comes from the moeprep section, which convert writes.
func (s *spec) readSizes(c config, p *Plan, converted bool) error {
	var err error
	if p.HiddenSize, err = c.sizeAtMost("hidden_size", MaxHidden, "the widest released models have 16,384"); err != nil {
		return err
	}
	if p.NumHiddenLayers, err = c.sizeAtMost("num_hidden_layers", maxLayers, "the deepest released models have about 130"); err != nil {
		return err
	}
	if p.MoEIntermediateSize, err = c.sizeAtMost(s.keys.intermediate, maxIntermediate, "released experts are at most 14,336 wide"); err != nil {
		return err
	}
	if p.NumExperts, err = s.numExperts(c, converted); err != nil {
		return err
	}
	topK := s.keys.topK
	if topK == "" {
		topK = "num_experts_per_tok"
	}
	if p.TopK, err = c.size(topK); err != nil {
		return err
	}
	p.NumSharedExperts = s.keys.sharedFixed
	if s.keys.sharedIfSized {
		if n, err := c.count(s.keys.sharedSize, 0); err != nil {
			return err
		} else if n == 0 {
			p.NumSharedExperts = 0
		}
	}
	if s.keys.sharedCount != "" {
		if p.NumSharedExperts, err = c.count(s.keys.sharedCount, 0); err != nil {
			return err
		}
		if p.NumSharedExperts > maxSharedExperts {
			return fmt.Errorf("config.json: %s=%d is over the limit of %d (released models have one to eight)", s.keys.sharedCount, p.NumSharedExperts, maxSharedExperts)
		}
	}
	if p.NumSharedExperts == 0 {
		return nil
	}
	p.SharedGated = s.keys.sharedGated
	if s.keys.sharedSize != "" {
		if p.SharedIntermediateSize, err = c.sizeAtMost(s.keys.sharedSize, maxIntermediate, "released shared MLPs are at most 20,480 wide"); err != nil {
			return err
		}
		// An ungated shared MLP of its own size that is a whole number of
		// experts wide is that many shared experts (as DeepSeek-V2's), so
		// fuse-shared can split it exactly.
		if s.keys.sharedIfSized && p.SharedIntermediateSize%p.MoEIntermediateSize == 0 {
			p.NumSharedExperts = p.SharedIntermediateSize / p.MoEIntermediateSize
			if p.NumSharedExperts > maxSharedExperts {
				return fmt.Errorf("config.json: %s=%d is %d experts of %s=%d, over the limit of %d shared experts",
					s.keys.sharedSize, p.SharedIntermediateSize, p.NumSharedExperts, s.keys.intermediate, p.MoEIntermediateSize, maxSharedExperts)
			}
		}
		return nil
	}
	p.SharedIntermediateSize = p.NumSharedExperts * p.MoEIntermediateSize
	if p.SharedIntermediateSize > maxIntermediate {
		return fmt.Errorf("config.json: %s=%d experts of %s=%d make a shared MLP %d wide, over the limit of %d",
			s.keys.sharedCount, p.NumSharedExperts, s.keys.intermediate, p.MoEIntermediateSize, p.SharedIntermediateSize, maxIntermediate)
	}
	return nil
}

func (s *spec) numExperts(c config, converted bool) (int, error) {
	if converted {
		if m, ok, err := c.object("moeprep"); err != nil {
			return 0, err
		} else if ok && m.has("num_experts") {
			return m.sizeAtMost("num_experts", maxExperts, "released models route over at most 512")
		}
	}
	n, from := 0, ""
	for _, key := range s.keys.expertKeys() {
		if !c.has(key) {
			continue
		}
		v, err := c.sizeAtMost(key, maxExperts, "released models route over at most 512")
		if err != nil {
			return 0, err
		}
		if from != "" && v != n {
			return 0, fmt.Errorf("config.json: %s=%d and %s=%d disagree", from, n, key, v)
		}
		n, from = v, key
	}
	if from == "" {
		return 0, fmt.Errorf("config.json: routed expert count is missing (want one of %v)", s.keys.expertKeys())
	}
	return n, nil
}

// checkRouting refuses routing parameters no router could run.
func checkRouting(p *Plan) error {
	if p.TopK > p.NumExperts {
		return fmt.Errorf("config.json: num_experts_per_tok=%d exceeds the %d routed experts", p.TopK, p.NumExperts)
	}
	if p.NGroup < 1 || p.TopKGroup < 1 || p.TopKGroup > p.NGroup {
		return fmt.Errorf("config.json: topk_group=%d must be between 1 and n_group=%d", p.TopKGroup, p.NGroup)
	}
	if p.NumExperts%p.NGroup != 0 {
		return fmt.Errorf("config.json: %d routed experts do not split into n_group=%d groups", p.NumExperts, p.NGroup)
	}
	perGroup := p.NumExperts / p.NGroup
	if p.NGroup > 1 && p.TopKMethod == moe.TopKNoAuxTC && perGroup < 2 {
		return fmt.Errorf("config.json: n_group=%d leaves %d expert per group; noaux_tc scores a group by its top 2", p.NGroup, perGroup)
	}
	if p.TopK > p.TopKGroup*perGroup {
		return fmt.Errorf("config.json: num_experts_per_tok=%d exceeds the %d experts in topk_group=%d groups", p.TopK, p.TopKGroup*perGroup, p.TopKGroup)
	}
	if !(p.RoutedScalingFactor > 0) {
		return fmt.Errorf("config.json: routed_scaling_factor=%g must be positive", p.RoutedScalingFactor)
	}
	return nil
}

// listSome writes up to n of xs, "3, 5 and 7", saying how many more there are.
func listSome(xs []int, n int) string {
	s := make([]string, 0, min(len(xs), n)+1)
	for _, x := range xs[:min(len(xs), n)] {
		s = append(s, strconv.Itoa(x))
	}
	if len(xs) > n {
		s = append(s, fmt.Sprintf("%d more", len(xs)-n))
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// denseReplaced is DeepSeek's layer rule: the first first_k_dense_replace
// layers (k if the key is absent) dense, then every moe_layer_freq-th
// layer MoE.
func (c config) denseReplaced(k int) (func(l int) bool, error) {
	first, err := c.count("first_k_dense_replace", k)
	if err != nil {
		return nil, err
	}
	freq, err := c.intIn("moe_layer_freq", 1, 1, maxDim)
	if err != nil {
		return nil, err
	}
	return func(l int) bool { return l >= first && l%freq == 0 }, nil
}
