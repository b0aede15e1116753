package kernels

import (
	"fmt"

	"github.com/moeprep/moeprep/layout"

	"github.com/moeprep/moeprep/internal/cuda"
)

// The documented fallback for experts the fused stage-1 epilogue does not
// run (gpt-oss: per-expert biases and the clamped SwiGLU; DeepSeek-V4: the
// clamped SwiGLU; Kimi K3: SiTU): stage 1 becomes two ungated grouped GEMMs (moe_proj_*,
// the same tiles as the SIMT kernels) writing the raw gate and up
// projections in f32, then one elementwise kernel (act.cu's moe_act_*)
// adds the biases and applies the activation into the intermediate.
// Stage 2 is the usual down GEMM, followed by moe_down_bias where the
// experts have down biases. Everything stays on the device; it costs an
// extra 2 x Numel x I f32 round trip through memory and runs on SIMT
// cores, which is what a correctness check needs, not what a server would
// ship.

// UnfusedAct reports whether the bank's experts need the fallback, and so
// GEMMOptions.Scratch (2 x Numel x I f32).
func (b *ExpertBank) UnfusedAct() bool {
	return !b.Act.SwiGLU() || b.GateBias != nil || b.UpBias != nil
}

func (b *ExpertBank) checkBiases() error {
	e := b.NumExperts
	if (b.GateBias == nil) != (b.UpBias == nil) {
		return fmt.Errorf("expert bank: gate and up biases come together")
	}
	if b.GateBias != nil && (b.GateBias.Len() < e*b.I || b.UpBias.Len() < e*b.I) {
		return fmt.Errorf("expert bank: gate and up biases need %d x %d values", e, b.I)
	}
	if b.DownBias != nil && b.DownBias.Len() < e*b.H {
		return fmt.Errorf("expert bank: down bias needs %d x %d values", e, b.H)
	}
	return b.Act.Check()
}

func moeGateUpAct(dev *cuda.Device, st cuda.Stream, bank *ExpertBank, sorted *Sorted, x Mat, topk int, inter Mat, opt GEMMOptions) error {
	if err := bank.checkBiases(); err != nil {
		return err
	}
	n := sorted.Numel * bank.I
	if opt.Scratch == nil || opt.Scratch.Len() < 2*n {
		return fmt.Errorf("grouped gemm: experts with biases or activation %+v need %d f32 values of scratch", bank.Act, 2*n)
	}
	wg, wu, ws, sg, su, ss, err := bank.gateUpPtrs()
	if err != nil {
		return err
	}
	m, err := Load(dev, "grouped_gemm")
	if err != nil {
		return err
	}
	fn := fmt.Sprintf("moe_proj_%v_%v", opt.Act, bank.DType)
	grid, err := gemmGrid(sorted, bank.I, fn, 0)
	if err != nil {
		return err
	}
	raw := [2]cuda.DevicePtr{opt.Scratch.Ptr(), opt.Scratch.Ptr().Add(4 * n)}
	for i, w := range [2]struct {
		w, s cuda.DevicePtr
	}{{wg, sg}, {wu, su}} {
		if i == 0 && bank.Act.Ungated() {
			continue // no gate: moe_act reads the up projection alone
		}
		if err := m.Launch(fn, grid, Block(256), 0, st,
			sorted.SortedIDs, sorted.ExpertIDs, sorted.Total, x.Ptr, w.w, ws, w.s, ss, raw[i],
			int32(sorted.Numel), int32(topk), int32(bank.I), int32(bank.H), int32(sorted.BlockSize), int32(bank.NumExperts)); err != nil {
			return err
		}
	}
	am, err := Load(dev, "act")
	if err != nil {
		return err
	}
	alpha := bank.Act.Alpha
	if alpha == 0 {
		alpha = 1
	}
	return am.Launch(fmt.Sprintf("moe_act_%v", opt.Act), Grid(sorted.SortedIDs.Len()), Block(128), 0, st,
		sorted.SortedIDs, sorted.ExpertIDs, sorted.Total, raw[0], raw[1], bank.GateBias, bank.UpBias, inter.Ptr,
		int32(sorted.Numel), int32(bank.I), int32(sorted.BlockSize), int32(bank.NumExperts),
		alpha, bank.Act.Limit, bank.Act.UpOffset, actMode(bank.Act), bank.Act.Beta, bank.Act.LinearBeta)
}

