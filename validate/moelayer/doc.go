// Package moelayer describes one MoE layer as both of validate's paths
// (the CPU reference and fused twin in cpuref, the GPU run in gpurun) take
// it: a converted layer's tensors (FusedLayer) and router (RouterRef), how
// the layer's inputs are prepared (InputPrep), a hash-routed layer's token
// ids, the forced coverage tokens (Coverage), the contract's fused slots,
// and the paths' results (RefResult, FusedResult).
//
// It is a package of its own so that the GPU run shares these with the CPU
// paths without importing the CPU reference: what both must agree on is
// written once, here, and each path keeps only its own arithmetic.
package moelayer
