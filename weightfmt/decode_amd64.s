#include "textflag.h"

// nibbleShifts is 0, 4, ..., 28: the shift of each of a word's eight
// nibbles (int4Groups).
DATA nibbleShifts<>+0(SB)/4, $0
DATA nibbleShifts<>+4(SB)/4, $4
DATA nibbleShifts<>+8(SB)/4, $8
DATA nibbleShifts<>+12(SB)/4, $12
DATA nibbleShifts<>+16(SB)/4, $16
DATA nibbleShifts<>+20(SB)/4, $20
DATA nibbleShifts<>+24(SB)/4, $24
DATA nibbleShifts<>+28(SB)/4, $28
GLOBL nibbleShifts<>(SB), RODATA|NOPTR, $32

// k32 holds the kernels' 32-bit constants, each broadcast where used.
DATA k32<>+0(SB)/4, $0x7F       // E4M3's exponent and mantissa; its positive NaN
DATA k32<>+4(SB)/4, $0xFF       // E4M3's negative NaN
DATA k32<>+8(SB)/4, $0x3C000000 // 120 << 23: E4M3's exponent rebiased to float32's
DATA k32<>+12(SB)/4, $0x80000000 // the sign bit
DATA k32<>+16(SB)/4, $0x3B000000 // 2^-9: an E4M3 subnormal's unit
DATA k32<>+20(SB)/4, $8          // E4M3's first normal code; int4's zero point
DATA k32<>+24(SB)/4, $15         // a nibble
DATA k32<>+28(SB)/4, $0x0F0F0F0F // a nibble in every byte
GLOBL k32<>(SB), RODATA|NOPTR, $32

// func fp4Units(raw *byte, scales *byte, tab *[256][16]float32, dst *float32, units, shift int)
//
// A unit's 8 bytes become 16 nibble indices in element order (low nibble
// first); each index picks from its scale's 16-entry row: VPERMPS of the
// row's first and second 8 entries by the index's low 3 bits, and bit 3
// (moved to the sign bit) choosing between them: the table entry itself.
TEXT ·fp4Units(SB), NOSPLIT, $0-48
	VPBROADCASTD k32<>+28(SB), X14
	MOVQ raw+0(FP), SI
	MOVQ scales+8(FP), BX
	MOVQ tab+16(FP), R8
	MOVQ dst+24(FP), DI
	MOVQ units+32(FP), R11
	XORQ DX, DX // unit
	MOVQ shift+40(FP), CX
	TESTQ R11, R11
	JZ fp4done

fp4loop:
	MOVQ DX, AX
	SHRQ CX, AX
	MOVBQZX (BX)(AX*1), AX
	SHLQ $6, AX
	VMOVUPS (R8)(AX*1), Y1    // entries 0..7
	VMOVUPS 32(R8)(AX*1), Y2  // entries 8..15
	VMOVQ (SI), X0
	VPSRLW $4, X0, X3
	VPAND X14, X0, X0
	VPAND X14, X3, X3
	VPUNPCKLBW X3, X0, X4     // lo0 hi0 lo1 hi1 ... : elements 0..15
	VPMOVZXBD X4, Y5
	VPSRLDQ $8, X4, X6
	VPMOVZXBD X6, Y6
	VPERMPS Y1, Y5, Y7
	VPERMPS Y2, Y5, Y8
	VPSLLD $28, Y5, Y9
	VBLENDVPS Y9, Y8, Y7, Y7
	VMOVUPS Y7, (DI)
	VPERMPS Y1, Y6, Y7
	VPERMPS Y2, Y6, Y8
	VPSLLD $28, Y6, Y9
	VBLENDVPS Y9, Y8, Y7, Y7
	VMOVUPS Y7, 32(DI)
	ADDQ $8, SI
	ADDQ $64, DI
	INCQ DX
	CMPQ DX, R11
	JB fp4loop

fp4done:
	VZEROUPPER
	RET

