package placement

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Schema names the JSON placement moeprep writes.
const Schema = "moeprep.placement/v1"

// Result is a placement of every recorded layer.
type Result struct {
	Schema string `json:"schema"`
	Spec
	Hierarchical bool `json:"hierarchical"`
	// Layers are the layer indices as the statistics number them;
	// PhysicalToLogical[i] is Layers[i]'s map, slot -> logical expert.
	Layers            []int   `json:"layers"`
	PhysicalToLogical [][]int `json:"physical_to_logical_map"`
	// Per layer, the imbalance (max - mean) / mean of the ranks' loads
	// under the contiguous placement and under this one, and their means.
	ImbalanceContiguous     []float64 `json:"imbalance_contiguous"`
	ImbalanceComputed       []float64 `json:"imbalance"`
	MeanImbalanceContiguous float64   `json:"mean_imbalance_contiguous"`
	MeanImbalanceComputed   float64   `json:"mean_imbalance"`
}

// Place balances every layer of st. A layer whose loads are all zero keeps
// the contiguous placement.
func Place(s Spec, st *Stats) (*Result, error) {
	if len(st.Loads) > 0 && s.Experts == 0 {
		s.Experts = len(st.Loads[0])
	}
	if len(st.Loads) > 0 && len(st.Loads[0]) != s.Experts {
		return nil, fmt.Errorf("%s: %d experts per layer recorded, the model has %d", st.File, len(st.Loads[0]), s.Experts)
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	r := &Result{Schema: Schema, Spec: s, Hierarchical: s.Hierarchical(), Layers: st.Layers}
	for _, load := range st.Loads {
		l := Contiguous(s)
		base := Imbalance(RankLoads(s, l, load))
		recorded := false
		for _, v := range load {
			recorded = recorded || v > 0
		}
		if recorded {
			var err error
			if l, err = Balance(s, load); err != nil {
				return nil, err
			}
		}
		r.PhysicalToLogical = append(r.PhysicalToLogical, l.Map)
		r.ImbalanceContiguous = append(r.ImbalanceContiguous, base)
		r.ImbalanceComputed = append(r.ImbalanceComputed, Imbalance(RankLoads(s, l, load)))
	}
	r.MeanImbalanceContiguous = mean(r.ImbalanceContiguous)
	r.MeanImbalanceComputed = mean(r.ImbalanceComputed)
	return r, nil
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// WriteSGLang writes SGLang's --init-expert-location JSON:
// physical_to_logical_map [layers][slots], layers 0..max recorded (a
// layer not recorded, dense ones included, keeps the contiguous map),
// slots contiguous per rank as SGLang reads them.
func (r *Result) WriteSGLang(w io.Writer) error {
	n := 0
	for _, l := range r.Layers {
		n = max(n, l+1)
	}
	m := make([][]int, n)
	for i := range m {
		m[i] = Contiguous(r.Spec).Map
	}
	for i, l := range r.Layers {
		m[l] = r.PhysicalToLogical[i]
	}
	return json.NewEncoder(w).Encode(map[string]any{"physical_to_logical_map": m})
}

// WriteTRTLLM writes TensorRT-LLM's moe_load_balancer.yaml: num_slots and
// initial_global_assignments {layer: [expert per slot]}.
func (r *Result) WriteTRTLLM(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "num_slots: %d\n", r.Slots)
	b.WriteString("initial_global_assignments:\n")
	for i, l := range r.Layers {
		ids := make([]string, len(r.PhysicalToLogical[i]))
		for j, e := range r.PhysicalToLogical[i] {
			ids[j] = fmt.Sprint(e)
		}
		fmt.Fprintf(&b, "  %d: [%s]\n", l, strings.Join(ids, ", "))
	}
	b.WriteString("layer_updates_per_iter: 0\n")
	_, err := io.WriteString(w, b.String())
	return err
}
