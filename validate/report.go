package validate

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/moeprep/moeprep/internal/exitcode"
)

// The comparisons a report row can hold.
const (
	CheckFusedVsReference  = "fused-vs-reference"  // DST fused path vs SRC unfused reference
	CheckFusedVsGolden     = "fused-vs-golden"     // DST fused path vs HF golden y
	CheckReferenceVsGolden = "reference-vs-golden" // SRC reference vs HF golden y
)

// LayerResult is one comparison on one layer.
type LayerResult struct {
	Layer  int    `json:"layer"`
	MTP    bool   `json:"mtp,omitempty"`
	Check  string `json:"check"`
	Tokens int    `json:"tokens"`
	// ExpertsUsed is how many distinct experts of the bank the tokens
	// selected (routed plus fused shared) on the side under test; Experts is
	// the bank size (E, or E + R*S on a fused checkpoint).
	ExpertsUsed int `json:"experts_used"`
	Experts     int `json:"experts"`
	Diff
	// TopK is the tie-robust routing agreement (matching ids / T*K), NaN
	// when the comparison has no routing to check (golden without topk_ids).
	TopK float64 `json:"topk"`
	// TopKWeightMaxErr is the largest routing-weight difference over the ids
	// both sides chose (rsf included); checked with rtol 1e-4, atol 1e-5.
	TopKWeightMaxErr float64 `json:"topk_weight_max_err"`
	// WorstTokenRelL2 (coverage rows) is the largest relative L2 error of
	// one forced token: the check fails when it exceeds the tolerance, so a
	// corrupted expert cannot hide in the average over all tokens.
	WorstTokenRelL2 float64 `json:"worst_token_rel_l2,omitempty"`
	// Suspects (coverage rows) are the bank experts every one of whose
	// forced tokens failed: the likely corrupted ones.
	Suspects []int `json:"suspects,omitempty"`
	// Sampled (coverage rows) marks a --sample-experts run: only a sample of
	// the routed experts was exercised on purpose, and the row may pass
	// with experts unexercised.
	Sampled   bool      `json:"sampled_experts,omitempty"`
	Tolerance Tolerance `json:"tolerance"`
	Pass      bool      `json:"pass"`
	Reason    string    `json:"reason,omitempty"`
	Seconds   float64   `json:"seconds"`
}

// Verdict is PASS or FAIL.
func (r *LayerResult) Verdict() string {
	if r.Pass {
		return "PASS"
	}
	return "FAIL"
}

// MarshalJSON writes the row with its verdict. JSON has no NaN or Inf: a
// number that is not finite (topk not compared, rel_l2 of a refused
// comparison) is written as -1, with the reason alongside.
func (r LayerResult) MarshalJSON() ([]byte, error) {
	type plain LayerResult
	fix := func(v *float64) {
		if math.IsNaN(*v) || math.IsInf(*v, 0) {
			*v = -1
		}
	}
	p := plain(r)
	fix(&p.RelL2)
	fix(&p.MaxAbs)
	fix(&p.Cosine)
	fix(&p.TopK)
	fix(&p.TopKWeightMaxErr)
	fix(&p.WorstTokenRelL2)
	return json.Marshal(struct {
		plain
		Verdict string `json:"verdict"`
	}{p, r.Verdict()})
}

// Report is a whole validate run.
type Report struct {
	Src    string `json:"src,omitempty"`
	Dst    string `json:"dst,omitempty"`
	Golden string `json:"golden,omitempty"`
	Device string `json:"device"`
	// DeviceName is the GPU of a cuda run, GPUPrecision its activation type
	// and CPUCheck which of its layers the CPU reference checked.
	DeviceName   string        `json:"device_name,omitempty"`
	GPUPrecision string        `json:"gpu_precision,omitempty"`
	CPUCheck     string        `json:"cpu_check,omitempty"`
	Tokens       int           `json:"tokens"` // drawn tokens (goldens bring their own)
	Seed         uint64        `json:"seed"`
	BlockSize    int           `json:"block_size"`
	XDraw        string        `json:"x_draw"` // how the token vectors were made
	Rows         []LayerResult `json:"layers"`
	Notes        []string      `json:"notes,omitempty"`
	Seconds      float64       `json:"seconds"`
	// Timings are the layers' timings of a GPU run, in run order.
	Timings []LayerTiming `json:"timings,omitempty"`
	// Bytes is the structural proof of DST against SRC and the contract.
	Bytes *BytesResult `json:"bytes,omitempty"`
	// Coverage sums up which experts the layer checks exercised.
	Coverage *CoverageSummary `json:"coverage,omitempty"`
}

