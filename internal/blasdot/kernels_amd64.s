//go:build amd64 && !noasm && !gccgo && !safe

#include "textflag.h"

// ROWS2 multiplies-adds element o of two weight rows (at ra, rb),
// broadcast to Y14 and Y15, by the block's sixteen token values (Y12,
// Y13) into those rows' sums: ya0, ya1 (tokens 0-7, 8-15 of row a) and
// yb0, yb1. VFMADD231PS rounds each product-and-add once.
#define ROWS2(o, ra, rb, ya0, ya1, yb0, yb1) \
	VBROADCASTSS (o*4)(ra)(AX*1), Y14; \
	VBROADCASTSS (o*4)(rb)(AX*1), Y15; \
	VFMADD231PS Y12, Y14, ya0; VFMADD231PS Y13, Y14, ya1; \
	VFMADD231PS Y12, Y15, yb0; VFMADD231PS Y13, Y15, yb1

// STEP takes element o (of the four an unrolled step takes) of the piece:
// the block's sixteen token values at o*64(SI) into Y12, Y13, times each
// of the six weight rows' (R8-R13) into Y0-Y11 (row r's tokens 0-7 in
// Y(2r), 8-15 in Y(2r+1)).
#define STEP(o) \
	VMOVUPS (o*64)(SI), Y12; VMOVUPS (o*64+32)(SI), Y13; \
	ROWS2(o, R8, R9, Y0, Y1, Y2, Y3); \
	ROWS2(o, R10, R11, Y4, Y5, Y6, Y7); \
	ROWS2(o, R12, R13, Y8, Y9, Y10, Y11)

// STEP8 is STEP for a block of eight tokens (32 bytes a step at SI, in
// Y12): row r's sums in Y(r), Y0-Y5.
#define STEP8(o) \
	VMOVUPS (o*32)(SI), Y12; \
	ROW8(o, R8, Y0); ROW8(o, R9, Y1); ROW8(o, R10, Y2); \
	ROW8(o, R11, Y3); ROW8(o, R12, Y4); ROW8(o, R13, Y5)

// ROW8 multiplies-adds element o of the weight row at r, broadcast, by
// the eight token values in Y12 into y.
#define ROW8(o, r, y) \
	VBROADCASTSS (o*4)(r)(AX*1), Y14; VFMADD231PS Y12, Y14, y

// ROWP multiplies-adds element o of weight rows r and r + R14 bytes (the
// same row of the next group), broadcast, by the eight token values in
// Y12 into ya and yb.
#define ROWP(o, r, ya, yb) \
	VBROADCASTSS (o*4)(r), Y14; VFMADD231PS Y12, Y14, ya; \
	VBROADCASTSS (o*4)(r)(R14*1), Y15; VFMADD231PS Y12, Y15, yb

// STEP8x12 is STEP8 for two groups at once (twelve rows, twelve sums in
// flight: six are too few to keep both FMA pipes busy): row r's sums in
// Y(r), the next group's row r in Y(6+r). The rows' pointers R8-R13 move
// along k (no index: R14 holds the distance between the groups).
#define STEP8x12(o) \
	VMOVUPS (o*32)(SI), Y12; \
	ROWP(o, R8, Y0, Y6); ROWP(o, R9, Y1, Y7); ROWP(o, R10, Y2, Y8); \
	ROWP(o, R11, Y3, Y9); ROWP(o, R12, Y4, Y10); ROWP(o, R13, Y5, Y11)

// PAIRSTEP moves the twelve rows' pointers n bytes along k.
#define PAIRSTEP(n) \
	ADDQ $n, R8; ADDQ $n, R9; ADDQ $n, R10; ADDQ $n, R11; ADDQ $n, R12; ADDQ $n, R13

// ADD32 adds row sums a, b (tokens 0-7, 8-15) to the sixteen float32 at
// DX and stores them there; DX moves to the next row (CX bytes on).
#define ADD32(a, b) \
	VADDPS (DX), a, a; VMOVUPS a, (DX); \
	VADDPS 32(DX), b, b; VMOVUPS b, 32(DX); \
	ADDQ CX, DX

