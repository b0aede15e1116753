//go:build amd64 && !noasm && !gccgo && !safe

#include "textflag.h"

// SSTEP(e, a0, a1): element e of the 16-wide group: x row e (16 token
// lanes) times w0[e] and w1[e], each product rounded to float32 (MULPS),
// added to the partial sums a0 and a1 (ADDPS), as DotUnitary does.
#define SSTEP(e, a0, a1) \
	VMOVUPS (e*64)(SI), Z16 \
	VBROADCASTSS (e*4)(DI), Z17 \
	VBROADCASTSS (e*4)(R8), Z18 \
	VMULPS Z16, Z17, Z19 \
	VMULPS Z16, Z18, Z20 \
	VADDPS Z19, a0, a0 \
	VADDPS Z20, a1, a1

// func sdot16x2(x *float32, w0, w1 *float32, k, chunk int, out *float32)
//
// x is [k][16] float32: sixteen token rows, transposed. For each lane and
// each of the weight rows w0 and w1 (k floats, 16-byte aligned, k and
// chunk multiples of 16) it computes what gonum's Sgemm leaves in C:
// c = 0, then for each chunk-long piece of k in order c += DotUnitary(x
// piece, w piece). DotUnitary's sums: SUM (Z0-Z3 for w0, Z8-Z11 for w1,
// one register per SSE lane) takes elements 0-3 and 8-11 of every 16,
// P_SUM (Z4-Z7, Z12-Z15) elements 4-7 and 12-15; then SUM += P_SUM, and
// the two HADDPS give (s0+s1)+(s2+s3). out is [2][16] float32.
TEXT ·sdot16x2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w0+8(FP), DI
	MOVQ w1+16(FP), R8
	MOVQ k+24(FP), CX
	MOVQ chunk+32(FP), R9
	MOVQ out+40(FP), R10
	VXORPS Z21, Z21, Z21
	VXORPS Z22, Z22, Z22
schunk:
	CMPQ CX, $0
	JE sdone
	MOVQ R9, BX
	CMPQ CX, BX
	CMOVQLT CX, BX
	SUBQ BX, CX
	SHRQ $4, BX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3
	VXORPS Z4, Z4, Z4
	VXORPS Z5, Z5, Z5
	VXORPS Z6, Z6, Z6
	VXORPS Z7, Z7, Z7
	VXORPS Z8, Z8, Z8
	VXORPS Z9, Z9, Z9
	VXORPS Z10, Z10, Z10
	VXORPS Z11, Z11, Z11
	VXORPS Z12, Z12, Z12
	VXORPS Z13, Z13, Z13
	VXORPS Z14, Z14, Z14
	VXORPS Z15, Z15, Z15
sloop:
	SSTEP(0, Z0, Z8)
	SSTEP(1, Z1, Z9)
	SSTEP(2, Z2, Z10)
	SSTEP(3, Z3, Z11)
	SSTEP(4, Z4, Z12)
	SSTEP(5, Z5, Z13)
	SSTEP(6, Z6, Z14)
	SSTEP(7, Z7, Z15)
	SSTEP(8, Z0, Z8)
	SSTEP(9, Z1, Z9)
	SSTEP(10, Z2, Z10)
	SSTEP(11, Z3, Z11)
	SSTEP(12, Z4, Z12)
	SSTEP(13, Z5, Z13)
	SSTEP(14, Z6, Z14)
	SSTEP(15, Z7, Z15)
	ADDQ $1024, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ BX
	JNZ sloop
	VADDPS Z4, Z0, Z0
	VADDPS Z5, Z1, Z1
	VADDPS Z6, Z2, Z2
	VADDPS Z7, Z3, Z3
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	VADDPS Z0, Z21, Z21
	VADDPS Z12, Z8, Z8
	VADDPS Z13, Z9, Z9
	VADDPS Z14, Z10, Z10
	VADDPS Z15, Z11, Z11
	VADDPS Z9, Z8, Z8
	VADDPS Z11, Z10, Z10
	VADDPS Z10, Z8, Z8
	VADDPS Z8, Z22, Z22
	JMP schunk
sdone:
	VMOVUPS Z21, (R10)
	VMOVUPS Z22, 64(R10)
	VZEROUPPER
	RET

// DSTEP(e, a0, a1): element e of the 8-wide group: x row e (8 token lanes,
// float64) times w0[e] and w1[e] (float64 in the scratch), added to the
// partial sums a0 and a1. The product of two floats widened to float64 is
// exact, so the fused multiply-add rounds as DdotUnitary's MULPD, ADDPD.
#define DSTEP(e, a0, a1) \
	VMOVUPD (e*64)(SI), Z16 \
	VFMADD231PD.BCST (e*8)(DI), Z16, a0 \
	VFMADD231PD.BCST (e*8)(R8), Z16, a1

// func ddot8x2(x *float64, groups int, w0, w1 *float32, k int, s *float64, out *float64)
//
// x is groups of [k][8] float64: eight token rows, transposed. w0 and w1
// (k floats, 16-byte aligned, k a multiple of 8) are widened into the
// scratch s (2k float64), then for each lane of each group it computes
// gonum's DdotUnitary(x row, w row): SUM (Z0, Z1 for w0; Z4, Z5 for w1:
// its two lanes) takes elements 0, 1, 4, 5 of every 8, P_SUM (Z2, Z3; Z6,
// Z7) elements 2, 3, 6, 7; then SUM += P_SUM and HADDPD gives the sum of
// its lanes. out is groups of [2][8] float64.
TEXT ·ddot8x2(SB), NOSPLIT, $0-56
	MOVQ k+32(FP), CX
	MOVQ s+40(FP), DI
	MOVQ w0+16(FP), SI
	MOVQ CX, BX
dcvt0:
	VCVTPS2PD (SI), Z0
	VMOVUPD Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $8, BX
	JNZ dcvt0
	MOVQ w1+24(FP), SI
	MOVQ CX, BX
dcvt1:
	VCVTPS2PD (SI), Z0
	VMOVUPD Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $8, BX
	JNZ dcvt1
	MOVQ x+0(FP), SI
	MOVQ groups+8(FP), R11
	MOVQ out+48(FP), R10
dgroup:
	MOVQ s+40(FP), DI
	LEAQ (DI)(CX*8), R8
	MOVQ CX, BX
	SHRQ $3, BX
	VXORPD Z0, Z0, Z0
	VXORPD Z1, Z1, Z1
	VXORPD Z2, Z2, Z2
	VXORPD Z3, Z3, Z3
	VXORPD Z4, Z4, Z4
	VXORPD Z5, Z5, Z5
	VXORPD Z6, Z6, Z6
	VXORPD Z7, Z7, Z7
dloop:
	DSTEP(0, Z0, Z4)
	DSTEP(1, Z1, Z5)
	DSTEP(2, Z2, Z6)
	DSTEP(3, Z3, Z7)
	DSTEP(4, Z0, Z4)
	DSTEP(5, Z1, Z5)
	DSTEP(6, Z2, Z6)
	DSTEP(7, Z3, Z7)
	ADDQ $512, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ BX
	JNZ dloop
	VADDPD Z2, Z0, Z0
	VADDPD Z3, Z1, Z1
	VADDPD Z1, Z0, Z0
	VADDPD Z6, Z4, Z4
	VADDPD Z7, Z5, Z5
	VADDPD Z5, Z4, Z4
	VMOVUPD Z0, (R10)
	VMOVUPD Z4, 64(R10)
	ADDQ $128, R10
	DECQ R11
	JNZ dgroup
	VZEROUPPER
	RET
