// Package cpuref runs one MoE layer on the CPU twice on the same tokens: the
// unfused reference on the source plan, as the HF modules compute it, and
// the fused path on the converted checkpoint, the CPU twin of the serving
// kernels (gate, moe_align_block_size, grouped GEMM, finalize); PairLayer
// runs both in one pass over the bank, an expert decoded once for both
// where their bytes are the same. It also
// draws the forced coverage tokens both paths run, loads and decodes the
// weights they read, and holds the router and hash-table helpers the GPU
// paths share, so that the two devices read weights and route one way.
package cpuref
