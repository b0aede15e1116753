//go:build !amd64

package weightfmt

// Without amd64 the decoders run their Go loops only (decode_amd64.go).
var useAVX2 = false

func fp4Units(raw *byte, scales *byte, tab *[256][16]float32, dst *float32, units, shift int) {
	panic("weightfmt: no AVX2 decoder on this architecture")
}

func int4Groups(raw *byte, scales *float32, dst *float32, groups, wpg int) {
	panic("weightfmt: no AVX2 decoder on this architecture")
}

func e4m3Codes(src *byte, dst *float32, n int, s float32, nanPos, nanNeg uint32) {
	panic("weightfmt: no AVX2 decoder on this architecture")
}

func bf16Widen(src *byte, dst *float32, n int) {
	panic("weightfmt: no AVX2 decoder on this architecture")
}
