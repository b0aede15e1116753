package validate

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/validate/judge"
)

// LayerResult is one comparison on one layer.
type LayerResult struct {
	Layer int  `json:"layer"`
	MTP   bool `json:"mtp,omitempty"`
	// Bank is which routed bank of its decoder layer the row checked where
	// the layer has two (ERNIE-4.5-VL: "text", "vision"); Layer is then the
	// decoder layer's index in JSON, and in memory the MoE layer's
	// written index (family.Layer.Key: 65536 added for the vision bank).
	Bank   string `json:"bank,omitempty"`
	Check  string `json:"check"`
	Tokens int    `json:"tokens"`
	// ExpertsUsed is how many distinct experts of the bank the tokens
	// selected (routed plus fused shared) on the side under test; Experts is
	// the bank size (E, or E + R*S on a fused checkpoint).
	ExpertsUsed int `json:"experts_used"`
	Experts     int `json:"experts"`
	judge.Diff
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
	Sampled   bool            `json:"sampled_experts,omitempty"`
	Tolerance judge.Tolerance `json:"tolerance"`
	Pass      bool            `json:"pass"`
	Reason    string          `json:"reason,omitempty"`
	Seconds   float64         `json:"seconds"`
}

// Verdict is PASS or FAIL.
func (r *LayerResult) Verdict() string {
	if r.Pass {
		return "PASS"
	}
	return "FAIL"
}

// layerName names MoE layer i as the table's rows do: its index, or, in a
// model whose decoder layers hold two routed banks, its decoder layer and
// bank.
func (r *Report) layerName(i int) string {
	if slices.ContainsFunc(r.MoELayers, secondBank) {
		d, bank := family.SplitLayerKey(i)
		if bank == family.NoBank {
			bank = family.BankText
		}
		return fmt.Sprintf("%d %s", d, bank)
	}
	return fmt.Sprint(i)
}

// layerBefore: MoE layer a comes before b in a run (by decoder layer, so
// that a decoder layer's two routed banks are adjacent; then by index).
func layerBefore(a, b int) bool {
	if da, db := decoderOf(a), decoderOf(b); da != db {
		return da < db
	}
	return a < b
}

// layerLabels lists MoE layer indices as the table names them, ", "
// between them.
func (r *Report) layerLabels(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = r.layerName(x)
	}
	return strings.Join(s, ", ")
}

// label names the row's layer: its index, or its decoder layer and bank.
func (r LayerResult) label() string {
	if r.Bank != "" {
		return fmt.Sprintf("%d %s", decoderOf(r.Layer), r.Bank)
	}
	return fmt.Sprint(r.Layer)
}

// MarshalJSON writes the row with its verdict. JSON has no NaN or Inf: a
// number that is not finite (topk not compared, rel_l2 of a refused
// comparison, the norm of a reference holding a NaN) is written as -1, with
// the reason alongside; one such number must not cost the whole report.
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
	fix(&p.RefNorm)
	p.Layer = decoderOf(p.Layer)
	return json.Marshal(struct {
		plain
		Verdict string `json:"verdict"`
	}{p, r.Verdict()})
}

// Schema names the JSON report's format (validate/SCHEMA.md); it is the
// report's first field. A field's meaning never changes under one schema;
// a change that would break a reader gets a new version.
const Schema = "moeprep.validate/v1"

// What a run checked (Report.Mode).
const (
	ModeLayersBytes = "layers+bytes" // the layer checks, then the byte proof (SRC DST)
	ModeLayers      = "layers"       // the layer checks alone (--skip-bytes, or no SRC)
	ModeBytes       = "bytes"        // the byte proof alone (--bytes, or a DST whose model is not SRC's)
)

