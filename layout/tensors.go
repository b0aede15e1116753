package layout

// Proj is one projection of an expert's MLP. GateUp is the fused stack of
// the gate-up layouts: only output names (ExpertTensors) use it; a source
// checkpoint's MLP (family.MLP) names gate and up apart.
type Proj int

// The projections, in the order every listing of an expert's tensors
// follows. An ungated MLP (Activation.Ungated) leaves ProjGate empty.
const (
	ProjGate Proj = iota
	ProjUp
	ProjGateUp
	ProjDown
	NumProj
)

// String is p's name in messages: gate, up, gate_up or down.
func (p Proj) String() string {
	return [NumProj]string{"gate", "up", "gate_up", "down"}[p]
}

// Role is what one tensor of a projection holds.
type Role int

// The roles, in the order every listing of an expert's tensors follows. A
// new role (zero points, g_idx) is one constant here: Tensors, family.MLP
// and ExpertTensors carry it without a new field, and every loop over
// Each or Names sees it.
const (
	RoleWeight    Role = iota
	RoleScale          // the weight's scale tensor (FP8 weight_scale_inv, INT4/NVFP4/MXFP4 scales)
	RoleBias           // per-expert bias (gpt-oss)
	RoleShape          // compressed-tensors' weight_shape I64 [2] of a packed weight
	RoleGlobal         // the per-tensor second scale (NVFP4 weight_scale_2 / weight_global_scale)
	RoleInput          // the static activation scale (NVFP4 input_scale / input_global_scale)
	RoleZeroPoint      // an asymmetric format's zero points; no format sets it yet
	RoleGIdx           // GPTQ's g_idx (act-order group of each input); no format sets it yet
	NumRole
)

// Tensors names the tensors of one expert's (or one layer's stacked
// experts') projections by projection and role; "" where there is none.
type Tensors [NumProj][NumRole]string

// Get is the name of p's r tensor, "" if none.
func (t Tensors) Get(p Proj, r Role) string { return t[p][r] }

// Set names p's r tensor.
func (t *Tensors) Set(p Proj, r Role, name string) { t[p][r] = name }

// Each calls fn for every named tensor, roles outer and projections inner
// (every weight, then every scale, ...), the empty ones left out. This is
// the one fixed order in which an expert's tensors are listed.
func (t Tensors) Each(fn func(p Proj, r Role, name string)) {
	for r := Role(0); r < NumRole; r++ {
		for p := Proj(0); p < NumProj; p++ {
			if n := t[p][r]; n != "" {
				fn(p, r, n)
			}
		}
	}
}

// Names lists every named tensor in Each's order.
func (t Tensors) Names() []string {
	var out []string
	t.Each(func(_ Proj, _ Role, n string) { out = append(out, n) })
	return out
}

// NamesOf lists the named tensors of the given roles, in Each's order
// (roles in the order given, projections inner), the empty ones left out.
func (t Tensors) NamesOf(roles ...Role) []string {
	var out []string
	for _, r := range roles {
		for p := Proj(0); p < NumProj; p++ {
			if n := t[p][r]; n != "" {
				out = append(out, n)
			}
		}
	}
	return out
}

// Weight is p's weight, "" if none.
func (t Tensors) Weight(p Proj) string { return t[p][RoleWeight] }

// Clear drops every tensor of p (Ungated drops the gate).
func (t *Tensors) Clear(p Proj) { t[p] = [NumRole]string{} }

// Stack is one output stack of a layer's experts: projection Proj's
// tensor of role Role.
type Stack struct {
	Proj Proj
	Role Role
}

// StackOrder is the one order of a layer's expert stacks in the output:
// each projection's weight and its scale in turn, then every projection's
// global scale, then every projection's input scale (a layer has those of
// them its ExpertTensors name; the per-expert biases, BiasNames, follow).
// Convert writes the stacks in this order and the byte proof predicts them
// in it.
var StackOrder = func() []Stack {
	var out []Stack
	for p := Proj(0); p < NumProj; p++ {
		out = append(out, Stack{p, RoleWeight}, Stack{p, RoleScale})
	}
	for _, r := range []Role{RoleGlobal, RoleInput} {
		for p := Proj(0); p < NumProj; p++ {
			out = append(out, Stack{p, r})
		}
	}
	return out
}()

// MLPProjs are a source MLP's projections in their order (gate, up, down:
// n 0, 1, 2 of a family's projection names); a source MLP has no
// ProjGateUp.
var MLPProjs = [3]Proj{ProjGate, ProjUp, ProjDown}
