#include "textflag.h"

// func anyAllSet(raw *byte, n int, m uint32, width int) bool
//
// Whether any element of n bytes (n a multiple of 32) has every bit of m
// set: each 32 bytes masked with m (repeated across lanes of width 1, 2
// or 4 bytes) and compared with it lane by lane.
TEXT ·anyAllSet(SB), NOSPLIT, $0-33
	MOVQ raw+0(FP), SI
	MOVQ n+8(FP), CX
	MOVL m+16(FP), AX
	MOVQ width+24(FP), DX
	VMOVQ AX, X2
	SHRQ $5, CX
	JZ none
	CMPQ DX, $1
	JEQ bytes
	CMPQ DX, $2
	JEQ words
	VPBROADCASTD X2, Y2

dwords:
	VMOVDQU (SI), Y0
	VPAND Y2, Y0, Y0
	VPCMPEQD Y2, Y0, Y0
	VPTEST Y0, Y0
	JNZ found
	ADDQ $32, SI
	DECQ CX
	JNZ dwords
	JMP none

words:
	VPBROADCASTW X2, Y2

wloop:
	VMOVDQU (SI), Y0
	VPAND Y2, Y0, Y0
	VPCMPEQW Y2, Y0, Y0
	VPTEST Y0, Y0
	JNZ found
	ADDQ $32, SI
	DECQ CX
	JNZ wloop
	JMP none

bytes:
	VPBROADCASTB X2, Y2

bloop:
	VMOVDQU (SI), Y0
	VPAND Y2, Y0, Y0
	VPCMPEQB Y2, Y0, Y0
	VPTEST Y0, Y0
	JNZ found
	ADDQ $32, SI
	DECQ CX
	JNZ bloop

none:
	VZEROUPPER
	MOVB $0, ret+32(FP)
	RET

found:
	VZEROUPPER
	MOVB $1, ret+32(FP)
	RET
