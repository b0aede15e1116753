package validate

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestCPUCheckOption: --cpu-check takes auto (also empty), none and all in
// any case, and refuses anything else naming the flag.
func TestCPUCheckOption(t *testing.T) {
	tests := []struct {
		in, want CPUCheckMode
		err      string
	}{
		{"", CPUCheckAuto, ""},
		{"auto", CPUCheckAuto, ""},
		{" None ", CPUCheckNone, ""},
		{"ALL", CPUCheckAll, ""},
		{"some", "", `--cpu-check "some"`},
		{"first", "", "want auto, none or all"},
	}
	for _, tt := range tests {
		o := Options{Src: "a", Dst: "b", CPUCheck: tt.in}
		err := o.checkRest()
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: error %v, want one containing %q", tt.in, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.in, err)
		case tt.err == "" && o.CPUCheck != tt.want:
			t.Errorf("%q: normalised to %q, want %q", tt.in, o.CPUCheck, tt.want)
		}
	}
}

// TestRefSampledModes: none samples no layer, all samples every layer even
// past 4, auto keeps the first and the last (all when <= 4).
func TestRefSampledModes(t *testing.T) {
	six := []target{{index: 3}, {index: 4}, {index: 5}, {index: 6}, {index: 7}, {index: 61}}
	tests := []struct {
		mode CPUCheckMode
		want []int
	}{
		{CPUCheckNone, nil},
		{CPUCheckAll, []int{3, 4, 5, 6, 7, 61}},
		{CPUCheckAuto, []int{3, 61}},
		{"", []int{3, 61}},
	}
	for _, tt := range tests {
		got := refSampled(six, tt.mode)
		if len(got) != len(tt.want) {
			t.Errorf("%q: sampled %v, want %v", tt.mode, got, tt.want)
		}
		for _, i := range tt.want {
			if !got[i] {
				t.Errorf("%q: layer %d not sampled (%v)", tt.mode, i, got)
			}
		}
	}
	if got := refSampled(six[:3], CPUCheckNone); len(got) != 0 {
		t.Errorf("none on 3 layers sampled %v", got)
	}
}

// TestReportTimings: the timings reach the JSON under their names (the
// replay list does not), the table gets a timing section with the ratio
// only when a baseline ran, and the progress line carries the numbers.
func TestReportTimings(t *testing.T) {
	tm := LayerTiming{Layer: 3, DstBytes: 11_630_000_000, SrcBytes: 9_700_000_000, DstIOSeconds: 1.99, BankWaitSeconds: 0.25,
		SrcIOSeconds: 1.9, ComputeSeconds: 0.125, WallSeconds: 2.4, IOBaselineSeconds: 3.2, IOBaselineBytes: 21_330_000_000,
		Ratio: 0.75, Staged: []gpurun.StagedTensor{{T: &checkpoint.Tensor{Name: "x"}}}}
	rep := &Report{runSetup: runSetup{Device: DeviceCUDA, CPUCheck: CPUCheckNone}, BlockSize: 64, Timings: []LayerTiming{tm},
		Rows: []LayerResult{{Layer: 3, Check: judge.GPUFusedVsGPUUnfused, Pass: true, TopK: 1}}}
	var jb jsonBuf
	if err := rep.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	var back struct {
		CPUCheck string           `json:"cpu_check"`
		Timings  []map[string]any `json:"timings"`
	}
	if err := json.Unmarshal(jb, &back); err != nil {
		t.Fatalf("%v\n%s", err, jb)
	}
	if back.CPUCheck != string(CPUCheckNone) || len(back.Timings) != 1 {
		t.Fatalf("JSON: %s", jb)
	}
	want := map[string]float64{"layer": 3, "dst_bytes": 11.63e9, "src_bytes": 9.7e9, "dst_io_seconds": 1.99, "bank_wait_seconds": 0.25,
		"src_io_seconds": 1.9, "compute_seconds": 0.125, "wall_seconds": 2.4, "io_baseline_seconds": 3.2, "io_baseline_bytes": 21.33e9, "ratio": 0.75}
	got := back.Timings[0]
	for k, v := range want {
		if f, ok := got[k].(float64); !ok || f != v {
			t.Errorf("timings[0].%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("timings[0] has fields %v, want exactly %d (reference_seconds omitted when 0)", got, len(want))
	}

	var tb jsonBuf
	if err := rep.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"io_baseline_s", "ratio", "11.63", "9.70", "0.125", "3.20", "0.75"} {
		if !strings.Contains(tb.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, tb)
		}
	}
	rep.Timings[0].IOBaselineSeconds, rep.Timings[0].Ratio = 0, 0
	tb = nil
	rep.WriteTable(&tb)
	if !strings.Contains(tb.String(), "wall_s") || strings.Contains(tb.String(), "io_baseline_s") {
		t.Errorf("table without a baseline:\n%s", tb)
	}
	rep.Timings = nil
	tb = nil
	rep.WriteTable(&tb)
	if strings.Contains(tb.String(), "wall_s") {
		t.Errorf("timing table without timings:\n%s", tb)
	}

	line := tm.Line()
	for _, s := range []string{"layer 3:", "read+upload 21.3 GB", "dst 11.6 GB in 1.99s", "waited 0.25s", "src 9.70 GB in 1.90s", "compute 0.125s", "wall 2.40s",
		"io baseline 21.3 GB in 3.20s (6.67 GB/s), ratio 0.75"} {
		if !strings.Contains(line, s) {
			t.Errorf("line lacks %q: %s", s, line)
		}
	}
	if io := tm.IOSeconds(); math.Abs(io-3.89) > 1e-12 {
		t.Errorf("IOSeconds %v, want 3.89", io)
	}
}

