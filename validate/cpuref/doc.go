// Package cpuref runs one MoE layer on the CPU twice on the same tokens: the
// unfused reference on the source plan, as the HF modules compute it, and
// the fused path on the converted checkpoint, the CPU twin of the serving
// kernels (gate, moe_align_block_size, grouped GEMM, finalize); PairLayer
// runs both in one pass over the bank, an expert's bytes held once for
// both, each path decoding them a band of rows at a time. The layer's description, its inputs and
// the forced coverage tokens (moelayer) and the loading of its weights
// (tensorload) are shared with the GPU paths, so that the two devices read
// weights and route one way.
package cpuref
