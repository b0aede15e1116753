package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
)

// inputSet is one rotating input: x and everything routed from it.
type inputSet struct {
	x      *cuda.Buffer[uint16]  // [T,H] bf16
	logits *cuda.Buffer[float32] // [T,E]
	gate   *kernels.GateOut      // [T,K] ids and weights
	al     *kernels.Alignment
	sorted *kernels.Sorted // views of al's arrays for the GEMM
}

// layerBufs are one token count's device buffers.
type layerBufs struct {
	t     int
	sets  []*inputSet
	inter *cuda.Buffer[uint16]  // [T*K,I] bf16, shared by the sets
	out   *cuda.Buffer[float32] // [T*K,H] f32
	y     *cuda.Buffer[float32] // [T,H] f32
	quant *kernels.QuantScratch // w8a8: the stages' quantised inputs (nil otherwise)
	execs []cuda.GraphExec      // one captured layer per rotation slot
}

func (lb *layerBufs) free(dev *cuda.Device) {
	for _, s := range lb.sets {
		s.x.Free()
		s.logits.Free()
		if s.gate != nil {
			s.gate.Free()
		}
		if s.al != nil {
			s.al.Free()
		}
	}
	lb.inter.Free()
	lb.out.Free()
	lb.y.Free()
	lb.quant.Free()
	dev.Do(func(c *cuda.Ctx) error {
		for _, e := range lb.execs {
			c.DestroyGraphExec(e)
		}
		return nil
	})
}

// slots is the rotation length: every (input set, bank copy) pair in turn.
func (r *runner) slots() int { return lcm(r.cfg.XSets, len(r.banks)) }

func lcm(a, b int) int {
	g, h := a, b
	for h != 0 {
		g, h = h, g%h
	}
	return a / g * b
}

// pick is run i's input set and bank.
func (r *runner) pick(lb *layerBufs, i int) (*inputSet, *kernels.ExpertBank) {
	slot := i % r.slots()
	return lb.sets[slot%len(lb.sets)], r.banks[slot%len(r.banks)].bank
}

func (r *runner) alloc(t int) (*layerBufs, error) {
	s := r.cfg.Shape
	k := s.Slots()
	lb := &layerBufs{t: t}
	var err error
	for i := range r.cfg.XSets {
		set := &inputSet{}
		lb.sets = append(lb.sets, set)
		x := make([]uint16, t*s.H)
		RandBF16(x, uint64(1000*t+i), 1.7) // uniform, unit variance
		if set.x, err = cuda.FromHost(r.dev, x); err != nil {
			return lb, err
		}
		if set.logits, err = cuda.Alloc[float32](r.dev, t*s.Routed); err != nil {
			return lb, err
		}
		if set.gate, err = kernels.NewGateOut(r.dev, r.spec, t, false); err != nil {
			return lb, err
		}
		if set.al, err = kernels.NewAlignment(r.dev, t*k, s.BankExperts(), r.cfg.BlockSize); err != nil {
			return lb, err
		}
		set.sorted = set.al.Sorted()
	}
	if lb.inter, err = cuda.Alloc[uint16](r.dev, t*k*s.I); err != nil {
		return lb, err
	}
	if lb.out, err = cuda.Alloc[float32](r.dev, t*k*s.H); err != nil {
		return lb, err
	}
	if lb.y, err = cuda.Alloc[float32](r.dev, t*s.H); err != nil {
		return lb, err
	}
	if r.cfg.W8A8 {
		lb.quant, err = kernels.NewQuantScratch(r.dev, t, k, s.H, s.I)
	}
	return lb, err
}

// The stages, each queued by the layer runner for one input set.

func (r *runner) router(lb *layerBufs, set *inputSet) error {
	s := r.cfg.Shape
	return r.lr.Router(kernels.BF16Mat(set.x), kernels.BF16Mat(r.wr), set.logits, lb.t, s.H, s.Routed)
}

func (r *runner) gate(lb *layerBufs, set *inputSet) error {
	return r.lr.Gate(r.spec, lb.t, set.logits, r.bias, set.gate)
}

