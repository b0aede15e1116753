package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// Result is one bench run: the device, the method and one Row per kernel
// and token count. Its JSON is what `moeprep bench kernels --json` prints
// and what scripts/gpu-bench.sh reads.
type Result struct {
	Tool       string  `json:"tool"`
	Device     string  `json:"device"`
	DType      DType   `json:"dtype"`
	Shape      Shape   `json:"shape"`
	Folded     bool    `json:"rsf_folded"`
	BlockSize  int     `json:"block_size"`
	GEMMPath   string  `json:"gemm_path"` // as asked: auto picks per T and stage
	Precision  string  `json:"precision"` // activation numerics: "bf16" or "w8a8" (e4m3 per token per 128 channels)
	BankCopies int     `json:"bank_copies"`
	BankBytes  int64   `json:"bank_bytes"`
	XSets      int     `json:"x_sets"`
	FlushBytes int64   `json:"l2_flush_bytes"`
	CopyBytes  int64   `json:"copy_bytes"`
	CopyGBps   float64 `json:"copy_gbps"` // device-to-device copy, read + write
	IterMax    int     `json:"iters_max"`
	Graph      string  `json:"graph"` // "captured", "off" or why capture failed
	Method     string  `json:"method"`
	Rows       []Row   `json:"rows"`
	// Outputs is the digest of the layer's output at each token count.
	Outputs []OutputDigest `json:"layer_outputs"`
	Seconds float64        `json:"seconds"`
}

// OutputDigest is the SHA-256 of the little-endian f32 bytes of the fused
// layer's output y [T,H] for every input set in turn, at one token count:
// equal digests from two builds mean bit-identical layers (router, gate,
// align, grouped GEMM, activation, finalize) on the same seeded inputs.
type OutputDigest struct {
	Tokens int    `json:"tokens"`
	SHA256 string `json:"sha256"`
}

// Row is one kernel at one token count. Times are CUDA-event microseconds;
// Micros is the median, P10/P90 the spread.
type Row struct {
	Kernel     string  `json:"kernel"`
	Tokens     int     `json:"tokens"`
	Micros     float64 `json:"us"`
	P10        float64 `json:"us_p10"`
	P90        float64 `json:"us_p90"`
	Iters      int     `json:"iters"`
	Touched    float64 `json:"touched_experts"` // mean over the input sets
	FloorBytes int64   `json:"floor_bytes"`
	FloorUs    float64 `json:"floor_us"`
	FloorFrac  float64 `json:"floor_frac"` // FloorUs / Micros
	TFLOPs     float64 `json:"tflops,omitempty"`
	Note       string  `json:"note,omitempty"`
}

// NewRow fills a row's floor and rate from its median time.
func NewRow(s Shape, d DType, kernel string, t int, touched, bytesPerSec float64, times []float64) Row {
	r := Row{Kernel: kernel, Tokens: t, Iters: len(times), Touched: touched}
	r.Micros, r.P10, r.P90 = Percentile(times, 50), Percentile(times, 10), Percentile(times, 90)
	r.FloorBytes = s.FloorBytes(kernel, d, t, touched)
	r.FloorUs = FloorMicros(r.FloorBytes, bytesPerSec)
	if r.Micros > 0 {
		r.FloorFrac = r.FloorUs / r.Micros
		if f := s.FLOPs(kernel, t); f > 0 {
			r.TFLOPs = f / (r.Micros * 1e-6) / 1e12
		}
	}
	return r
}

// Percentile is the p-th percentile (nearest rank) of xs; 0 when empty.
// xs is not modified.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if p == 50 && len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	i := int(p/100*float64(len(s)-1) + 0.5)
	return s[min(max(i, 0), len(s)-1)]
}

// WriteTable prints the result as an aligned table: one line per row,
// grouped by token count.
func WriteTable(w io.Writer, r *Result) error {
	if _, err := fmt.Fprintf(w, "%s  %s  dtype %s (rsf folded %v)  activations %s  H %d I %d  experts %d+%d  top-%d+%d  groups %d/%d  block %d\n",
		r.Tool, r.Device, r.DType, r.Folded, r.Precision, r.Shape.H, r.Shape.I, r.Shape.Routed, r.Shape.SharedReplicas*r.Shape.SharedSlots,
		r.Shape.TopK, r.Shape.SharedSlots, r.Shape.NGroup, r.Shape.TopKGroup, r.BlockSize); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "copy bandwidth %.0f GB/s (%.1f GB device-to-device, read+write)  bank %.1f GB x %d copies  %d input sets  graph: %s\n",
		r.CopyGBps, float64(r.CopyBytes)/1e9, float64(r.BankBytes)/1e9, r.BankCopies, r.XSets, r.Graph); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "T\tkernel\tus\tp10\tp90\titers\texperts\tfloor us\t% floor\tTFLOP/s\t")
	for _, row := range r.Rows {
		tf := "-"
		if row.TFLOPs > 0 {
			tf = fmt.Sprintf("%.1f", row.TFLOPs)
		}
		ex := "-"
		if row.Touched > 0 {
			ex = fmt.Sprintf("%.1f", row.Touched)
		}
		if row.Note != "" && row.Iters == 0 {
			fmt.Fprintf(tw, "%d\t%s\t%s\t\t\t\t\t\t\t\t\n", row.Tokens, row.Kernel, row.Note)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%.1f%%\t%s\t\n",
			row.Tokens, row.Kernel, fmtUs(row.Micros), fmtUs(row.P10), fmtUs(row.P90), row.Iters, ex,
			fmtUs(row.FloorUs), 100*row.FloorFrac, tf)
	}
	return tw.Flush()
}

// fmtUs prints microseconds with precision that suits their size.
func fmtUs(us float64) string {
	switch {
	case us < 10:
		return fmt.Sprintf("%.2f", us)
	case us < 1000:
		return fmt.Sprintf("%.1f", us)
	}
	return fmt.Sprintf("%.0f", us)
}
