package bench

import "github.com/moeprep/moeprep/internal/numfmt"

// rng is splitmix64: fast, seedable, plenty for timing inputs (the values
// only have to be non-constant, finite and realistically spread).
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform is a float32 in (-amp, amp).
func (r *rng) uniform(amp float32) float32 {
	u := float32(r.next()>>40) / (1 << 24) // [0,1)
	return (2*u - 1) * amp
}

// RandBF16 fills dst with bf16 values uniform in (-amp, amp).
func RandBF16(dst []uint16, seed uint64, amp float32) {
	r := rng{seed}
	for i := range dst {
		dst[i] = numfmt.F32ToBF16(r.uniform(amp))
	}
}

// RandF32 fills dst with float32 values uniform in (-amp, amp).
func RandF32(dst []float32, seed uint64, amp float32) {
	r := rng{seed}
	for i := range dst {
		dst[i] = r.uniform(amp)
	}
}

// RandFP8 fills dst with float8_e4m3fn values of random sign and mantissa
// and exponent fields 1..10 (magnitudes 2^-6 .. 15): never NaN (exponent 15)
// nor subnormal, so any block scale keeps them finite.
func RandFP8(dst []byte, seed uint64) {
	r := rng{seed}
	for i := range dst {
		v := r.next()
		sign := byte(v&1) << 7
		exp := byte(1 + (v>>1)%10)
		mant := byte(v>>8) & 7
		dst[i] = sign | exp<<3 | mant
	}
}