// ADD32x1 adds the eight sums a to the eight float32 at DX (a block of
// eight tokens) and moves DX to the next row.
#define ADD32x1(a) \
	VADDPS (DX), a, a; VMOVUPS a, (DX); ADDQ CX, DX

// WIDEN widens float32 lanes y (x its low half) to float64 exactly and adds
// them to the eight float64 at off(DX) (Y12, X13/Y13 scratch).
#define WIDEN(x, y, off) \
	VCVTPS2PD x, Y12; VADDPD off(DX), Y12, Y12; VMOVUPD Y12, off(DX); \
	VEXTRACTF128 $1, y, X13; VCVTPS2PD X13, Y13; VADDPD (off+32)(DX), Y13, Y13; VMOVUPD Y13, (off+32)(DX)

// ADD64 is ADD32 for float64 sums: row sums a, b widened and added to the
// sixteen float64 at DX; ADD64x1 ADD32x1's.
#define ADD64(xa, a, xb, b) \
	WIDEN(xa, a, 0); WIDEN(xb, b, 64); \
	ADDQ CX, DX
#define ADD64x1(xa, a) \
	WIDEN(xa, a, 0); ADDQ CX, DX

// func tilesAsm(k int, tp *float32, w *float32, ldw int, groups int, acc unsafe.Pointer, ld int, wide, narrow, single bool)
//
// kernel.go's tilesGo: for each of groups groups of six weight rows
// (row r of group g at w + (6g+r)*ldw elements) against one block of
// sixteen packed tokens (token i's element p at tp[p*16+i]; narrow: eight,
// at tp[p*8+i]), the products over a piece of k elements summed in order,
// each in its own float32 lane from zero with fused multiply-adds; then
// each sum added to the caller's float32 accumulator acc[(6g+r)*ld+i] or,
// wide, widened exactly to float64 and added to the float64 one there.
// A narrow block takes two groups at once unless single is set.
// SI walks the tokens, AX the weight rows' elements (R8-R13 the group's
// rows), DX the accumulators; R15 counts the groups.
TEXT ·tilesAsm(SB), NOSPLIT, $16-59
	MOVQ k+0(FP), BX
	SHLQ $2, BX
	MOVQ tp+8(FP), DI
	// R13 starts a row before w: each group's rows start one row after
	// R13, the last row of the group before.
	MOVQ w+16(FP), R13
	MOVQ ldw+24(FP), R14
	SHLQ $2, R14
	SUBQ R14, R13
	MOVQ groups+32(FP), R15
	MOVQ acc+40(FP), DX
	// The accumulators' rows apart in bytes (ld float32, or float64 where
	// wide): the step ADD32 and ADD64 take from row to row, kept in the
	// frame (CX serves the loops).
	MOVQ ld+48(FP), CX
	SHLQ $2, CX
	MOVBLZX wide+56(FP), AX
	IMULQ CX, AX // doubled where wide
	ADDQ AX, CX
	MOVQ CX, stride-8(SP)
	// The sums' kind: 0 float32, 1 float32 of a block of eight, 2 float64,
	// 3 float64 of a block of eight.
	MOVBLZX wide+56(FP), AX
	MOVBLZX narrow+57(FP), CX
	LEAQ (CX)(AX*2), AX
	MOVQ AX, kind-16(SP)
group:
	MOVQ ldw+24(FP), R14
	SHLQ $2, R14
	LEAQ (R13)(R14*1), R8
	LEAQ (R8)(R14*1), R9
	LEAQ (R9)(R14*1), R10
	LEAQ (R10)(R14*1), R11
	LEAQ (R11)(R14*1), R12
	LEAQ (R12)(R14*1), R13
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11
	MOVQ DI, SI
	XORQ AX, AX
	MOVQ BX, R14
	ANDQ $-16, R14
	MOVBLZX narrow+57(FP), CX
	TESTQ CX, CX
	JNZ narrow
	CMPQ AX, R14
	JGE tail
loop4:
	STEP(0)
	STEP(1)
	STEP(2)
	STEP(3)
	ADDQ $256, SI
	ADDQ $16, AX
	CMPQ AX, R14
	JLT loop4