// runSetup is what a run compared and where: the Report's fields and the
// JSON document's, in the document's order.
type runSetup struct {
	Src    string `json:"src,omitempty"`
	Dst    string `json:"dst,omitempty"`
	Golden string `json:"golden,omitempty"`
	Device Device `json:"device"` // "none": a run of the byte proof alone
	// DeviceName is the GPU of a cuda run, GPUPrecision its activation type
	// and CPUCheck which of its layers the CPU reference checked.
	DeviceName   string       `json:"device_name,omitempty"`
	GPUPrecision Precision    `json:"gpu_precision,omitempty"`
	CPUCheck     CPUCheckMode `json:"cpu_check,omitempty"`
}

// Report is a whole validate run.
type Report struct {
	// Tool is the program that made the report ("moeprep v1.2.3"), set by
	// the caller; Mode is what ran.
	Tool string `json:"tool,omitempty"`
	Mode string `json:"mode"`
	runSetup
	Tokens    int    `json:"tokens"` // drawn tokens (goldens bring their own)
	Seed      uint64 `json:"seed"`
	BlockSize int    `json:"block_size"`
	XDraw     string `json:"x_draw"` // how the token vectors were made
	// LayerSelection is the --layers spec; MoELayers are every MoE layer
	// of the checkpoint(s), LayersChecked those the layer checks ran on and
	// LayersNotChecked the others, which a sampled run must own up to.
	LayerSelection   string `json:"layer_selection,omitempty"`
	MoELayers        []int  `json:"moe_layers,omitempty"`
	LayersChecked    []int  `json:"layers_checked,omitempty"`
	LayersNotChecked []int  `json:"layers_not_checked,omitempty"`
	// GoldenNotChecked are the checked layers --golden gave no golden
	// tokens to (no golden file; a bank of a two-bank layer none of the
	// golden's tokens took): the layer checks ran on them against SRC
	// alone, and the report must say so.
	GoldenNotChecked []int `json:"not_checked_against_golden,omitempty"`
	// SampleExperts is --sample-experts (0: every expert was asked for).
	SampleExperts int           `json:"sample_experts,omitempty"`
	Rows          []LayerResult `json:"layers"`
	Notes         []string      `json:"notes,omitempty"`
	Seconds       float64       `json:"seconds"`
	// Timings are the layers' timings of a GPU run, in run order.
	Timings []LayerTiming `json:"timings,omitempty"`
	// Bytes is the structural proof of DST against SRC and the contract.
	Bytes *byteproof.BytesResult `json:"bytes,omitempty"`
	// Coverage sums up which experts the layer checks exercised, and
	// ExpertGaps names, per checked layer, the experts they did not.
	Coverage   *CoverageSummary `json:"coverage,omitempty"`
	ExpertGaps []ExpertGap      `json:"experts_not_exercised,omitempty"`
}

// ExpertGap is a checked layer some of whose bank experts no token
// exercised: by design with --sample-experts, else a failed layer.
type ExpertGap struct {
	Layer     int `json:"layer"`
	Exercised int `json:"exercised"`
	Total     int `json:"total"`
	// NotExercised are the bank ids no forced token reached, where forced
	// tokens ran (SRC DST runs); nil where only routed tokens ran, whose
	// choices the report does not keep.
	NotExercised []int `json:"not_exercised,omitempty"`
	// Forced: the counts are the forced tokens' (else the routed tokens').
	Forced bool `json:"forced_tokens"`
}

// mode is r.Mode, or for a report built by hand what its parts say.
func (r *Report) mode() string {
	switch {
	case r.Mode != "":
		return r.Mode
	case len(r.Rows) == 0 && r.Bytes != nil:
		return ModeBytes
	case r.Bytes != nil:
		return ModeLayersBytes
	}
	return ModeLayers
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
			bad = append(bad, fmt.Sprintf("layer %s %s (%s)", row.label(), row.Check, row.Reason))
		}
	}
	_, total := r.checkCounts()
	return exitcode.Check(fmt.Sprintf("validate: %d of %d checks failed: %s", len(bad), total, strings.Join(bad, "; ")))
}

