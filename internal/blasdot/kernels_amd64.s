//go:build amd64 && !noasm && !gccgo && !safe

#include "textflag.h"

// ZERO12 clears Y0-Y11, the two kernels' lanes.
#define ZERO12 \
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11

// FMA3 loads eight elements at addr into Y15 and multiply-adds them with
// Y12, Y13 and Y14 into lanes a, b and c (each lane rounded once: the
// products commute, so the order of the two factors changes no bit).
#define FMA3(addr, a, b, c) \
	VMOVUPS addr, Y15; \
	VFMADD231PS Y12, Y15, a; \
	VFMADD231PS Y13, Y15, b; \
	VFMADD231PS Y14, Y15, c

// ADDLANES adds float32 lanes y to the eight at off(DX) and stores them there.
#define ADDLANES(y, off) \
	VADDPS off(DX), y, y; \
	VMOVUPS y, off(DX)

// FOLDLANES widens float32 lanes y (x its low half) to float64 exactly,
// adds lanes j and j+4, and adds those to the four float64 lanes at
// off(DX) (Y12 and X13/Y13 are scratch).
#define FOLDLANES(x, y, off) \
	VCVTPS2PD x, Y12; \
	VEXTRACTF128 $1, y, X13; \
	VCVTPS2PD X13, Y13; \
	VADDPD Y13, Y12, Y12; \
	VADDPD off(DX), Y12, Y12; \
	VMOVUPD Y12, off(DX)

// func sdot4x3(x *float32, ldx int, w *float32, ldw int, k int, lanes *[96]float32)
//
// kernel.go's sdot4x3Go with fused multiply-adds, eight lanes a register:
// Y0-Y11 are the lanes of (token t, row r) at t*3+r, Y12-Y14 the three
// weight rows' next eight elements (read once for the four tokens), Y15 a
// token row's. VFMADD231PS rounds each lane's product-and-add once. The
// lanes start from zero and are added to lanes[(t*3+r)*8:] at the end (a
// piece's sum, added in float32): no horizontal fold per call, SgemmNT
// folds once after the last piece.
TEXT ·sdot4x3(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ ldx+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*1), R12
	LEAQ (R12)(R11*1), R13
	LEAQ (R13)(R11*1), R14
	MOVQ w+16(FP), DI
	MOVQ ldw+24(FP), R8
	SHLQ $2, R8
	LEAQ (DI)(R8*1), R9
	LEAQ (R9)(R8*1), R10
	MOVQ k+32(FP), BX
	SHLQ $2, BX
	MOVQ lanes+40(FP), DX
	ZERO12
	XORQ AX, AX
	CMPQ AX, BX
	JGE sdone
sloop:
	VMOVUPS (DI)(AX*1), Y12
	VMOVUPS (R9)(AX*1), Y13
	VMOVUPS (R10)(AX*1), Y14
	FMA3((SI)(AX*1), Y0, Y1, Y2)
	FMA3((R12)(AX*1), Y3, Y4, Y5)
	FMA3((R13)(AX*1), Y6, Y7, Y8)
	FMA3((R14)(AX*1), Y9, Y10, Y11)
	ADDQ $32, AX
	CMPQ AX, BX
	JLT sloop
sdone:
	ADDLANES(Y0, 0)
	ADDLANES(Y1, 32)
	ADDLANES(Y2, 64)
	ADDLANES(Y3, 96)
	ADDLANES(Y4, 128)
	ADDLANES(Y5, 160)
	ADDLANES(Y6, 192)
	ADDLANES(Y7, 224)
	ADDLANES(Y8, 256)
	ADDLANES(Y9, 288)
	ADDLANES(Y10, 320)
	ADDLANES(Y11, 352)
	VZEROUPPER
	RET

// func rdot3x4(x **float32, groups int, off int, w *float32, ldw int, k int, lanes *float64)
//
// kernel.go's rdot3x4Go, for each of groups groups of three token rows
// (x holds 3*groups row pointers, each row read from element off on,
// where the caller has it: no copy) against the same four weight rows: a
// piece of k (at most kc64 elements) summed with fused multiply-adds in
// eight float32 lanes from zero, then lanes j and j+4 widened to float64
// (exactly), added, and added to the float64 lane
// lanes[g*48+(t*4+r)*4+j]. Y0-Y11 are the float32 lanes of (token t, row
// r) at t*4+r, Y12-Y14 the three token rows' next eight elements, Y15 a
// weight row's; R8 walks x, CX counts the groups, DX walks lanes.
TEXT ·rdot3x4(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), R8
	MOVQ groups+8(FP), CX
	MOVQ off+16(FP), R11
	SHLQ $2, R11
	MOVQ w+24(FP), DI
	MOVQ ldw+32(FP), R9
	SHLQ $2, R9
	LEAQ (DI)(R9*1), R10
	LEAQ (R10)(R9*1), R14
	LEAQ (R14)(R9*1), R9
	MOVQ k+40(FP), BX
	SHLQ $2, BX
	MOVQ lanes+48(FP), DX
	TESTQ CX, CX
	JLE rdone
rgroup:
	MOVQ 0(R8), SI
	ADDQ R11, SI
	MOVQ 8(R8), R12
	ADDQ R11, R12
	MOVQ 16(R8), R13
	ADDQ R11, R13
	ZERO12
	XORQ AX, AX
	CMPQ AX, BX
	JGE rfold
rloop:
	VMOVUPS (SI)(AX*1), Y12
	VMOVUPS (R12)(AX*1), Y13
	VMOVUPS (R13)(AX*1), Y14
	FMA3((DI)(AX*1), Y0, Y4, Y8)
	FMA3((R10)(AX*1), Y1, Y5, Y9)
	FMA3((R14)(AX*1), Y2, Y6, Y10)
	FMA3((R9)(AX*1), Y3, Y7, Y11)
	ADDQ $32, AX
	CMPQ AX, BX
	JLT rloop
rfold:
	FOLDLANES(X0, Y0, 0)
	FOLDLANES(X1, Y1, 32)
	FOLDLANES(X2, Y2, 64)
	FOLDLANES(X3, Y3, 96)
	FOLDLANES(X4, Y4, 128)
	FOLDLANES(X5, Y5, 160)
	FOLDLANES(X6, Y6, 192)
	FOLDLANES(X7, Y7, 224)
	FOLDLANES(X8, Y8, 256)
	FOLDLANES(X9, Y9, 288)
	FOLDLANES(X10, Y10, 320)
	FOLDLANES(X11, Y11, 352)
	ADDQ $24, R8
	ADDQ $384, DX
	DECQ CX
	JNZ rgroup
rdone:
	VZEROUPPER
	RET
