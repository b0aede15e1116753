// Package moetest is a conformance suite for implementations of package
// moe's math: the CPU twins in moe run it in moe's tests, and the GPU
// kernels run the same suite through adapters in kernels' tests.
//
// Each TestX function takes a *testing.T and a small interface (Router,
// Aligner, GroupedGEMMer, Finalizer), runs a table of cases (hand-worked
// values, random data, exact ties, NaN, edge sizes, every scoring, hash
// routing, shared slots, inputs the implementation must refuse) and compares
// the answers with references written here, independently of moe, in
// float64. Every tolerance is stated where it is checked, with the rounding
// it allows for.
//
// An implementation that does not take some case (the GPU's size limits, a
// kernel variant without hash routing) returns an error wrapping
// ErrUnsupported, and the case is skipped; one that takes none fails.
package moetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
)

// ErrUnsupported is what an implementation returns, wrapped, for a case it
// does not take; the suite skips the case.
var ErrUnsupported = errors.New("moetest: not supported by this implementation")

// skipped reports whether err says the case is not taken, and skips it.
func skipped(t *testing.T, err error) bool {
	t.Helper()
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
		return true
	}
	return false
}

// runCases runs each case as a subtest and fails when every one was
// skipped: an implementation that takes nothing conforms to nothing.
func runCases(t *testing.T, n int, name func(i int) string, run func(t *testing.T, i int)) {
	t.Helper()
	ran := 0
	for i := range n {
		t.Run(name(i), func(t *testing.T) {
			defer func() { // runs after t.Skip too
				if !t.Skipped() {
					ran++
				}
			}()
			run(t, i)
		})
	}
	if ran == 0 {
		t.Errorf("none of %d cases ran", n)
	}
}

// caseRand is case i's random stream: the same data whichever cases run.
func caseRand(suite uint64, i int) *rand.Rand {
	return rand.New(rand.NewPCG(suite, uint64(i)))
}

// bf16Normal draws n values N(0, std^2) rounded to bfloat16, so that every
// checkpoint dtype but FP8 holds them exactly and an implementation that
// rounds its inputs to bf16 computes on the same numbers.
func bf16Normal(r *rand.Rand, n int, std float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = numfmt.RoundBF16(float32(r.NormFloat64() * std))
	}
	return v
}

// closeRel reports whether got is within rtol of want relative to want's
// magnitude (both NaN counts as equal: NaN must propagate, not vanish).
func closeRel(got float32, want, rtol float64) bool {
	g := float64(got)
	if math.IsNaN(want) || math.IsNaN(g) {
		return math.IsNaN(want) && math.IsNaN(g)
	}
	return math.Abs(g-want) <= rtol*math.Abs(want)
}

// errorList collects a case's mismatches and reports the first few.
type errorList struct {
	n    int
	msgs []string
}

func (e *errorList) add(format string, args ...any) {
	e.n++
	if len(e.msgs) < 5 {
		e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
	}
}

func (e *errorList) report(t *testing.T) {
	t.Helper()
	for _, m := range e.msgs {
		t.Error(m)
	}
	if e.n > len(e.msgs) {
		t.Errorf("... %d mismatches in all", e.n)
	}
}
