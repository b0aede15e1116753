package weightfmt

import "golang.org/x/sys/cpu"

// useAVX2 picks the AVX2 decoders (decode_amd64.s) over their Go twins.
// Each kernel computes every value with the same float32 operation, on the
// same operands, as its twin (a table entry picked, or one multiply), so
// the two give the same bits; TestDecodeKernelsMatchTwins holds them to it.
var useAVX2 = cpu.X86.HasAVX2

// fp4Units decodes units 8-byte units of E2M1 codes (two to a byte, the
// even element in the low nibble) to 16 float32 each, unit u through
// tab[scales[u>>shift]]: shift 1 for groups of 32 elements, 0 for 16.
//
//go:noescape
func fp4Units(raw *byte, scales *byte, tab *[256][16]float32, dst *float32, units, shift int)

// int4Groups decodes groups of wpg 32-bit words, each holding eight
// unsigned nibbles (the first element in the low nibble), to
// float32(nibble-8) * scales[group].
//
//go:noescape
func int4Groups(raw *byte, scales *float32, dst *float32, groups, wpg int)

// e4m3Codes decodes n E4M3 codes (n a multiple of 8) to their value
// times s, the two NaN codes to nanPos and nanNeg (their table entries).
//
//go:noescape
func e4m3Codes(src *byte, dst *float32, n int, s float32, nanPos, nanNeg uint32)

// bf16Widen widens n bf16 values (n a multiple of 16) to float32: the
// same bits as numfmt.BF16ToF32 of each.
//
//go:noescape
func bf16Widen(src *byte, dst *float32, n int)
