//go:build amd64 && !noasm && !gccgo && !safe

#include "textflag.h"

// The AVX-512 kernel: kernels_amd64.s's tilesAsm for a block of sixteen
// tokens, the block in one 512-bit register and twelve weight rows (two
// groups of six) at once, each row's sixteen sums in a register of its
// own. Every output lane takes the same fused multiply-adds in the same
// order as the AVX2 kernel's, and its sum is added to the accumulator the
// same way, so the two give the same bits (TestAVX512SameBits).

// ROW512 multiplies-adds element o of the weight row at r and of the row
// R14 bytes after it (the same row of the second group), broadcast, by
// the sixteen token values in Z12 into za and zb.
#define ROW512(o, r, za, zb) \
	VFMADD231PS.BCST (o*4)(r), Z12, za; \
	VFMADD231PS.BCST (o*4)(r)(R14*1), Z12, zb

// STEP512 takes element o of the piece (of the four an unrolled step
// takes): the block's sixteen token values at o*64(SI) times each of the
// twelve rows' (R8-R13 and the same R14 bytes on), row r's sums in Z(r),
// the second group's row r in Z(6+r).
#define STEP512(o) \
	VMOVUPS (o*64)(SI), Z12; \
	ROW512(o, R8, Z0, Z6); ROW512(o, R9, Z1, Z7); ROW512(o, R10, Z2, Z8); \
	ROW512(o, R11, Z3, Z9); ROW512(o, R12, Z4, Z10); ROW512(o, R13, Z5, Z11)

// MOVE512 moves the six rows' pointers n bytes along k.
#define MOVE512(n) \
	ADDQ $n, R8; ADDQ $n, R9; ADDQ $n, R10; ADDQ $n, R11; ADDQ $n, R12; ADDQ $n, R13

// ADD512 adds row sums z to the sixteen float32 at DX and stores them
// there; DX moves to the next row (CX bytes on).
#define ADD512(z) \
	VADDPS (DX), z, z; VMOVUPS z, (DX); ADDQ CX, DX

// WIDEN512 widens the sixteen float32 lanes of z (y its low half) to
// float64 exactly and adds them to the sixteen float64 at DX (Z12, Z13
// scratch); DX moves to the next row.
#define WIDEN512(y, z) \
	VCVTPS2PD y, Z12; VADDPD (DX), Z12, Z12; VMOVUPD Z12, (DX); \
	VEXTRACTF64X4 $1, z, Y13; VCVTPS2PD Y13, Z13; VADDPD 64(DX), Z13, Z13; VMOVUPD Z13, 64(DX); \
	ADDQ CX, DX

// func tiles512Asm(k int, tp *float32, w *float32, ldw int, pairs int, acc unsafe.Pointer, ld int, wide bool)
//
// tilesAsm for a block of sixteen tokens and 2*pairs groups of six weight
// rows, two groups at a time: rows r of pair q at w + (12q+r)*ldw
// elements, their sums added to acc[(12q+r)*ld+i] (float64 where wide).
// SI walks the tokens, R8-R13 the pair's first six rows along k (R14 bytes
// to the other six), AX counts the piece's bytes, DX the accumulators;
// R15 counts the pairs.
TEXT ·tiles512Asm(SB), NOSPLIT, $8-57
	MOVQ k+0(FP), BX
	SHLQ $2, BX
	MOVQ tp+8(FP), DI
	MOVQ w+16(FP), R8
	MOVQ ldw+24(FP), R14
	IMULQ $24, R14 // six rows, four bytes an element
	MOVQ pairs+32(FP), R15
	MOVQ acc+40(FP), DX
	// The accumulators' rows apart in bytes, doubled where wide.
	MOVQ ld+48(FP), CX
	SHLQ $2, CX
	MOVBLZX wide+56(FP), AX
	IMULQ CX, AX
	ADDQ AX, CX
	MOVQ CX, stride-8(SP)
pair:
	MOVQ ldw+24(FP), CX
	SHLQ $2, CX
	LEAQ (R8)(CX*1), R9
	LEAQ (R9)(CX*1), R10
	LEAQ (R10)(CX*1), R11
	LEAQ (R11)(CX*1), R12
	LEAQ (R12)(CX*1), R13
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11
	MOVQ DI, SI
	XORQ AX, AX
	MOVQ BX, CX
	ANDQ $-16, CX
loop4:
	CMPQ AX, CX
	JGE loop1
	STEP512(0); STEP512(1); STEP512(2); STEP512(3)
	ADDQ $256, SI
	ADDQ $16, AX
	MOVE512(16)
	JMP loop4
loop1:
	CMPQ AX, BX
	JGE sums
	STEP512(0)
	ADDQ $64, SI
	ADDQ $4, AX
	MOVE512(4)
	JMP loop1
sums:
	// R8 back to the pair's first row, then on to the next pair's.
	SUBQ BX, R8
	LEAQ (R8)(R14*2), R8
	MOVQ stride-8(SP), CX
	MOVBLZX wide+56(FP), AX
	TESTQ AX, AX
	JNZ sums64
	ADD512(Z0); ADD512(Z1); ADD512(Z2); ADD512(Z3); ADD512(Z4); ADD512(Z5)
	ADD512(Z6); ADD512(Z7); ADD512(Z8); ADD512(Z9); ADD512(Z10); ADD512(Z11)
	JMP next
sums64:
	WIDEN512(Y0, Z0); WIDEN512(Y1, Z1); WIDEN512(Y2, Z2); WIDEN512(Y3, Z3)
	WIDEN512(Y4, Z4); WIDEN512(Y5, Z5); WIDEN512(Y6, Z6); WIDEN512(Y7, Z7)
	WIDEN512(Y8, Z8); WIDEN512(Y9, Z9); WIDEN512(Y10, Z10); WIDEN512(Y11, Z11)
next:
	DECQ R15
	JNZ pair
	VZEROUPPER
	RET
