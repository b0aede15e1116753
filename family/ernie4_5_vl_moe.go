package family

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ERNIE-4.5-VL MoE (ernie4_5_vl_moe, its text model ernie4_5_vl_moe_text):
// each MoE layer (Ernie4_5_VLMoeMoeBlock) holds two routed banks, text_moe
// and vision_moe, of the same E experts and top-k but their own router,
// correction bias and expert width (moe_intermediate_size [text, vision]);
// a token is routed by one of them, chosen by its token type (0 text, else
// vision), and the shared MLP (moe_num_shared_experts times the text
// width) is added to every token. Each bank routes as ERNIE 4.5 does.
//
// transformers 5.17 saves it in the hub's layout (its ernie4_5_vl_moe
// mapping reversed), model.layers.L.mlp:
//   - gate.weight and gate.weight_1: the text and vision routers, stored
//     transposed, [H, E];
//   - moe_statics.e_score_correction_bias [2, E] (F32): row 0 text, row 1
//     vision;
//   - experts.0..E-1: the text bank; experts.E..2E-1: the vision bank;
//   - shared_experts.{gate,up,down}_proj.
//
// moeprep plans each bank as a MoE layer of its own: both keep the decoder
// layer's Index and differ in Layer.Bank (BankText, BankVision), which
// every map of a plan's layers keys by with Index (Layer.Key).
// Both banks' layers carry the shared MLP, so each computes what a token of
// its type gets; a golden (token_type_ids) is compared row by row with the
// bank each token takes. The converted banks are the stacks under
// mlp.text_moe.experts and mlp.vision_moe.experts, transformers' own module
// names.

// ernie45VLText is ERNIE-4.5-VL's text model, planned inside its wrapper:
// ERNIE 4.5's router and names, layers by mlp_layer_types (transformers'
// default: the first dense, the rest sparse), and two banks per layer
// (planBanks).
var ernie45VLText = &spec{
	name:          "ernie4_5_vl_moe",
	modelTypes:    []string{"ernie4_5_vl_moe_text"},
	names:         ernie45MoE.names,
	keys:          ernie45VLKeys(),
	layers:        layerTypes,
	softmaxBias:   true,
	biasRow:       true,
	defaults:      map[string]any{"moe_num_shared_experts": 2.0, "moe_k": 6.0},
	routing:       softmaxNorm(true),
	modalityBanks: true,
	sharedUnfusable: "its shared MLP is added to the tokens of both routed banks (text and vision), whose experts differ in width; " +
		"fusing it would need slots of each bank's width",
}

// ernie45VLKeys are ERNIE 4.5's config keys, the first layer dense by
// default (transformers' mlp_layer_types default).
func ernie45VLKeys() configKeys {
	k := ernie45MoE.keys
	k.denseFixed = 1
	return k
}

// banks are the two routed banks of an ERNIE-4.5-VL MoE layer, in order:
// the bank, the router's stored name (relative to the module) and the
// module name of the converted stacks.
var banks = [2]struct {
	bank           Bank
	router, module string
}{
	{BankText, "gate.weight", "text_moe"},
	{BankVision, "gate.weight_1", "vision_moe"},
}

