// Package tensorload loads what a MoE layer check reads from a checkpoint
// as float32: an expert's weight matrices (MatrixRef, LoadMatrix), decoded
// through weightfmt as their format says, and vectors (LoadVector). A
// Decoder shares a decode between loads of the same bytes (SRC's expert and
// DST's copy of it). RequantisedShared serves a shared expert requantised
// as fuse-shared requantises it.
//
// It is a package of its own because the CPU reference (cpuref) and the
// GPU run (gpurun) both load weights: one loader for both means the two
// devices decode a weight one way, and gpurun need not import the CPU
// reference to read a tensor.
package tensorload
