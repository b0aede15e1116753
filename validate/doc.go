// Package validate proves that a converted (stacked, shared-fused, rsf-folded)
// checkpoint computes the same MoE layers as its source: an unfused reference
// on the source plan and a fused path that is the CPU twin of the serving
// kernels (gate, moe_align_block_size, grouped GEMM, finalize) run on the same
// token vectors, and their outputs, routings and HF goldens are compared.
//
// The root package holds the options, the orchestration of a run and the
// report; each concern it drives lives in a subpackage that does not import
// it: cpuref (the CPU reference and fused twins, and the forced coverage
// tokens they run), gpurun (the same two paths on the GPU: staging weights
// to the device, the fused and unfused layers, their I/O timings; the root
// keeps gpu_run.go, which drives it layer by layer and judges its outputs),
// byteproof (the structural proof), stream (the CPU run's one pass over
// SRC's and DST's bytes, which pass.go plans and both feed on), tensorbytes
// (reading tensor bytes and scanning them for NaN and Inf), judge (the metrics, the tolerances and the
// one table of checks: each check's comparison, tolerance rule and
// judgement, looked up by name).
package validate