// checkCounts counts the checks that passed and all checks: the rows and
// the byte proof.
func (r *Report) checkCounts() (pass, total int) {
	for _, row := range r.Rows {
		total++
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
	return pass, total
}

// WriteTable prints the report as an aligned table, one row per check (and
// one per MoE layer a sampled run left out), then the summary; a report
// of the byte proof alone is its result and summary.
func (r *Report) WriteTable(w io.Writer) error {
	if r.mode() != ModeBytes {
		if err := r.writeRows(w); err != nil {
			return err
		}
		if err := r.writeTimings(w); err != nil {
			return err
		}
		r.writeExperts(w)
	}
	if b := r.Bytes; b != nil {
		if b.Pass {
			writeWrapped(w, r.bytesLine())
		} else {
			fmt.Fprintf(w, "bytes: FAIL: %s\n", b.Mismatch.Error())
		}
	}
	for _, n := range r.Notes {
		if err := writeWrapped(w, "note: "+n); err != nil {
			return err
		}
	}
	// Wrapped only where a GPU's long name makes it longer than a line.
	return writeWrapped(w, r.Summary())
}

// lineWidth is the most columns a line of the report's text takes (issue
// 46): a verdict fits a terminal, its detail is in the JSON report.
const lineWidth = 100

// bytesLine is the byte proof's verdict when it passed. What the proof
// covers besides the tensors (config.json as SRC's plus the contract, the
// manifest's hashes, nothing unlisted in DST) is what a pass always
// means (validate/README.md); the JSON report has every figure.
func (r *Report) bytesLine() string {
	b := r.Bytes
	s := fmt.Sprintf("bytes: PASS: %s in %s (%s) and %s match SRC and the contract",
		human.Count(b.Tensors, "tensor"), human.Count(b.Files, "file"), human.Bytes(b.DstBytes), human.Count(b.Copies, "copied file"))
	if b.Dequantized > 0 {
		s += fmt.Sprintf("; %d dequantised, bit for bit", b.Dequantized)
	}
	return s
}

// writeWrapped writes s in lines of at most lineWidth columns, broken at
// spaces, the lines after the first indented; a word longer than a line
// (a path) stays whole.
func writeWrapped(w io.Writer, s string) error {
	_, err := io.WriteString(w, wrapText(s, lineWidth, "  "))
	return err
}

// wrapText is human.Wrap with a newline after the last line.
func wrapText(s string, width int, indent string) string {
	return human.Wrap(s, width, indent) + "\n"
}

// writeRows prints the check rows, with a row for each MoE layer not
// checked where it would stand.
func (r *Report) writeRows(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "layer\tcheck\texperts\ttokens\trel_l2\tmax_abs\tcos\ttopk\tverdict")
	skipped := r.LayersNotChecked
	why := "see the notes" // every layer was selected: a golden was missing
	if r.LayerSelection != "" && r.LayerSelection != "all" {
		why = "left out" // by --layers, which the summary and JSON name
	}
	notChecked := func(upTo int, inclusive bool) {
		for len(skipped) > 0 && (layerBefore(skipped[0], upTo) || inclusive) {
			// Every cell, so that the columns stay aligned across the row.
			fmt.Fprintf(tw, "%s\tnot checked\t-\t-\t-\t-\t-\t-\t%s\n", r.layerName(skipped[0]), why)
			skipped = skipped[1:]
		}
	}
	for _, row := range r.Rows {
		notChecked(row.Layer, false)
		layer := row.label()
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
	notChecked(0, true)
	return tw.Flush()
}

// maxListed is how many expert ids a table line names; the JSON lists all.
const maxListed = 16

// writeExperts prints which experts the layer checks exercised and, per
// layer, the ones they did not.
func (r *Report) writeExperts(w io.Writer) {
	c := r.Coverage
	if c == nil {
		return
	}
	writeWrapped(w, r.expertsLine())
	for _, g := range r.ExpertGaps {
		line := fmt.Sprintf("  layer %s: %d of %d bank experts not exercised", r.layerName(g.Layer), g.Total-g.Exercised, g.Total)
		if len(g.NotExercised) > 0 {
			ids := g.NotExercised
			more := ""
			if len(ids) > maxListed {
				ids, more = ids[:maxListed], fmt.Sprintf(", ... (%d in all; the JSON report lists every one)", len(g.NotExercised))
			}
			line += ": " + strings.ReplaceAll(intList(ids), ",", ", ") + more
		}
		writeWrapped(w, line)
	}
}

// expertsLine sums up the experts exercised over the checked layers.
func (r *Report) expertsLine() string {
	c := r.Coverage
	how := "forced tokens, both paths"
	if !c.Forced {
		how = "routed tokens only: give SRC and DST to force every expert"
	}
	s := fmt.Sprintf("experts exercised: %d of %d", c.Exercised, c.Total)
	switch {
	case c.Sample > 0:
		s += fmt.Sprintf(" (--sample-experts %d: a sample, not a proof of every expert; %s)", c.Sample, how)
	case c.Complete == c.Layers:
		s += fmt.Sprintf(", all in %s (%s)", eachLayer(c.Layers), how)
	default:
		s += fmt.Sprintf("; all in only %d of the %s (%s)", c.Complete, countLayers(c.Layers, "checked"), how)
	}
	return s
}

// eachLayer is "the 1 checked layer" or "each of the 3 checked layers".
func eachLayer(n int) string {
	if n == 1 {
		return "the 1 checked layer"
	}
	return fmt.Sprintf("each of the %d checked layers", n)
}

func countLayers(n int, adj string) string {
	if n == 1 {
		return "1 " + adj + " layer"
	}
	return fmt.Sprintf("%d %s layers", n, adj)
}

// Summary is the report's last line: the verdict and what it covers. It
// is the line people paste into tickets, so it never claims more than was
// checked, and it fits 100 columns (issue 46): the layers not checked and
// the experts not exercised are named in the table's rows and the JSON
// report, the block size and device settings in the JSON report.
func (r *Report) Summary() string {
	pass, total := r.checkCounts()
	head := fmt.Sprintf("%d/%d checks passed in %s", pass, total, human.Duration(seconds(r.Seconds)))
	if r.mode() == ModeBytes {
		if r.Bytes != nil && r.Bytes.Pass {
			return head + ": DST's bytes proven against SRC and the contract; no MoE layer was run"
		}
		return head + ": the byte proof alone; no MoE layer was run"
	}
	dev := string(r.Device)
	if r.DeviceName != "" {
		dev = fmt.Sprintf("%s: %s, %s", r.Device, r.DeviceName, r.GPUPrecision)
	}
	head += " (" + dev + ")"
	var parts []string
	parts = append(parts, r.layersPhrase())
	if c := r.Coverage; c != nil {
		switch {
		case c.Sample > 0:
			parts = append(parts, "sampled experts") // how many, the experts line says
		case c.Complete == c.Layers:
			parts = append(parts, "every expert")
		default:
			parts = append(parts, fmt.Sprintf("every expert in only %d of %d layers", c.Complete, c.Layers))
		}
	}
	switch {
	case r.Bytes != nil && r.Bytes.Pass:
		parts = append(parts, "DST's bytes proven against SRC")
		if long := head + ": " + strings.Join(parts, "; "); utf8.RuneCountInString(long) > lineWidth {
			parts[len(parts)-1] = "bytes proven" // the bytes: line above says against what
		}
	case r.Bytes != nil:
		parts = append(parts, "byte proof failed")
	case r.Src != "" && r.Dst != "":
		parts = append(parts, "byte proof skipped")
	}
	return head + ": " + strings.Join(parts, "; ")
}

// layersPhrase says which MoE layers the layer checks ran on.
func (r *Report) layersPhrase() string {
	if len(r.MoELayers) == 0 {
		// A report made by hand: count the layers its rows name.
		seen := map[int]bool{}
		for _, row := range r.Rows {
			seen[row.Layer] = true
		}
		return countLayers(len(seen), "MoE")
	}
	if len(r.LayersNotChecked) == 0 {
		if len(r.MoELayers) == 1 {
			return "the 1 MoE layer"
		}
		return fmt.Sprintf("all %d MoE layers", len(r.MoELayers))
	}
	skipped := r.layerLabels(r.LayersNotChecked)
	if utf8.RuneCountInString(skipped) > maxSkippedLabels {
		skipped = "see the table" // its rows name each one
	}
	return fmt.Sprintf("%d of %d MoE layers (not checked: %s)", len(r.LayersChecked), len(r.MoELayers), skipped)
}

// maxSkippedLabels is the longest list of layers not checked the summary
// names; a longer one is in the table's rows and the JSON report.
const maxSkippedLabels = 24

// MarshalJSON writes the report as schema moeprep.validate/v1
// (validate/SCHEMA.md): "schema" first, the verdict next, the layer
// checks' settings and layer lists only where layer checks ran.
func (r Report) MarshalJSON() ([]byte, error) {
	type layerFields struct {
		Tokens           int    `json:"tokens"`
		Seed             uint64 `json:"seed"`
		BlockSize        int    `json:"block_size"`
		XDraw            string `json:"x_draw"`
		LayerSelection   string `json:"layer_selection"`
		SampleExperts    int    `json:"sample_experts"`
		MoELayers        []int  `json:"moe_layers"`
		LayersChecked    []int  `json:"layers_checked"`
		LayersNotChecked []int  `json:"layers_not_checked"`
		GoldenNotChecked []int  `json:"not_checked_against_golden,omitempty"`
	}
	doc := struct {
		Schema       string `json:"schema"`
		Tool         string `json:"tool,omitempty"`
		Mode         string `json:"mode"`
		Failed       bool   `json:"failed"`
		ChecksPassed int    `json:"checks_passed"`
		Checks       int    `json:"checks"`
		Summary      string `json:"summary"`
		runSetup
		*layerFields
		Rows       []LayerResult          `json:"layers,omitempty"`
		Coverage   *CoverageSummary       `json:"coverage,omitempty"`
		ExpertGaps *[]ExpertGap           `json:"experts_not_exercised,omitempty"`
		Timings    []LayerTiming          `json:"timings,omitempty"`
		Bytes      *byteproof.BytesResult `json:"bytes,omitempty"`
		Notes      []string               `json:"notes"`
		Seconds    float64                `json:"seconds"`
	}{Schema: Schema, Tool: r.Tool, Mode: r.mode(), Failed: r.Failed(), Summary: r.Summary(), runSetup: r.runSetup,
		Rows: r.Rows, Coverage: r.Coverage, Timings: r.Timings, Bytes: r.Bytes, Notes: nonNil(r.Notes), Seconds: r.Seconds}
	doc.ChecksPassed, doc.Checks = r.checkCounts()
	if doc.Mode != ModeBytes {
		sel := r.LayerSelection
		if sel == "" {
			sel = "all"
		}
		doc.layerFields = &layerFields{Tokens: r.Tokens, Seed: r.Seed, BlockSize: r.BlockSize, XDraw: r.XDraw, LayerSelection: sel,
			SampleExperts: r.SampleExperts, MoELayers: nonNil(r.MoELayers), LayersChecked: nonNil(r.LayersChecked), LayersNotChecked: nonNil(r.LayersNotChecked),
			GoldenNotChecked: r.GoldenNotChecked}
		gaps := nonNil(r.ExpertGaps)
		doc.ExpertGaps = &gaps
		doc.Rows = nonNil(r.Rows)
	}
	return json.Marshal(doc)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// nonNil makes an empty list [] in JSON rather than null.
func nonNil[T any](v []T) []T {
	if v == nil {
		return []T{}
	}
	return v
}

// WriteJSON writes the report as indented JSON with the same numbers.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
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

func gb(n int64) float64 { return float64(n) / 1e9 }
