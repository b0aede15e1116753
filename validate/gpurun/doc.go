// Package gpurun runs MoE layers on one GPU for validate: the fused serving
// path of a converted layer (router GEMM, gate with the contract's shared
// slots, moe_align_block_size, the grouped GEMM over the stacked bank,
// finalize) and the unfused path of a hub-layout layer (router and gate,
// then each chosen expert uploaded and run as a bank of one), both built
// from the kernels package's launches.
//
// Files: runner.go (Runner: the device, its compute and copy streams, the
// fused and unfused layers), route.go (the router GEMM and the gate on the
// device, and the forced coverage tokens), bank.go (uploading a stacked bank or one MLP
// as a Bank), stage.go (Stager: tensors streamed from a checkpoint to
// device memory through two pinned host buffers, decoding dtypes the
// kernels do not take), timing.go (LayerTiming, the I/O a stager records,
// and the I/O baseline that replays it without compute).
//
// Device memory. Every buffer a path allocates goes into a Frees that is
// released, once the compute stream has drained, when the function that
// made it returns: the unfused path's expert (its bank of one, alignment
// and scratch) as soon as that expert has run, a shared or dense MLP once
// it has run, the layer's inputs, gate outputs and rows when the layer is
// done. A layer therefore holds its fused bank, E experts as the kernels
// take them (3·I·H elements each: bf16 for a format decoded on the device,
// so 6·E·I·H bytes; one byte an element for FP8 as stored), and beside it
// only what does not grow with the expert count, or grows by a row per
// expert: one expert or shared MLP at a time (6·I·H bytes decoded), the
// grouped GEMM's rows for the layer's t·k slots (t·k·(2·I+4·H) bytes, and
// 8·t·k·I of f32 scratch for an activation run unfused), each stager's
// decode scratch (at most StageChunkBytes of codes and their scales), the
// router's E×H float32 weight, the gate's t×E choices and a latent MoE's
// two L×H float32 projections. Kimi K3 at real dims (E 896, latent H 3584,
// I 3072, t 176 with the forced tokens, k 16): the bank is 59.2 GB and the
// rest under 1 GB (the CUDA context aside).
//
// It is a package of its own so that the device code (streams, pinned
// buffers, device memory and its release) stays apart from what the run
// compares: it returns results in moelayer's types, and the root validate
// package picks the layers, runs the CPU reference beside it, judges the
// outputs and reports the timings. It does not import the root package.
package gpurun
