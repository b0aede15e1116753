package validate

import (
	"context"
	"math"
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
// validate, and every mutation of DST failing it.

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
				if rep.Device != device {
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
