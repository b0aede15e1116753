// Package tensorbytes reads a checkpoint tensor's bytes in full and scans
// them for NaN and Inf. Every path of validate (CPU, GPU, byte proof) reads
// through it, so a non-finite weight is found and named the same way
// wherever it is read. The scan looks at 32 bytes at a time (AVX2, in
// clean_amd64.s, where the CPU has it) and goes element by element only
// where a round finds an all-set exponent, to name the element.
package tensorbytes