func (r *runner) align(set *inputSet) error {
	return r.lr.Align(set.gate.IDs, set.al)
}

// gateUp and down pass this token count's w8a8 scratch (act_quant runs
// inside each stage: its time counts in the stage's).
func (r *runner) gateUp(lb *layerBufs, set *inputSet, bank *kernels.ExpertBank) error {
	return r.lr.GateUp(bank, set.sorted, kernels.BF16Mat(set.x), lb.t, r.cfg.Shape.Slots(), kernels.BF16Mat(lb.inter), lb.quant, nil)
}

func (r *runner) down(lb *layerBufs, set *inputSet, bank *kernels.ExpertBank) error {
	return r.lr.Down(bank, set.sorted, kernels.BF16Mat(lb.inter), lb.out, lb.quant, nil)
}

func (r *runner) finalize(lb *layerBufs, set *inputSet) error {
	s := r.cfg.Shape
	return r.lr.Finalize(lb.out, set.gate.Weights, lb.y, lb.t, s.Slots(), s.H, r.scale)
}

// layer queues the whole fused layer, router GEMM to finalize.
func (r *runner) layer(lb *layerBufs, set *inputSet, bank *kernels.ExpertBank) error {
	s := r.cfg.Shape
	x := kernels.BF16Mat(set.x)
	return r.lr.Layer(&kernels.LayerBuffers{T: lb.t, H: s.H, Rows: s.Routed, RouterX: x, X: x, RouterW: kernels.BF16Mat(r.wr),
		Bias: r.bias, Logits: set.logits, Spec: r.spec, Gate: set.gate, Align: set.al, Sorted: set.sorted,
		Inter: kernels.BF16Mat(lb.inter), Out: lb.out, Y: lb.y, Scale: r.scale, Quant: lb.quant}, bank)
}

// prepare runs the layer once per input set, checks each alignment on the
// host (every id in range), records the SHA-256 of the layer's whole
// output over the input sets (Result.Outputs: the inputs are seeded, so
// two builds that compute the same bits print the same digest) and returns
// the mean number of experts touched.
func (r *runner) prepare(lb *layerBufs) (float64, error) {
	touched := 0
	sum := sha256.New()
	for i, set := range lb.sets {
		if err := r.layer(lb, set, r.banks[0].bank); err != nil {
			return 0, err
		}
		y, err := lb.y.ToHost(-1)
		if err != nil {
			return 0, fmt.Errorf("input set %d: %w", i, err)
		}
		var b [4]byte
		for _, v := range y {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			sum.Write(b[:])
		}
		h, err := set.al.Host()
		if err != nil {
			return 0, fmt.Errorf("input set %d: %w", i, err)
		}
		for _, c := range h.Counts {
			if c > 0 {
				touched++
			}
		}
	}
	r.res.Outputs = append(r.res.Outputs, OutputDigest{Tokens: lb.t, SHA256: hex.EncodeToString(sum.Sum(nil))})
	return float64(touched) / float64(len(lb.sets)), nil
}

// checkOutput reports whether the last layer's first rows are finite and
// not all zero ("" when they are).
func (r *runner) checkOutput(lb *layerBufs) (string, error) {
	n := min(lb.t, 4) * r.cfg.Shape.H
	y, err := lb.y.ToHost(n)
	if err != nil {
		return "", err
	}
	nonzero := false
	for i, v := range y {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Sprintf("layer output y[%d] = %v", i, v), nil
		}
		nonzero = nonzero || v != 0
	}
	if !nonzero {
		return "layer output is all zero", nil
	}
	return "", nil
}

