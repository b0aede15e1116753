// Package weightfmt says how an expert weight is stored, so that the
// commands that cut, stack, prove and read weights ask one place instead of
// knowing each quantisation themselves.
//
// A Format describes one [rows, cols] (out, in) weight matrix: the element
// dtype of its tensor and how elements pack into bytes along a row, its
// scale tensor (the name after the weight's, the dtype, and the block of
// weight elements one entry covers), how to dequantise a piece of it to
// float32, and whether and where a constant factor such as rsf folds into
// it. Matrix answers the slicing questions from those facts alone: the
// bytes and scale entries of a block of rows, a block of columns or one
// expert of a stack, the scale grid of a size that is not a multiple of
// the block (ceil), and whether a split at a row or column keeps whole
// scale entries on both sides.
//
// Formats: plain.go (unquantised BF16, F16, F32: Plain) and fp8block.go
// (F8_E4M3 with an F32 weight_scale_inv per 128x128 block, UE8M0 or not:
// FP8Block). New builds the Format that a family.Plan or a moeprep contract
// names (its quantization, weight dtype, weight_block_size and scale_fmt).
//
// Adding a format: a file that implements Format and registers its
// quantization name in init (as fp8block.go does), and its tests. Convert's
// planner and the byte proof (validate/byteproof/bytes.go) then stack, slice,
// prove and fold it as they ask; family/check.go checks its weights and
// scale tensors in a source checkpoint from the plan's Format (and Scaled
// for a checkpoint whose config names none); validate's CPU loaders
// (validate/cpuref: MatrixRef.Format) and the GPU bank loaders
// (validate/gpurun/bank.go: LoadFusedBank, loadMLPBankOf) are handed the
// contract's or plan's Format. Outside this package the format still needs:
// reading its quantization_config into a family.Plan (family/quant.go); the
// contract proof's own derivation of it (validate/byteproof/contractproof.go,
// independent on purpose); and, where the GPU kernels cannot take its bytes,
// a GPU decode (kernels, and kernelsTake in validate/gpurun/bank.go). The
// GPU runner's own call sites (validate/gpurun/runner.go) still hand the
// MLP loader an FP8 block edge (loadMLPBank). A packed format (several
// elements to a dtype unit) also needs the callers' shape checks to ask
// Matrix.Shape; one with a second scale tensor per weight (NVFP4's global
// scale) or a renamed weight tensor (compressed-tensors' weight_packed)
// needs family.MLP and layout.ExpertTensors to name it.
package weightfmt
