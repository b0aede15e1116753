// Package byteproof is validate's structural proof: every file and tensor of
// a converted directory predicted from the source and the moeprep contract
// alone, and compared byte for byte (folded tensors within one rounding).
// It derives the contract again on its own and does not import convert, so
// a bug in convert's planning cannot also hide in the proof of its output.
package byteproof