// func int4Groups(raw *byte, scales *float32, dst *float32, groups, wpg int)
//
// Each word broadcast, shifted by 0, 4, ..., 28, masked to a nibble, less
// 8, converted (exact) and multiplied by the group's scale: one float32
// multiply of the same operands as the table entry float32(u-8) * scale.
TEXT ·int4Groups(SB), NOSPLIT, $0-40
	MOVQ groups+24(FP), CX
	TESTQ CX, CX
	JZ i4done
	MOVQ wpg+32(FP), R9
	TESTQ R9, R9
	JZ i4done
	MOVQ raw+0(FP), SI
	VMOVDQU nibbleShifts<>(SB), Y10
	MOVQ scales+8(FP), BX
	VPBROADCASTD k32<>+24(SB), Y11
	MOVQ dst+16(FP), DI
	VPBROADCASTD k32<>+20(SB), Y12

i4group:
	VBROADCASTSS (BX), Y1
	MOVQ R9, DX

i4word:
	VPBROADCASTD (SI), Y0
	VPSRLVD Y10, Y0, Y0
	VPAND Y11, Y0, Y0
	VPSUBD Y12, Y0, Y0
	VCVTDQ2PS Y0, Y0
	VMULPS Y1, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $4, SI
	ADDQ $32, DI
	DECQ DX
	JNZ i4word
	ADDQ $4, BX
	DECQ CX
	JNZ i4group

i4done:
	VZEROUPPER
	RET

// func e4m3Codes(src *byte, dst *float32, n int, s float32, nanPos, nanNeg uint32)
//
// A code's value is made exactly in float32 without a subnormal operand
// (which costs a slow path on some CPUs): a normal code's exponent and
// mantissa bits, shifted into float32's and rebiased (+120), are its value;
// a subnormal code's mantissa m is m * 2^-9, converted and scaled (exact).
// The sign bit is then set, and times s the value is rounded once, as the
// table entry value * s is. The NaN codes (0x7F, 0xFF) take their table
// entries.
TEXT ·e4m3Codes(SB), NOSPLIT, $0-36
	VBROADCASTSS s+24(FP), Y10
	VBROADCASTSS nanPos+28(FP), Y11
	VBROADCASTSS nanNeg+32(FP), Y12
	VPBROADCASTD k32<>+0(SB), Y13
	VPBROADCASTD k32<>+4(SB), Y14
	VPBROADCASTD k32<>+8(SB), Y9
	VPBROADCASTD k32<>+12(SB), Y8
	VPBROADCASTD k32<>+16(SB), Y7
	VPBROADCASTD k32<>+20(SB), Y6
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ e4done

e4loop:
	VPMOVZXBD (SI), Y0
	VPAND Y13, Y0, Y1           // exponent and mantissa
	VPSLLD $20, Y1, Y2
	VPADDD Y9, Y2, Y2           // a normal code's value
	VCVTDQ2PS Y1, Y4
	VMULPS Y7, Y4, Y4           // a subnormal code's value (m * 2^-9)
	VPCMPGTD Y1, Y6, Y5         // exponent 0: 8 > code
	VBLENDVPS Y5, Y4, Y2, Y2
	VPSLLD $24, Y0, Y3
	VPAND Y8, Y3, Y3
	VPOR Y3, Y2, Y2
	VMULPS Y10, Y2, Y2
	VPCMPEQD Y13, Y0, Y3
	VBLENDVPS Y3, Y11, Y2, Y2
	VPCMPEQD Y14, Y0, Y3
	VBLENDVPS Y3, Y12, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ $8, SI
	ADDQ $32, DI
	DECQ CX
	JNZ e4loop

e4done:
	VZEROUPPER
	RET

// func bf16Widen(src *byte, dst *float32, n int)
//
// Each bf16 is the top half of its float32: zero-extended and shifted
// left 16, bits only (n a multiple of 16, two registers a round).
TEXT ·bf16Widen(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	XORQ AX, AX // element
	TESTQ CX, CX
	JZ bfdone

bfloop:
	VPMOVZXWD (SI)(AX*2), Y0
	VPMOVZXWD 16(SI)(AX*2), Y1
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VMOVDQU Y0, (DI)(AX*4)
	VMOVDQU Y1, 32(DI)(AX*4)
	ADDQ $16, AX
	CMPQ AX, CX
	JB bfloop

bfdone:
	VZEROUPPER
	RET
