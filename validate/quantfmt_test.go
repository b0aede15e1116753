package validate

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
)

// What the tests of each quantised expert format share: a synth
// checkpoint from the format's spec table, every conversion of it passing
// validate with the format in its contract, every mutation of DST failing
// validate, what cannot be carried refused in one line, and the GPU
// refusing a format it has no path for.

// synthFrom writes specs[name] into a temporary directory.
func synthFrom(t *testing.T, specs map[string]fixtures.SynthSpec, name string) string {
	t.Helper()
	spec, ok := specs[name]
	if !ok {
		t.Fatalf("no synth spec %q", name)
	}
	dir := filepath.Join(t.TempDir(), name)
	if _, err := fixtures.Write(context.Background(), dir, spec, fixtures.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// conversionsPass converts src with each of runs, validates each output on
// device and hands its contract to check (nil: none).
func conversionsPass(t *testing.T, src, device string, runs []convert.Options, check func(o convert.Options, c *layout.Contract)) []*Report {
	t.Helper()
	var reps []*Report
	for _, o := range runs {
		dst := convertInto(t, src, o)
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 7, Device: device})
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		mustPass(t, rep, "validate --device "+device+" failed on a correct conversion")
		if rep.Device != device {
			t.Fatalf("%+v: ran on %s, want %s", o, rep.Device, device)
		}
		if check != nil {
			check(o, readContract(t, dst))
		}
		reps = append(reps, rep)
	}
	return reps
}

// readContract is the moeprep contract in dir's config.json.
func readContract(t *testing.T, dir string) *layout.Contract {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	c, ok, err := layout.ReadContract(cfg)
	if err != nil || !ok {
		t.Fatalf("%s: contract: %v", dir, err)
	}
	return c
}

// quantContract is what the contract of a conversion says of the routed
// experts' format.
type quantContract struct {
	quantization, weightDType, scaleDType string
	block                                 []int64 // weight_block_size; nil: none
}

// check reports where c, the contract of conversion o, says other than q.
func (q quantContract) check(t *testing.T, o convert.Options, c *layout.Contract) {
	t.Helper()
	if c.Quantization != q.quantization || c.WeightDType != q.weightDType || c.ScaleDType != q.scaleDType || !slices.Equal(c.WeightBlockSize, q.block) {
		t.Errorf("%+v: contract quantization %q weight_dtype %q scale_dtype %q weight_block_size %v, want %q %q %q %v",
			o, c.Quantization, c.WeightDType, c.ScaleDType, c.WeightBlockSize, q.quantization, q.weightDType, q.scaleDType, q.block)
	}
}

// dstMutation is one corruption of a converted checkpoint: fixture names
// the synth spec, o the conversion, mutate edits DST.
type dstMutation struct {
	name, fixture string
	o             convert.Options
	mutate        func(t *testing.T, dst string)
}

// mutationsFail runs validate on device with each byte mode on every
// mutation (or on those named only): each must fail the run, not make the
// input unusable.
func mutationsFail(t *testing.T, specs map[string]fixtures.SynthSpec, cases []dstMutation, device string, byteModes []string, only ...string) {
	for _, tc := range cases {
		if len(only) > 0 && !slices.Contains(only, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			src := synthFrom(t, specs, tc.fixture)
			dst := convertInto(t, src, tc.o)
			tc.mutate(t, dst)
			for _, bytes := range byteModes {
				rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: device, Bytes: bytes})
				if err != nil {
					t.Fatalf("bytes %s: the mutation made the input unusable instead of failing the check: %v", bytes, err)
				}
				if !rep.Failed() {
					t.Fatalf("bytes %s: mutation not caught", bytes)
				}
				if bytes != BytesOnly && rep.Device != device { // the byte proof alone runs on no device
					t.Fatalf("bytes %s: ran on %s, want %s", bytes, rep.Device, device)
				}
				worst := 0.0
				for _, r := range rep.Rows {
					if !r.Pass && r.Tolerance.MaxRelL2 > 0 && !math.IsNaN(r.RelL2) {
						worst = max(worst, r.RelL2/r.Tolerance.MaxRelL2)
					}
				}
				t.Logf("bytes %s: caught: %s (worst row %.0fx its threshold)", bytes, strings.SplitN(rep.Err().Error(), ";", 2)[0], worst)
			}
		})
	}
}

// convertRefused converts src with o into a fresh DST and fails t unless
// convert refuses it with one line containing want; it returns the refusal.
func convertRefused(t *testing.T, src string, o convert.Options, want string) error {
	t.Helper()
	o.Src, o.Dst = src, filepath.Join(t.TempDir(), "dst")
	_, err := convert.Convert(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("got %v, want one line containing %q", err, want)
	}
	return err
}

// cudaRefused: as on a machine with a GPU, validate --device cuda at
// precision prec ("": the default) refuses src and dst with an error
// containing want, before any layer runs, and --device auto then passes
// on the CPU with a note containing note.
func cudaRefused(t *testing.T, src, dst, prec, want, note string) {
	t.Helper()
	withCUDA(t, nil)
	asked := "--device cuda"
	if prec != "" {
		asked += " --precision " + prec
	}
	_, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCUDA, GPUPrecision: prec})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %v", asked, err)
	}
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: "auto", GPUPrecision: prec})
	if err != nil {
		t.Fatal(err)
	}
	mustPass(t, rep, "--device auto")
	if rep.Device != DeviceCPU || !strings.Contains(strings.Join(rep.Notes, "\n"), note) {
		t.Fatalf("--device auto ran on %s, notes %q", rep.Device, rep.Notes)
	}
}