// planBanks plans each bank of an ERNIE-4.5-VL text model as a family of
// one bank (bankTensors presents the checkpoint as that bank alone holds
// it) and merges their layers.
func (s *spec) planBanks(raw map[string]any, t Tensors, converted bool) (*Plan, error) {
	c := s.withDefaults(raw, "ernie4_5_vl_moe_text")
	for _, key := range quantKeys {
		if c.has(key) {
			return nil, fmt.Errorf("config.json: %s: quantised ERNIE-4.5-VL checkpoints are not read yet (no transformers-written quantised fixture proves the two banks' formats); convert the BF16 release", key)
		}
	}
	if !c.has("moe_intermediate_size") {
		return nil, c.missing("moe_intermediate_size")
	}
	sizes, err := c.ints("moe_intermediate_size")
	if err != nil {
		return nil, err
	}
	if len(sizes) != 2 || sizes[0] <= 0 || sizes[1] <= 0 {
		return nil, c.errorf("moe_intermediate_size", "want [text, vision], two positive expert widths, got %v", sizes)
	}
	e, err := bankExperts(c)
	if err != nil {
		return nil, err
	}
	h, err := c.size("hidden_size")
	if err != nil {
		return nil, err
	}
	var merged *Plan
	var text []Layer
	for b, bank := range banks {
		cfg := maps.Clone(raw)
		cfg["moe_intermediate_size"] = float64(sizes[b])
		cfg["moe_num_experts"] = float64(e)
		delete(cfg, "num_experts")
		if b > 0 {
			// The shared MLP is planned once, with the text bank (its
			// width is the text experts'), and given to both.
			cfg["moe_num_shared_experts"] = 0.0
		}
		bt, err := newBankTensors(t, s.layerPrefix(t), b, e, h)
		if err != nil {
			return nil, err
		}
		one := *s
		one.modalityBanks = false
		p, err := one.plan(cfg, bt, converted)
		if err != nil {
			if b == 0 {
				return nil, err
			}
			return nil, fmt.Errorf("%s bank (experts %d..%d, router %s): %s", bank.bank, e, 2*e-1, bank.router, storedIDs(err.Error(), e))
		}
		for i := range p.Layers {
			l := &p.Layers[i]
			bt.restore(l)
			l.Bank = bank.bank
			l.Prefix += "." + bank.module
			if b > 0 {
				l.Intermediate = sizes[b]
				if j := slices.IndexFunc(text, func(t Layer) bool { return t.Index == l.Index }); j >= 0 {
					l.Shared = text[j].Shared
				}
			}
		}
		if b == 0 {
			merged, text = p, p.Layers
			continue
		}
		if p.WeightDType != merged.WeightDType && p.WeightDType != "" && merged.WeightDType != "" {
			return nil, fmt.Errorf("the vision bank's experts are %s, the text bank's %s", p.WeightDType, merged.WeightDType)
		}
		if len(p.Layers) != len(text) {
			return nil, fmt.Errorf("the vision bank has %d MoE layers, the text bank %d", len(p.Layers), len(text))
		}
		merged.Layers = append(merged.Layers, p.Layers...)
	}
	return merged, nil
}

// presentedID finds the expert ids a planner's error names: "expert 3",
// "experts.3.".
var presentedID = regexp.MustCompile(`(expert |experts\.)(\d{1,9})\b`)

// storedIDs rewrites the second bank's expert ids in a planner's error
// (which saw them as 0..E-1) to the stored ones, E..2E-1, so that the
// error names the tensor the checkpoint holds.
func storedIDs(msg string, e int) string {
	return presentedID.ReplaceAllStringFunc(msg, func(m string) string {
		sm := presentedID.FindStringSubmatch(m)
		id, _ := strconv.Atoi(sm[2])
		return sm[1] + strconv.Itoa(id+e)
	})
}

// bankExperts reads E, moe_num_experts: one count, or the hub's per-bank
// list of two equal counts (transformers' banks are the same size).
func bankExperts(c config) (int, error) {
	v, ok := c.get("moe_num_experts")
	if !ok {
		return c.size("num_experts")
	}
	if _, isList := v.([]any); !isList {
		return c.size("moe_num_experts")
	}
	l, err := c.ints("moe_num_experts")
	if err != nil {
		return 0, err
	}
	if len(l) != 2 || l[0] <= 0 || l[0] != l[1] {
		return 0, c.errorf("moe_num_experts", "want one expert count, or [text, vision] of the same count (transformers builds both banks of num_experts), got %v", l)
	}
	return l[0], nil
}

// bankTensors presents a checkpoint's tensors as one bank of its MoE
// layers alone holds them: under <layers>L.mlp, the bank's router as
// gate.weight [E, H] (stored transposed), the correction bias as its row
// [1, E], and the bank's experts as experts.0..E-1; the other bank's are
// hidden, and so is the shared MLP beside the second bank (planned with the
// first). Everything else is as stored.
type bankTensors struct {
	t           Tensors
	layers      string
	bank, e     int
	names       []string
	toStored    map[string]string
	routerShape map[string][]int64 // stored routers, by presented name
}

func newBankTensors(t Tensors, layers string, bank, e, h int) (*bankTensors, error) {
	bt := &bankTensors{t: t, layers: layers, bank: bank, e: e, toStored: map[string]string{}, routerShape: map[string][]int64{}}
	for _, n := range t.Names() {
		p, ok, err := bt.present(n, h)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		bt.names = append(bt.names, p)
		bt.toStored[p] = n
	}
	return bt, nil
}