// TestIOBaselineOnCPU: --io-baseline on a CPU run leaves a note and no
// timings; the report's cpu_check is empty (the CPU always runs the reference).
func TestIOBaselineOnCPU(t *testing.T) {
	src := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	rep, err := Run(context.Background(), Options{Src: src, Golden: src, Device: "cpu", IOBaseline: true, CPUCheck: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Timings) != 0 || rep.CPUCheck != "" || rep.Failed() {
		t.Errorf("timings %v, cpu_check %q, failed %v", rep.Timings, rep.CPUCheck, rep.Failed())
	}
	found := false
	for _, n := range rep.Notes {
		found = found || strings.Contains(n, "no I/O baseline")
	}
	if !found {
		t.Errorf("notes %q lack the I/O baseline note", rep.Notes)
	}
}

// TestGPUTimings: a GPU run with --cpu-check none runs no CPU reference,
// times every layer (DST bytes = the layer's bank tensors exactly, SRC
// bytes at least one expert), and the I/O baseline replays exactly those
// bytes; ratio = wall / baseline.
func TestGPUTimings(t *testing.T) {
	needGPU(t)
	src := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	dst := convertInto(t, src, convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 4})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: "cuda", CPUCheck: CPUCheckNone, IOBaseline: true, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() || rep.CPUCheck != CPUCheckNone {
		t.Fatalf("failed %v (%v), cpu_check %q", rep.Failed(), rep.Err(), rep.CPUCheck)
	}
	for _, r := range rep.Rows {
		if r.Check != judge.GPUFusedVsGPUUnfused && r.Check != judge.GPUCoverage {
			t.Errorf("--cpu-check none ran %s", r.Check)
		}
	}
	ck := cktest.Open(t, dst)
	c, _, err := layout.ReadContract(ck.Config)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Timings) != len(c.Layers) || len(rep.Rows) != 2*len(c.Layers) {
		t.Fatalf("%d timings, %d rows for %d layers (want a routed and a coverage row each)", len(rep.Timings), len(rep.Rows), len(c.Layers))
	}
	for i, tm := range rep.Timings {
		n := c.Names(c.Layers[i])
		var bank int64
		for _, name := range []string{n.Weight(layout.ProjGateUp), n.Weight(layout.ProjGate), n.Weight(layout.ProjUp), n.Weight(layout.ProjDown), n.Get(layout.ProjGateUp, layout.RoleScale), n.Get(layout.ProjGate, layout.RoleScale), n.Get(layout.ProjUp, layout.RoleScale), n.Get(layout.ProjDown, layout.RoleScale)} {
			if x, ok := ck.Tensor(name); name != "" && ok {
				bank += x.NumElements() * int64(x.DType.Size())
			}
		}
		t.Logf("%s", tm.Line())
		switch {
		case tm.Layer != c.Layers[i].Index:
			t.Errorf("timing %d is layer %d, want %d", i, tm.Layer, c.Layers[i].Index)
		case bank == 0 || tm.DstBytes != bank:
			t.Errorf("layer %d: dst bytes %d, the bank's tensors hold %d", tm.Layer, tm.DstBytes, bank)
		case tm.SrcBytes <= 0 || tm.IOBaselineBytes != tm.DstBytes+tm.SrcBytes:
			t.Errorf("layer %d: src bytes %d, baseline bytes %d", tm.Layer, tm.SrcBytes, tm.IOBaselineBytes)
		case tm.WallSeconds <= 0 || tm.IOBaselineSeconds <= 0 || math.Abs(tm.Ratio-tm.WallSeconds/tm.IOBaselineSeconds) > 1e-12:
			t.Errorf("layer %d: wall %v baseline %v ratio %v", tm.Layer, tm.WallSeconds, tm.IOBaselineSeconds, tm.Ratio)
		case tm.ReferenceSeconds != 0:
			t.Errorf("layer %d: the CPU reference ran (%vs)", tm.Layer, tm.ReferenceSeconds)
		}
	}
}