// capture records one CUDA graph of the layer per rotation slot.
func (r *runner) capture(lb *layerBufs) error {
	for i := range r.slots() {
		set, bank := r.pick(lb, i)
		if err := r.dev.Do(func(c *cuda.Ctx) error {
			if e := c.GraphsAvailable(); e != nil {
				return e
			}
			return c.BeginCapture(r.stream)
		}); err != nil {
			return err
		}
		lerr := r.layer(lb, set, bank)
		err := r.dev.Do(func(c *cuda.Ctx) error {
			g, e := c.EndCapture(r.stream)
			if e != nil || lerr != nil {
				c.DestroyGraph(g)
				return e
			}
			defer c.DestroyGraph(g)
			exec, e := c.Instantiate(g)
			if e != nil {
				return e
			}
			lb.execs = append(lb.execs, exec)
			return nil
		})
		if lerr != nil {
			return lerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// tokens times every kernel at t tokens and appends the rows.
func (r *runner) tokens(ctx context.Context, t int) error {
	lb, err := r.alloc(t)
	defer lb.free(r.dev)
	if err != nil {
		return err
	}
	touched, err := r.prepare(lb)
	if err != nil {
		return err
	}
	if msg, err := r.checkOutput(lb); err != nil {
		return err
	} else if msg != "" {
		return fmt.Errorf("sanity check failed: %s", msg)
	}
	r.logf("T=%d: %.1f experts touched", t, touched)
	ops := []struct {
		name string
		op   func(i int) error
	}{
		{KRouter, func(i int) error { set, _ := r.pick(lb, i); return r.router(lb, set) }},
		{KGate, func(i int) error { set, _ := r.pick(lb, i); return r.gate(lb, set) }},
		{KAlign, func(i int) error { set, _ := r.pick(lb, i); return r.align(set) }},
		{KGateUp, func(i int) error { set, b := r.pick(lb, i); return r.gateUp(lb, set, b) }},
		{KDown, func(i int) error { set, b := r.pick(lb, i); return r.down(lb, set, b) }},
		{KGEMM, func(i int) error {
			set, b := r.pick(lb, i)
			if err := r.gateUp(lb, set, b); err != nil {
				return err
			}
			return r.down(lb, set, b)
		}},
		{KFinalize, func(i int) error { set, _ := r.pick(lb, i); return r.finalize(lb, set) }},
		{KLayer, func(i int) error { set, b := r.pick(lb, i); return r.layer(lb, set, b) }},
	}
	for _, o := range ops {
		if err := r.record(ctx, o.name, t, touched, o.op); err != nil {
			return err
		}
	}
	if !r.cfg.Graph {
		r.res.Rows = append(r.res.Rows, Row{Kernel: KLayerGraph, Tokens: t, Note: "graph capture off"})
		return nil
	}
	if err := r.capture(lb); err != nil {
		r.res.Graph = "capture failed: " + err.Error()
		r.logf("T=%d: %s", t, r.res.Graph)
		r.res.Rows = append(r.res.Rows, Row{Kernel: KLayerGraph, Tokens: t, Note: "capture failed"})
		return nil
	}
	r.res.Graph = "captured"
	return r.record(ctx, KLayerGraph, t, touched, func(i int) error {
		exec := lb.execs[i%len(lb.execs)]
		return r.dev.Do(func(c *cuda.Ctx) error { return c.LaunchGraph(exec, r.stream) })
	})
}

// record measures one kernel and appends its row.
func (r *runner) record(ctx context.Context, kernel string, t int, touched float64, op func(i int) error) error {
	ms, err := r.tm.measure(ctx, op)
	if err != nil {
		return fmt.Errorf("%s: %w", kernel, err)
	}
	us := make([]float64, len(ms))
	for i, v := range ms {
		us[i] = v * 1e3
	}
	if !readsWeights(kernel) {
		touched = 0
	}
	row := NewRow(r.cfg.Shape, r.cfg.DType, kernel, t, touched, r.res.CopyGBps*1e9, us)
	r.res.Rows = append(r.res.Rows, row)
	r.logf("T=%d %-13s %9s us (p10 %s, p90 %s, %d runs)  floor %s us = %.1f%%",
		t, kernel, fmtUs(row.Micros), fmtUs(row.P10), fmtUs(row.P90), row.Iters, fmtUs(row.FloorUs), 100*row.FloorFrac)
	return nil
}

// readsWeights reports whether kernel's floor counts expert weights.
func readsWeights(kernel string) bool {
	switch kernel {
	case KGateUp, KDown, KGEMM, KLayer, KLayerGraph:
		return true
	}
	return false
}
