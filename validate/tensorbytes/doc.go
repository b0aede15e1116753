// Package tensorbytes reads a checkpoint tensor's bytes in full and scans
// them for NaN and Inf. Every path of validate (CPU, GPU, byte proof) reads
// through it, so a non-finite weight is found and named the same way
// wherever it is read.
package tensorbytes
