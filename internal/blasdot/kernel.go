package blasdot

// The kernels in Go: what the assembly computes, operation for operation,
// so that the two give the same bits (kernel_test.go holds them to it) and
// a build without the assembly computes the same values.
//
// sdot3x3 adds to out[t*3+r] the dot product of x row t and w row r (t, r
// < 3; rows ldx and ldw apart, k a multiple of 8) in eight float32 lanes:
// lane l sums, in order, the products of the elements l, l+8, l+16, ...,
// each product rounded to float32 before it is added (a multiply, then an
// add: no fused multiply-add, which Go cannot write for float32, so that
// this twin is exact). The lanes then fold as the assembly's horizontal
// adds do: b_j = a_j + a_{j+4}, then (b0 + b1) + (b2 + b3).
func sdot3x3Go(x []float32, ldx int, w []float32, ldw int, k int, out *[9]float32) {
	for t := range 3 {
		xt := x[t*ldx : t*ldx+k]
		for r := range 3 {
			wr := w[r*ldw : r*ldw+k]
			var a [8]float32
			for p := 0; p < k; p += 8 {
				for l := range 8 {
					a[l] += float32(xt[p+l] * wr[p+l])
				}
			}
			b0, b1, b2, b3 := a[0]+a[4], a[1]+a[5], a[2]+a[6], a[3]+a[7]
			out[t*3+r] += (b0 + b1) + (b2 + b3)
		}
	}
}

// ddot4x3 adds to out[t*4+r] the dot product of x row t (t < 3) and w row
// r (r < 4), float64 values (rows ldx and ldw apart, k a multiple of 4) in
// four float64 lanes: lane l sums, in order, the products of the elements
// l, l+4, ... The operands are float32 values widened, so each product is
// exact in float64 and the assembly's fused multiply-add rounds once, as
// this add does. The lanes fold as (a0 + a2) + (a1 + a3).
func ddot4x3Go(x []float64, ldx int, w []float64, ldw int, k int, out *[12]float64) {
	for t := range 3 {
		xt := x[t*ldx : t*ldx+k]
		for r := range 4 {
			wr := w[r*ldw : r*ldw+k]
			var a [4]float64
			for p := 0; p < k; p += 4 {
				for l := range 4 {
					a[l] += xt[p+l] * wr[p+l]
				}
			}
			out[t*4+r] += (a[0] + a[2]) + (a[1] + a[3])
		}
	}
}
