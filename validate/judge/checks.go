package judge

// The names of the checks a report row can hold (LayerResult.Check, the
// JSON's layers[].check). Each has one row in Checks.
const (
	FusedVsReference = "fused-vs-reference"
	// RequantVsReference is the error a requantised shared expert adds:
	// DST's fused path against SRC's reference with the shared expert as
	// SRC stores it (fused-vs-reference then compares against the
	// reference whose shared expert is requantised the same way); in a GPU
	// run, the reference's output with the shared expert requantised
	// against it as stored (gpu-fused-vs-reference and
	// gpu-fused-vs-gpu-unfused compare requantised with requantised).
	RequantVsReference     = "requantized-vs-reference"
	Coverage               = "coverage"
	FusedVsGolden          = "fused-vs-golden"
	ReferenceVsGolden      = "reference-vs-golden"
	GPUFusedVsGPUUnfused   = "gpu-fused-vs-gpu-unfused"
	GPUCoverage            = "gpu-coverage"
	GPUFusedVsReference    = "gpu-fused-vs-reference"
	GPUCoverageVsReference = "gpu-coverage-vs-reference"
	GPUFusedVsGolden       = "gpu-fused-vs-golden"
	GPUUnfusedVsGolden     = "gpu-unfused-vs-golden"
	// StoredVsReference, StoredCoverage and StoredVsGolden are a DST whose
	// experts are stored as SRC stores them (layout as-stored): the
	// reference run on DST's own tensors, against SRC's reference (the
	// same bytes through the same code: required bit for bit) and the
	// golden.
	StoredVsReference = "stored-vs-reference"
	StoredCoverage    = "stored-coverage"
	StoredVsGolden    = "stored-vs-golden"
	// NonFinite is the row of a layer whose weights, scales or biases hold
	// a NaN or an infinity: such a checkpoint is never certified, however
	// its outputs compare (a NaN source must not "pass" against a NaN output).
	NonFinite = "non-finite"
)

// Rule picks a check's tolerance from the Situation it ran in.
type Rule int

const (
	// NoTolerance: nothing is compared (the row fails by what it found).
	NoTolerance Rule = iota
	// PathVsPath: two moeprep paths on the same weights (DST's perhaps
	// rounded by folding): TolFP32 on the CPU, TolGPUBF16, TolGPUF32 or
	// TolGPUW8A8 on the GPU; TolBF16Fold where folding rounded DST's
	// weights and the tolerance was tighter.
	PathVsPath
	// PathVsGolden: a path that read DST (or, without DST, SRC on the GPU)
	// against HF's float32 output: TolGolden (TolBF16Fold where folding
	// rounded DST's weights), TolGPUBF16 with bf16 activations,
	// TolW8A8Golden in w8a8.
	PathVsGolden
	// ReferenceVsGoldenRule: SRC's CPU reference against HF's output:
	// TolGolden, or TolW8A8Golden when the reference ran in w8a8 numerics;
	// SRC's weights are never folded.
	ReferenceVsGoldenRule
	// RequantError: a fused path whose shared expert was requantised
	// against a reference (or golden) whose shared expert was not:
	// TolRequantINT4 or TolRequantFP8, from the format's step size.
	RequantError
)

// Tolerance is the threshold the rule sets in s.
func (r Rule) Tolerance(s Situation) Tolerance {
	switch r {
	case PathVsPath:
		switch s.Numerics {
		case GPUBF16:
			return TolGPUBF16
		case GPUW8A8:
			return TolGPUW8A8
		case GPUF32:
			return folded(TolGPUF32, s)
		}
		return folded(TolFP32, s)
	case RequantError:
		return requantTolerance(s)
	case PathVsGolden:
		if s.Requant != "" {
			return requantTolerance(s)
		}
		switch s.Numerics {
		case GPUBF16:
			return TolGPUBF16
		case GPUW8A8:
			return TolW8A8Golden
		}
		return folded(TolGolden, s)
	case ReferenceVsGoldenRule:
		if s.Numerics == GPUW8A8 {
			return TolW8A8Golden
		}
		return TolGolden
	}
	return Tolerance{}
}

// Judgement is how a check's numbers become its verdict.
type Judgement int

