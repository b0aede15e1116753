// Package tensorload loads what a MoE layer check reads from a checkpoint
// as float32: an expert's weight matrices (MatrixRef), decoded through
// weightfmt as their format says, whole (LoadMatrix) or kept as their
// stored bytes and decoded a band of rows at a time (LoadBands, a
// moe.Weight: what the CPU paths' products read, so that no expert is
// held in float32 whole), and vectors (LoadVector). RequantisedShared
// serves a shared expert requantised as fuse-shared requantises it.
//
// It is a package of its own because the CPU reference (cpuref) and the
// GPU run (gpurun) both load weights: one loader for both means the two
// devices decode a weight one way, and gpurun need not import the CPU
// reference to read a tensor.
package tensorload
