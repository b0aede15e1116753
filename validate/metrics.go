package validate

import "github.com/moeprep/moeprep/validate/judge"

// The metrics and tolerances live in judge, with the table of checks; these
// names keep the root's API (and its tests) as they were.
type (
	// Diff compares an output with its reference, all in float64.
	Diff = judge.Diff
	// Tolerance is the acceptance threshold for one comparison situation.
	Tolerance = judge.Tolerance
)

// Compare computes the Diff of got against want.
func Compare(got, want []float32) Diff { return judge.Compare(got, want) }

// WeightsMatch compares routing weights for the ids both routings chose
// (judge.WeightsMatch).
func WeightsMatch(gotIDs []int32, got []float32, wantIDs []int32, want []float32, t, k int) (maxErr float64, ok bool) {
	return judge.WeightsMatch(gotIDs, got, wantIDs, want, t, k)
}

// The tolerances validate applies (judge's, where their reasons are).
var (
	TolFP32       = judge.TolFP32
	TolBF16Fold   = judge.TolBF16Fold
	TolGolden     = judge.TolGolden
	TolGPUBF16    = judge.TolGPUBF16
	TolGPUF32     = judge.TolGPUF32
	TolGPUW8A8    = judge.TolGPUW8A8
	TolW8A8Golden = judge.TolW8A8Golden
)

// The checks a report row can hold; judge.Checks has what each compares,
// its tolerance and how it is judged.
const (
	CheckFusedVsReference       = judge.FusedVsReference
	CheckCoverage               = judge.Coverage
	CheckFusedVsGolden          = judge.FusedVsGolden
	CheckReferenceVsGolden      = judge.ReferenceVsGolden
	CheckGPUFusedVsGPUUnfused   = judge.GPUFusedVsGPUUnfused
	CheckGPUCoverage            = judge.GPUCoverage
	CheckGPUFusedVsReference    = judge.GPUFusedVsReference
	CheckGPUCoverageVsReference = judge.GPUCoverageVsReference
	CheckGPUFusedVsGolden       = judge.GPUFusedVsGolden
	CheckGPUUnfusedVsGolden     = judge.GPUUnfusedVsGolden
	CheckNonFinite              = judge.NonFinite
)
