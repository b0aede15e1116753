// Package moe is the arithmetic of a Mixture-of-Experts layer as serving
// engines compute it, written once as plain Go on float32 slices:
//
//   - scoring.go: the router scorings (Scoring) and top-k methods
//     (TopKMethod), and the integer each scoring has in the gate kernels
//     (Scoring.Code). family's plans, validate and kernels all use these
//     types; kernels' tests hold the CUDA sources to the codes.
//   - route.go: RouteSpec, the router GEMM in float64 (RouterLogits) and
//     the gate (Route for every scoring, grouped top-k and shared router
//     rows; RouteHashed for hash-routed layers); agreement.go compares two
//     routings tie-robustly.
//   - slots.go: the fused bank's shared slots (SharedSlots: token t's slot
//     s is expert E + (t mod R)*S + s) and the slots the kernels consume.
//   - align.go: moe_align_block_size (AlignBlockSize).
//   - gemm.go, actquant.go: the grouped GEMM over the aligned blocks, in
//     float32 or in block-FP8 serving numerics (W8A8).
//   - finalize.go: the weighted sum of each token's slots.
//
// These are the CPU twins of the GPU kernels (package kernels) and the
// fused path of validate: one definition, so that a rule (a tie, a group
// score, where a shared slot goes) cannot differ between the paths that
// check each other. The package reads no checkpoint and knows no family or
// file format; callers turn those into the specs and float32 weights it
// takes. Subpackage moetest is the conformance suite every implementation
// of this math, CPU or GPU, runs.
package moe