tail:
	CMPQ AX, BX
	JGE sums
loop1:
	STEP(0)
	ADDQ $64, SI
	ADDQ $4, AX
	CMPQ AX, BX
	JLT loop1
	JMP sums
// The block of eight tokens, two groups at a time where two are left
// (and single is not set): four steps at a time, then one (CX the end of
// the four-step part).
narrow:
	CMPQ R15, $2
	JLT narrow4
	MOVBLZX single+58(FP), CX
	TESTQ CX, CX
	JNZ narrow4
	MOVQ ldw+24(FP), R14
	IMULQ $24, R14 // six rows, four bytes an element
	MOVQ BX, CX
	ANDQ $-16, CX
pair4:
	CMPQ AX, CX
	JGE pair1
	STEP8x12(0); STEP8x12(1); STEP8x12(2); STEP8x12(3)
	ADDQ $128, SI
	ADDQ $16, AX
	PAIRSTEP(16)
	JMP pair4
pair1:
	CMPQ AX, BX
	JGE pairsums
	STEP8x12(0)
	ADDQ $32, SI
	ADDQ $4, AX
	PAIRSTEP(4)
	JMP pair1
pairsums:
	// R13 back to the second group's last row (the next group starts
	// after it); that group is counted here, this one at next.
	SUBQ BX, R13
	ADDQ R14, R13
	DECQ R15
	MOVQ stride-8(SP), CX
	MOVQ kind-16(SP), AX
	CMPQ AX, $2
	JLT pair32
	ADD64x1(X0, Y0); ADD64x1(X1, Y1); ADD64x1(X2, Y2); ADD64x1(X3, Y3)
	ADD64x1(X4, Y4); ADD64x1(X5, Y5); ADD64x1(X6, Y6); ADD64x1(X7, Y7)
	ADD64x1(X8, Y8); ADD64x1(X9, Y9); ADD64x1(X10, Y10); ADD64x1(X11, Y11)
	JMP next
pair32:
	ADD32x1(Y0); ADD32x1(Y1); ADD32x1(Y2); ADD32x1(Y3); ADD32x1(Y4); ADD32x1(Y5)
	ADD32x1(Y6); ADD32x1(Y7); ADD32x1(Y8); ADD32x1(Y9); ADD32x1(Y10); ADD32x1(Y11)
	JMP next
// One group of six rows: the weight rows read at AX.
narrow4:
	CMPQ AX, R14
	JGE narrow1
	STEP8(0); STEP8(1); STEP8(2); STEP8(3)
	ADDQ $128, SI
	ADDQ $16, AX
	JMP narrow4
narrow1:
	CMPQ AX, BX
	JGE sums
	STEP8(0)
	ADDQ $32, SI
	ADDQ $4, AX
	JMP narrow1
sums:
	MOVQ stride-8(SP), CX
	MOVQ kind-16(SP), AX
	CMPQ AX, $1
	JLT sums32
	JEQ sums32x1
	CMPQ AX, $3
	JEQ sums64x1
	ADD64(X0, Y0, X1, Y1); ADD64(X2, Y2, X3, Y3); ADD64(X4, Y4, X5, Y5)
	ADD64(X6, Y6, X7, Y7); ADD64(X8, Y8, X9, Y9); ADD64(X10, Y10, X11, Y11)
	JMP next
sums64x1:
	ADD64x1(X0, Y0); ADD64x1(X1, Y1); ADD64x1(X2, Y2)
	ADD64x1(X3, Y3); ADD64x1(X4, Y4); ADD64x1(X5, Y5)
	JMP next
sums32:
	ADD32(Y0, Y1); ADD32(Y2, Y3); ADD32(Y4, Y5)
	ADD32(Y6, Y7); ADD32(Y8, Y9); ADD32(Y10, Y11)
	JMP next
sums32x1:
	ADD32x1(Y0); ADD32x1(Y1); ADD32x1(Y2)
	ADD32x1(Y3); ADD32x1(Y4); ADD32x1(Y5)
next:
	DECQ R15
	JNZ group
	VZEROUPPER
	RET