// Failed reports whether any row failed (or there were none).
func (r *Report) Failed() bool {
	if r.Bytes != nil && !r.Bytes.Pass {
		return true
	}
	if len(r.Rows) == 0 {
		return r.Bytes == nil
	}
	for i := range r.Rows {
		if !r.Rows[i].Pass {
			return true
		}
	}
	return false
}

// Err is nil when every row passed, else an error that maps to exit code 1
// (internal/exitcode.Check), naming the failed rows.
func (r *Report) Err() error {
	if !r.Failed() {
		return nil
	}
	var bad []string
	if r.Bytes != nil && r.Bytes.Mismatch != nil {
		bad = append(bad, "bytes: "+r.Bytes.Mismatch.Error())
	}
	if len(r.Rows) == 0 && r.Bytes == nil {
		return exitcode.Check("validate: no layer was checked")
	}
	for _, row := range r.Rows {
		if !row.Pass {
			bad = append(bad, fmt.Sprintf("layer %d %s (%s)", row.Layer, row.Check, row.Reason))
		}
	}
	total := len(r.Rows)
	if r.Bytes != nil {
		total++
	}
	return exitcode.Check(fmt.Sprintf("validate: %d of %d checks failed: %s", len(bad), total, strings.Join(bad, "; ")))
}

// WriteTable prints the report as an aligned table, one row per check.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "layer\tcheck\texperts\ttokens\trel_l2\tmax_abs\tcos\ttopk\tverdict")
	for _, row := range r.Rows {
		layer := fmt.Sprint(row.Layer)
		if row.MTP {
			layer += " (mtp)"
		}
		topk := "-"
		if !math.IsNaN(row.TopK) {
			topk = fmt.Sprintf("%.4f", row.TopK)
		}
		verdict := row.Verdict()
		if !row.Pass {
			verdict += ": " + row.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%.3e\t%.3e\t%.8f\t%s\t%s\n", layer, row.Check, row.ExpertsUsed, row.Experts, row.Tokens,
			row.RelL2, row.MaxAbs, row.Cosine, topk, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := r.writeTimings(w); err != nil {
		return err
	}
	if c := r.Coverage; c != nil {
		fmt.Fprintln(w, c.Line())
	}
	if b := r.Bytes; b != nil {
		if b.Pass {
			fmt.Fprintf(w, "bytes: PASS: %d tensors in %d files (%.2f GB of DST, %.2f GB of SRC) match SRC and the contract; config.json is SRC's plus the contract, %d copied files equal SRC's, DST holds nothing else; manifest hashes verified, in %.1fs\n",
				b.Tensors, b.Files, gb(b.DstBytes), gb(b.SrcBytes), b.Copies, b.Seconds)
		} else {
			fmt.Fprintf(w, "bytes: FAIL: %s\n", b.Mismatch.Error())
		}
	}
	for _, n := range r.Notes {
		if _, err := fmt.Fprintln(w, "note: "+n); err != nil {
			return err
		}
	}
	pass, total := 0, len(r.Rows)
	for _, row := range r.Rows {
		if row.Pass {
			pass++
		}
	}
	if r.Bytes != nil {
		total++
		if r.Bytes.Pass {
			pass++
		}
	}
	dev := r.Device
	if r.DeviceName != "" {
		dev = fmt.Sprintf("%s: %s, %s activations", r.Device, r.DeviceName, r.GPUPrecision)
	}
	_, err := fmt.Fprintf(w, "%d/%d checks passed in %.1fs (device %s, block size %d)\n", pass, total, r.Seconds, dev, r.BlockSize)
	return err
}

// WriteJSON writes the report as indented JSON with the same numbers.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(struct {
		*Report
		Failed bool `json:"failed"`
	}{r, r.Failed()}, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// writeTimings prints the GPU layers' timings as a second table (nothing
// for a CPU run): bytes read and uploaded, where the time went and, with
// an I/O baseline, the layer's time against it.
func (r *Report) writeTimings(w io.Writer) error {
	if len(r.Timings) == 0 {
		return nil
	}
	base := r.Timings[0].IOBaselineSeconds > 0
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "layer\tdst_GB\tsrc_GB\tdst_io_s\tbank_wait_s\tsrc_io_s\tcompute_s\twall_s"
	if base {
		head += "\tio_baseline_s\tratio"
	}
	fmt.Fprintln(tw, head)
	for _, t := range r.Timings {
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%.2f", t.Layer, gb(t.DstBytes), gb(t.SrcBytes),
			t.DstIOSeconds, t.BankWaitSeconds, t.SrcIOSeconds, t.ComputeSeconds, t.WallSeconds)
		if base {
			fmt.Fprintf(tw, "\t%.2f\t%.2f", t.IOBaselineSeconds, t.Ratio)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