// act.cu's activation modes (ACT_*).
const (
	actClampBefore int32 = 0 // limit caps g (SwiGLU, gpt-oss, DeepSeek-V4)
	actClampAfter  int32 = 1 // limit caps silu(g) (Step-3.7)
	actGeluTanh    int32 = 2 // GeGLU with tanh gelu (Gemma 4)
	actReLU2       int32 = 3 // relu(u)^2 of ungated experts (Nemotron-H); gate unread
	actSiTU        int32 = 4 // beta tanh(g/beta) sigmoid(g) u' (Kimi K3), with its two betas
)

func actMode(a layout.Activation) int32 {
	switch {
	case a.Ungated():
		return actReLU2
	case a.Gate == layout.GateGeluTanh:
		return actGeluTanh
	case a.Gate == layout.GateSiTU:
		return actSiTU
	case a.ClampAfter:
		return actClampAfter
	}
	return actClampBefore
}

func moeDownBias(dev *cuda.Device, st cuda.Stream, bank *ExpertBank, sorted *Sorted, out *cuda.Buffer[float32]) error {
	if err := bank.checkBiases(); err != nil {
		return err
	}
	m, err := Load(dev, "act")
	if err != nil {
		return err
	}
	return m.Launch("moe_down_bias", Grid(sorted.SortedIDs.Len()), Block(128), 0, st,
		sorted.SortedIDs, sorted.ExpertIDs, sorted.Total, out, bank.DownBias,
		int32(sorted.Numel), int32(bank.H), int32(sorted.BlockSize), int32(bank.NumExperts))
}

// AddBiasRows queues m[r, c] += bias[c] for rows x cols f32 values: a
// router's logits plus its own bias (gpt-oss).
func AddBiasRows(dev *cuda.Device, st cuda.Stream, m, bias *cuda.Buffer[float32], rows, cols int) error {
	switch {
	case m == nil || bias == nil || !dimsOK(rows, cols):
		return fmt.Errorf("add bias rows: bad arguments (%d x %d)", rows, cols)
	case m.Len() < rows*cols || bias.Len() < cols:
		return fmt.Errorf("add bias rows: %d values and a bias of %d for %d x %d", m.Len(), bias.Len(), rows, cols)
	}
	am, err := Load(dev, "act")
	if err != nil {
		return err
	}
	return am.Launch("add_bias_rows", Grid(rows), Block(128), 0, st, m, bias, int32(rows), int32(cols))
}

// ScaleByExpert queues w[i] *= scale[ids[i]] for the n slots whose id is
// a routed expert (below e): Gemma 4's per_expert_scale on the gate's
// weights. CPU twin: moe.ScaleByExpert.
func ScaleByExpert(dev *cuda.Device, st cuda.Stream, w *cuda.Buffer[float32], ids *cuda.Buffer[int32], scale *cuda.Buffer[float32], n, e int) error {
	switch {
	case w == nil || ids == nil || scale == nil || !dimsOK(n, e):
		return fmt.Errorf("scale by expert: bad arguments (%d slots, %d experts)", n, e)
	case w.Len() < n || ids.Len() < n || scale.Len() < e:
		return fmt.Errorf("scale by expert: %d weights, %d ids and %d scales for %d slots of %d experts", w.Len(), ids.Len(), scale.Len(), n, e)
	}
	am, err := Load(dev, "act")
	if err != nil {
		return err
	}
	return am.Launch("scale_by_expert", Grid((n+127)/128), Block(128), 0, st, w, ids, scale, int32(n), int32(e))
}

// IdentityRows queues out[s] = x[s/topk] for every slot s of sorted's
// experts lo..hi-1 (LongCat-Flash's zero-compute experts past the bank),
// x f32 [T,H] and out f32 [Numel,H]. CPU twin: moe.IdentityRows.
func IdentityRows(dev *cuda.Device, st cuda.Stream, sorted *Sorted, x, out *cuda.Buffer[float32], topk, h, lo, hi int) error {
	switch {
	case sorted == nil || x == nil || out == nil || !dimsOK(topk, h, sorted.Numel) || lo < 0 || hi <= lo:
		return fmt.Errorf("identity rows: bad arguments (top-%d, H %d, experts %d..%d)", topk, h, lo, hi)
	case out.Len() < sorted.Numel*h || x.Len()*topk < sorted.Numel*h:
		return fmt.Errorf("identity rows: %d outputs and %d inputs for %d slots of %d a token x %d", out.Len(), x.Len(), sorted.Numel, topk, h)
	}
	am, err := Load(dev, "act")
	if err != nil {
		return err
	}
	return am.Launch("moe_identity_rows", Grid(sorted.SortedIDs.Len()), Block(128), 0, st,
		sorted.SortedIDs, sorted.ExpertIDs, sorted.Total, x, out,
		int32(sorted.Numel), int32(topk), int32(h), int32(sorted.BlockSize), int32(lo), int32(hi))
}
