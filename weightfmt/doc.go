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
// Formats: plain.go (unquantised BF16, F16, F32: Plain), fp8block.go
// (F8_E4M3 with an F32 weight_scale_inv per 128x128 block, UE8M0 or not:
// FP8Block), fp8scaled.go (F8_E4M3 with a weight_scale per output row or
// one per weight, BF16, F16 or F32: FP8Channel, FP8Tensor), int4pack.go
// (compressed-tensors pack-quantized INT4, eight to an I32 word, a
// weight_scale per group or row: Int4Pack), mxfp4.go (E2M1 two to a byte
// with an E8M0 scale per 32, as gpt-oss, compressed-tensors and
// DeepSeek-V4 store it: MXFP4) and nvfp4.go (E2M1 with an E4M3 scale per
// 16 and a per-tensor F32 scale, ModelOpt's or compressed-tensors'
// reciprocal one: NVFP4ModelOpt, NVFP4CT). New builds the Format that a
// family.Plan or a moeprep contract names (its quantization, weight dtype,
// weight_block_size, scale_fmt, and for the newer formats the scale dtype,
// the producer's naming, and the zero points and g_idx they refuse).
//
// decode_amd64.s holds AVX2 twins of the CPU decoders that validate runs
// on every expert (MXFP4 and NVFP4's E2M1 table lookups, INT4's nibble
// times scale, FP8 E4M3 blocks, bf16 widening): each computes every value
// by the same float32 operation on the same operands as its Go loop
// (a table entry picked, one multiply, or bits moved), so the two give
// the same bits, which TestDecodeKernelsMatchTwins checks on random codes
// and scales (NaN, infinite and subnormal ones included). The Go loops run
// without AVX2 (useAVX2) and on other architectures.
//
// requant.go quantises a plain weight into a format by that format's own
// rule (a Requantiser: INT4 and the FP8 formats), streamed band by band
// through a bounded cache (Requant): fuse-shared --requantize-shared's
// shared expert, and validate's recomputation of it.
//
// Optional interfaces carry what not every format has, so that plain and
// FP8 block weights are read as before:
//
//   - GlobalScaled: a second, per-tensor scale (NVFP4's weight_scale_2 or
//     weight_global_scale): GlobalScale says its name, dtype and whether
//     it multiplies or divides, DequantiseGlobal takes its bytes, and the
//     format's plain Dequantise refuses to run without it.
//     DequantiseWeight dequantises a weight of any format; Matrix's
//     slices carry the global scale's region (Slice.Global: one entry per
//     weight, kept whole by every piece).
//   - Renamed: tensors not named as a plain checkpoint names the weight
//     (compressed-tensors' x.weight_packed and x.weight_shape, gpt-oss's
//     gate_up_proj_blocks, DeepSeek-V4's x.scale). TensorsOf names every
//     format's tensors from the plain weight name; for formats that are
//     not Renamed it gives the name itself and Scale.Name, as before.
//
// A packed format's Packing counts elements per dtype unit (8 per I32,
// 2 per U8 byte): Matrix.Shape is the stored tensor's shape ([rows,
// cols/8] I32, [rows, cols/2] U8), ColSplitExact keeps whole units, and a
// per-tensor scale's one-entry grid (Block {0, 0}) may be stored as a
// scalar or [1]. gpt-oss's blocks [E, rows, cols/32, 16] are, per expert,
// the bytes of that [rows, cols/2] matrix.
//
// Adding a format: a file that implements Format and registers its
// quantization name in init (as fp8block.go does; registerByConfig where
// its weight dtype alone does not identify it, so that Scaled leaves it to
// AllScaled), its exactValues (dequant.go's exactDequantiser: an element's
// value in float64 and whether its source values are finite, so that
// DequantRows refuses a value past float32 instead of writing an
// infinity; TestEveryScaledFormatDequantisesExactly fails without it),
// its tests, and its cases in the decode conformance suite
// (weightfmttest/cases.go: its rule written from the format's definition,
// which every decoder of it runs). Convert's
// planner and the byte proof (validate/byteproof/predictlayer.go) then stack, slice,
// prove and fold it as they ask; family/check.go checks its weights and
// scale tensors in a source checkpoint from the plan's Format (and Scaled
// for a checkpoint whose config names none); validate's CPU loaders
// (validate/tensorload: MatrixRef.Format) and the GPU bank loaders
// (validate/gpurun/bank.go: LoadFusedBank, loadMLPBankOf) are handed the
// contract's or plan's Format. Outside this package the format still needs:
// reading its quantization_config into a family.Plan (family/quant.go); the
// contract proof's own derivation of it (validate/byteproof/contractproof.go,
// independent on purpose); and, where the GPU kernels cannot take its bytes,
// a GPU decode (kernels, and kernelsTake in validate/gpurun/bank.go). A packed format (several
// elements to a dtype unit) also needs the callers' shape checks to ask
// Matrix.Shape; one with a second scale tensor per weight (GlobalScaled)
// or renamed tensors (Renamed) needs family.MLP and layout.ExpertTensors
// to name them through TensorsOf, its dequantising callers to use
// DequantiseWeight, and a gate|up join to check that the two global scales
// are equal; and the contract to record the Spec fields New reads beyond
// quantization, dtype and block where they are not a format's defaults
// (layout/contract.go records and hands New ScaleDType, as scale_dtype,
// and Naming, as naming, where ContractSpec says they differ from the
// quantization's defaults). A
// format whose Fold is FoldNowhere (MXFP4, NVFP4) leaves rsf unfolded.
package weightfmt