const (
	// NotCompared: the row records what was found instead of a comparison.
	NotCompared Judgement = iota
	// WholeOutput: relative L2 and cosine over the routed tokens' outputs
	// within the tolerance, ids tie-robustly equal and routing weights
	// within rtol 1e-4, atol 1e-5 of the other path's.
	WholeOutput
	// PerToken: every forced token's output within the tolerance on its
	// own, so a corrupted expert cannot hide in the average; the experts
	// all of whose tokens failed are named as suspects.
	PerToken
	// AgainstGolden: the output against the golden y as WholeOutput, the
	// ids and the weights (times rsf) against the golden's topk_ids and
	// topk_weights when it has them.
	AgainstGolden
)

// Check is one row of the table: a comparison validate can report.
type Check struct {
	Name     string
	Device   string // "cpu" or "gpu": where the path under test runs
	Compares string // what against what, in the report's words
	Rule     Rule
	Judged   Judgement
}

// Checks is every check validate can emit, in the order a layer's rows
// take.
var Checks = []Check{
	{FusedVsReference, "cpu", "DST fused path vs SRC unfused reference (with the shared expert requantised as DST's contract says, where it says so)", PathVsPath, WholeOutput},
	{Coverage, "cpu", "DST fused path vs SRC unfused reference on the forced tokens that exercise every expert", PathVsPath, PerToken},
	{RequantVsReference, "cpu", "DST fused path (shared expert requantised) vs SRC unfused reference with the shared expert as SRC stores it: the error requantisation adds (in a GPU run, on the layers the CPU reference checks, the reference measures it alone: its output with the shared expert requantised vs as stored)", RequantError, WholeOutput},
	{FusedVsGolden, "cpu", "DST fused path vs HF golden y", PathVsGolden, AgainstGolden},
	{ReferenceVsGolden, "cpu", "SRC unfused reference vs HF golden y", ReferenceVsGoldenRule, AgainstGolden},
	{GPUFusedVsGPUUnfused, "gpu", "DST fused on the GPU vs SRC unfused on the GPU (with the shared expert requantised as DST's contract says, where it says so)", PathVsPath, WholeOutput},
	{GPUCoverage, "gpu", "DST fused on the GPU vs SRC unfused on the GPU on the forced tokens", PathVsPath, PerToken},
	{GPUFusedVsReference, "gpu", "DST fused on the GPU vs SRC's CPU reference (sampled layers, --cpu-check; with the shared expert requantised as DST's contract says, where it says so)", PathVsPath, WholeOutput},
	{GPUCoverageVsReference, "gpu", "DST fused on the GPU vs SRC's CPU reference on the forced tokens", PathVsPath, PerToken},
	{GPUFusedVsGolden, "gpu", "DST fused on the GPU vs HF golden y", PathVsGolden, AgainstGolden},
	{GPUUnfusedVsGolden, "gpu", "SRC unfused on the GPU vs HF golden y (no DST)", PathVsGolden, AgainstGolden},
	{StoredVsReference, "cpu", "DST's experts as stored (layout as-stored) through the unfused reference vs SRC's reference: the same bytes through the same code, so any difference fails", PathVsPath, WholeOutput},
	{StoredCoverage, "cpu", "the same on the forced tokens that exercise every expert", PathVsPath, PerToken},
	{StoredVsGolden, "cpu", "DST's experts as stored through the unfused reference vs HF golden y", PathVsGolden, AgainstGolden},
	{NonFinite, "", "nothing: a weight, scale or bias the layer needs holds a NaN or Inf, so the layer fails uncomputed", NoTolerance, NotCompared},
}

// Lookup is the row of the check named name. It panics on a name with no
// row: emitting one would be a report nobody can interpret, and the root's
// tests reach every check it emits.
func Lookup(name string) Check {
	for _, c := range Checks {
		if c.Name == name {
			return c
		}
	}
	panic("judge: no check named " + name)
}

// Tolerance is the check's threshold in s.
func (c Check) Tolerance(s Situation) Tolerance { return c.Rule.Tolerance(s) }

// IsCoverage reports whether the check named name is judged per forced
// token: its rows count the experts the forced tokens exercised.
func IsCoverage(name string) bool {
	for _, c := range Checks {
		if c.Name == name {
			return c.Judged == PerToken
		}
	}
	return false
}
