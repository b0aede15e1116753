package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
)

// ErrNoDriver is returned (wrapped) by Run on a machine without CUDA.
var ErrNoDriver = errors.New("no CUDA driver")

// noGPU is Run's error without a usable GPU: one cause, said once
// ("bench kernels needs a GPU: cuda: no NVIDIA driver (libcuda.so.1 not
// found)"), that is ErrNoDriver as well as the driver's own error.
type noGPU struct{ err error }

func (e noGPU) Error() string        { return "bench kernels needs a GPU: " + e.err.Error() }
func (e noGPU) Unwrap() error        { return e.err }
func (e noGPU) Is(target error) bool { return target == ErrNoDriver }

// copyTestBytes is the device-to-device copy timed for the bandwidth: 2 GiB
// each way, far past L2.
const copyTestBytes = 2 << 30

// Method describes how Run measures, for the report.
const Method = "CUDA events around each run on one stream, after one warm-up run; before each run a 256 MiB " +
	"buffer is overwritten (outside the events) so L2 holds nothing of the last run; input sets and expert-bank " +
	"copies rotate run to run; weights and inputs random; median (p10/p90) of up to iters runs within a time budget " +
	"per measurement. Floor = bytes the kernel must move / device-to-device copy bandwidth measured in the same run."

// Run times every kernel and the whole layer at each token count on CUDA
// device 0. Without a driver it returns an error wrapping ErrNoDriver.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if err := cuda.Available(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			return nil, noGPU{err}
		}
		return nil, fmt.Errorf("bench: %w", err)
	}
	dev, err := cuda.Open(0)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer dev.Close()
	r := &runner{cfg: cfg, dev: dev, began: time.Now()}
	defer r.free()
	if err := r.setup(); err != nil {
		return nil, err
	}
	for _, t := range cfg.Tokens {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := r.tokens(ctx, t); err != nil {
			return nil, fmt.Errorf("bench: %d tokens: %w", t, err)
		}
	}
	r.res.Seconds = time.Since(r.began).Seconds()
	return &r.res, nil
}

// runner holds what lives across token counts: the device, the stream,
// the banks, the router weight and bias, the flush buffer.
type runner struct {
	cfg    Config
	dev    *cuda.Device
	began  time.Time
	stream cuda.Stream
	res    Result
	tm     *timer
	banks  []*bankAlloc
	wr     *cuda.Buffer[uint16]  // router weight [E,H] bf16
	bias   *cuda.Buffer[float32] // correction bias [E]
	flush  *cuda.Buffer[uint32]
	spec   kernels.GateSpec
	scale  float32              // finalize's: 1 when rsf is folded, else rsf
	lr     *kernels.LayerRunner // queues the layer's steps on stream
}

func (r *runner) logf(format string, args ...any) {
	if r.cfg.Log != nil {
		fmt.Fprintf(r.cfg.Log, "bench: "+format+"\n", args...)
	}
}

func (r *runner) setup() error {
	s, d := r.cfg.Shape, r.cfg.DType
	r.spec, r.scale = kernels.FusedGate(s.route(), s.Contract(d.Folded()))
	precision := "bf16"
	if r.cfg.W8A8 {
		precision = "w8a8"
	}
	r.res = Result{Tool: "moeprep", Device: r.dev.String(), DType: d, Shape: s, Folded: d.Folded(),
		BlockSize: r.cfg.BlockSize, GEMMPath: r.cfg.Path.String(), Precision: precision, BankBytes: s.BankBytes(d), XSets: r.cfg.XSets, FlushBytes: flushBytes,
		IterMax: r.cfg.Iters, Graph: "off", Method: Method}
	err := r.dev.Do(func(c *cuda.Ctx) error {
		var e error
		r.stream, e = c.NewStream()
		return e
	})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	// bench routes in bf16 (x and the router weight bf16, as serving
	// engines do) and runs the grouped GEMM on bf16 activations.
	if r.lr, err = kernels.NewLayerRunner(r.dev, r.stream, kernels.LayerOptions{Route: kernels.RouteBF16,
		GEMM: kernels.GEMMOptions{Act: kernels.MatBF16, Path: r.cfg.Path, W8A8: r.cfg.W8A8}}); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	free, _, err := r.dev.MemInfo()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	n := int64(copyTestBytes)
	for n > 64<<20 && 2*n > int64(free)/4 {
		n /= 2
	}
	r.logf("%s: %.1f GB free; timing a %.1f GB device-to-device copy", r.dev, float64(free)/1e9, float64(n)/1e9)
	bw, err := copyBandwidth(r.dev, n, 10)
	if err != nil {
		return err
	}
	r.res.CopyBytes, r.res.CopyGBps = n, bw/1e9
	r.logf("copy bandwidth %.0f GB/s", bw/1e9)

	if r.flush, err = cuda.Alloc[uint32](r.dev, flushBytes/4); err != nil {
		return fmt.Errorf("bench: L2 flush buffer: %w", err)
	}
	r.tm = &timer{dev: r.dev, stream: r.stream, flush: r.flush, iters: r.cfg.Iters, budget: r.cfg.Budget}
	if r.tm.budget <= 0 {
		r.tm.budget = DefaultBudget
	}
	wr := make([]uint16, s.Routed*s.H)
	RandBF16(wr, 11, float32(math.Sqrt(3/float64(s.H)))) // logits ~ unit variance for unit x
	if r.wr, err = cuda.FromHost(r.dev, wr); err != nil {
		return fmt.Errorf("bench: router weight: %w", err)
	}
	bias := make([]float32, s.Routed)
	RandF32(bias, 12, 0.05)
	if r.bias, err = cuda.FromHost(r.dev, bias); err != nil {
		return fmt.Errorf("bench: correction bias: %w", err)
	}

	var reserve int64
	for _, t := range r.cfg.Tokens {
		reserve = max(reserve, workingBytes(s, t, r.cfg.BlockSize, r.cfg.XSets, r.cfg.W8A8))
	}
	reserve += 1 << 30
	if free, _, err = r.dev.MemInfo(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	copies, err := bankCopies(r.cfg.BankCopies, int64(free), reserve, s.BankBytes(d))
	if err != nil {
		return err
	}
	r.res.BankCopies = copies
	r.logf("%d copies of the %s bank (%.1f GB each), %.1f GB free", copies, d, float64(s.BankBytes(d))/1e9, float64(free)/1e9)
	for i := range copies {
		b, err := newBank(r.dev, s, d, uint64(100+i))
		if err != nil {
			return err
		}
		r.banks = append(r.banks, b)
		if i == 0 {
			err = fillBank(r.dev, b, d, 21)
		} else {
			err = copyBank(r.dev, b, r.banks[0], d)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) free() {
	for _, b := range r.banks {
		b.Free()
	}
	r.wr.Free()
	r.bias.Free()
	r.flush.Free()
	if r.stream != 0 {
		r.dev.Do(func(c *cuda.Ctx) error { return c.DestroyStream(r.stream) })
	}
}
