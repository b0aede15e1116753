// Package gpurun runs MoE layers on one GPU for validate: the fused serving
// path of a converted layer (router GEMM, gate with the contract's shared
// slots, moe_align_block_size, the grouped GEMM over the stacked bank,
// finalize) and the unfused path of a hub-layout layer (router and gate,
// then each chosen expert uploaded and run as a bank of one), both built
// from the kernels package's launches.
//
// Files: runner.go (Runner: the device, its compute and copy streams, the
// fused and unfused layers), bank.go (uploading a stacked bank or one MLP
// as a Bank), stage.go (Stager: tensors streamed from a checkpoint to
// device memory through two pinned host buffers, decoding dtypes the
// kernels do not take), timing.go (LayerTiming, the I/O a stager records,
// and the I/O baseline that replays it without compute).
//
// It is a package of its own so that the device code (streams, pinned
// buffers, device memory and its release) stays apart from what the run
// compares: it returns results in moelayer's types, and the root validate
// package picks the layers, runs the CPU reference beside it, judges the
// outputs and reports the timings. It does not import the root package.
package gpurun