// moduleTail splits a stored name <layers>L.mlp.<tail>; ok is false for a
// name outside a decoder layer's mlp module.
func (bt *bankTensors) moduleTail(name string) (head, tail string, ok bool) {
	rest, found := strings.CutPrefix(name, bt.layers)
	if !found {
		return "", "", false
	}
	dot := strings.IndexByte(rest, '.')
	if dot <= 0 {
		return "", "", false
	}
	if _, isIndex := parseIndex(rest[:dot]); !isIndex {
		return "", "", false
	}
	tail, found = strings.CutPrefix(rest[dot+1:], "mlp.")
	if !found {
		return "", "", false
	}
	return name[:len(name)-len(tail)], tail, true
}

// present is the name a stored tensor has in the bank's view, false when
// the view hides it. A router or bias of a shape the two banks cannot be
// read from is an error naming it.
func (bt *bankTensors) present(name string, h int) (string, bool, error) {
	head, tail, ok := bt.moduleTail(name)
	if !ok {
		return name, true, nil
	}
	switch {
	case tail == banks[0].router || tail == banks[1].router:
		m, _ := bt.t.Lookup(name)
		if len(m.Shape) != 2 || m.Shape[0] != int64(h) || m.Shape[1] != int64(bt.e) {
			return "", false, fmt.Errorf("router %s: shape %v, want [%d, %d] (H=%d, E=%d: ERNIE-4.5-VL stores its routers transposed)", name, m.Shape, h, bt.e, h, bt.e)
		}
		if tail != banks[bt.bank].router {
			return "", false, nil
		}
		p := head + "gate.weight"
		bt.routerShape[p] = m.Shape
		return p, true, nil
	case tail == "moe_statics.e_score_correction_bias":
		m, _ := bt.t.Lookup(name)
		if len(m.Shape) != 2 || m.Shape[0] != int64(len(banks)) || m.Shape[1] != int64(bt.e) {
			return "", false, fmt.Errorf("router bias %s: shape %v, want [2, %d] (a row for each bank, E=%d)", name, m.Shape, bt.e, bt.e)
		}
		return name, true, nil
	case strings.HasPrefix(tail, "shared_experts.") && bt.bank > 0:
		return "", false, nil
	}
	rest, isExpert := strings.CutPrefix(tail, "experts.")
	if !isExpert {
		return name, true, nil
	}
	dot := strings.IndexByte(rest, '.')
	id, isID := 0, false
	if dot > 0 {
		id, isID = parseIndex(rest[:dot])
	}
	switch {
	case !isID:
		return name, true, nil
	case id < bt.e:
		return name, bt.bank == 0, nil
	case id < 2*bt.e:
		if bt.bank == 0 {
			return "", false, nil
		}
		return head + "experts." + strconv.Itoa(id-bt.e) + rest[dot:], true, nil
	}
	return "", false, fmt.Errorf("tensor %s: expert %d is past both routed banks (text 0..%d, vision %d..%d: E=%d each)", name, id, bt.e-1, bt.e, 2*bt.e-1, bt.e)
}

func (bt *bankTensors) Names() []string { return bt.names }

func (bt *bankTensors) Lookup(name string) (TensorMeta, bool) {
	stored, ok := bt.toStored[name]
	if !ok {
		return TensorMeta{}, false
	}
	m, ok := bt.t.Lookup(stored)
	if !ok {
		return m, false
	}
	if s, isRouter := bt.routerShape[name]; isRouter {
		m.Shape = []int64{s[1], s[0]}
	} else if _, tail, _ := bt.moduleTail(stored); tail == "moe_statics.e_score_correction_bias" {
		m.Shape = []int64{1, m.Shape[1]}
	}
	return m, true
}

// restore puts the stored names back into a layer the bank was planned as:
// the router as a transposed view of the bank's, the correction bias as
// the bank's row, the experts by their stored ids.
func (bt *bankTensors) restore(l *Layer) {
	if l.Router != "" {
		l.Router = TransposedViewName(bt.toStored[l.Router], -1, 0, bt.e, 1)
	}
	if l.RouterBias != "" {
		l.RouterBias = ViewName(bt.toStored[l.RouterBias], -1, bt.bank, bt.bank+1)
	}
	for i := range l.Experts {
		renameMLP(&l.Experts[i], bt.storedName)
	}
}

// storedName is a presented name's stored one; a view of a presented
// tensor keeps its view.
func (bt *bankTensors) storedName(n string) string {
	base := BaseName(n)
	if s, ok := bt.toStored[base]; ok {
		return s + n[len(base):]
	}
	return n
}

// renameMLP applies f to every tensor name of m.
func renameMLP(m *MLP, f func(string) string) {
	m.Each(func(p layout.Proj, r layout.Role, n string) { m.Set(p, r, f(n)) })
}
