// Activation quantisation of the w8a8 (block-FP8 serving) mode: each row of
// a bf16 matrix x [rows, cols] is cut into groups of 128 consecutive columns
// (the last group of a row may be shorter) and each group becomes e4m3 codes
// plus one f32 scale, exactly as moe.QuantizeActGroups:
//   amax  = max(1e-10f, max |x|) in f32 (a NaN in the group makes the scale NaN)
//   scale = amax / 448 (f32 division, round to nearest)
//   code  = e4m3(x / scale): f32 division rounded to nearest, then round to
//           nearest even to e4m3 saturating at +-448 (numfmt.F32ToE4M3: NaN ->
//           0x7f, +-inf and |v| >= 448 -> +-448, -0 keeps its sign).
// q [rows, cols] receives the codes, scales [rows, ceil(cols/128)] the scales,
// both row-major. Used twice per layer in the w8a8 mode: on x [T, H] before
// gate_up (quantising per token is the same as per slot: a token's rows are
// identical) and on the bf16 intermediate [numel, I] before down.
//
// Divisions use __fdiv_rn so a --use_fast_math build cannot turn them into
// approximate reciprocals. The encoder is cvt.rn.satfinite.e4m3x2.f32 on
// sm_89 and newer (RNE, saturating to the largest finite value; its NaN
// result is replaced by 0x7f so the code does not depend on which NaN
// encoding the hardware returns) and a bit-exact software copy of
// numfmt.F32ToE4M3 elsewhere. act_quant_encode_check runs both on a list of
// f32 values (the harness compares them with a host copy of F32ToE4M3).
//
// Launch: moe_act_quant_e4m3 with 256 threads a block, one warp per (row,
// group): grid = ceil(rows * ceil(cols / 128) / 8). Each lane owns 4
// consecutive columns of its group (8-byte loads when cols % 4 == 0 and the
// group is whole; element loads otherwise).
//
// Checked on an H100 (kernels/GEMM_NOTES.md, "w8a8 on the H100"): the
// hardware encoder equals the software copy on all 2^32 f32 patterns, and
// both kernels' outputs equal moe.QuantizeActGroups bit for bit
// (scripts/wg/harness_fp8.cu, kernels TestActQuantE4M3). Go side:
// kernels/act_quant.go.
#include "numeric.cuh"

#define AQ_GROUP 128
#define AQ_THREADS 256
#define AQ_E4M3_MAX 448.0f
#define AQ_EPS 1e-10f

// numfmt.F32ToE4M3, bit for bit: RNE, saturating, NaN -> 0x7f.
__device__ __forceinline__ unsigned aq_f32_to_e4m3_sw(float f)
{
    unsigned b = __float_as_uint(f);
    unsigned sign = (b >> 24) & 0x80u;
    unsigned abs = b & 0x7fffffffu;
    if (abs > 0x7f800000u) return 0x7fu;
    if (__uint_as_float(abs) >= AQ_E4M3_MAX) return sign | 0x7eu;
    int exp = (int)(abs >> 23) - 127;
    if (exp >= -6) {  // normal e4m3: 3 mantissa bits, bias 7
        abs += 0x7ffffu + ((abs >> 20) & 1u);
        exp = (int)(abs >> 23) - 127;
        return sign | ((unsigned)(exp + 7) << 3) | ((abs >> 20) & 7u);
    }
    if (exp < -11) return sign;  // below a quarter of the smallest subnormal 2^-9
    // subnormal: value / 2^-9 = mantissa (hidden bit included) >> sh, rounded to nearest even
    unsigned m = (abs & 0x7fffffu) | 0x800000u;
    unsigned sh = (unsigned)(-exp - 9 + 23);  // 21 .. 25 for exp -7 .. -11 (numfmt's shiftRNE(m, sh))
    unsigned q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | q;  // q <= 8: 8 is the smallest normal's code 0x08
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Hardware RNE + saturation. cvt.rn.satfinite.e4m3x2.f32 d, a, b puts e4m3(a)
// in d's upper byte and e4m3(b) in the lower byte.
__device__ __forceinline__ unsigned aq_f32_to_e4m3(float f)
{
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(f));
    return f != f ? 0x7fu : (unsigned)(r & 0xffu);
}
#define AQ_HW_ENCODER 1
#else
__device__ __forceinline__ unsigned aq_f32_to_e4m3(float f) { return aq_f32_to_e4m3_sw(f); }
#endif

extern "C" __global__ void __launch_bounds__(AQ_THREADS) moe_act_quant_e4m3(const bf16_t* __restrict__ x, int rows, int cols,
                                                                             e4m3_t* __restrict__ q, float* __restrict__ scales)
{
    const int lane = threadIdx.x & 31;
    const int ng = (cols + AQ_GROUP - 1) / AQ_GROUP;
    const long long w = (long long)blockIdx.x * (AQ_THREADS / 32) + (threadIdx.x >> 5);
    if (w >= (long long)rows * ng) return;  // warp-uniform
    const int r = (int)(w / ng), g = (int)(w - (long long)r * ng);
    const int c0 = g * AQ_GROUP + lane * 4;
    const bf16_t* xr = x + (long long)r * cols;
    float v[4];
    const bool whole = (cols & 3) == 0 && (g + 1) * AQ_GROUP <= cols;  // warp-uniform
    if (whole) {
        uint2 u = *(const uint2*)(xr + c0);  // 8-byte aligned: cols % 4 == 0, c0 % 4 == 0
        v[0] = __uint_as_float(u.x << 16);
        v[1] = __uint_as_float(u.x & 0xffff0000u);
        v[2] = __uint_as_float(u.y << 16);
        v[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = c0 + i < cols && c0 + i < (g + 1) * AQ_GROUP ? bf16_to_f32(xr[c0 + i]) : 0.0f;
    }
    // amax over the group; columns past the group read as 0, which cannot raise it.
    float amax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = fabsf(v[i]);
        nan |= a != a;
        amax = fmaxf(amax, a);  // fmaxf drops NaN: tracked apart
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    nan = __any_sync(0xffffffffu, nan);
    amax = fmaxf(amax, AQ_EPS);
    const float s = nan ? __uint_as_float(0x7fc00000u) : __fdiv_rn(amax, AQ_E4M3_MAX);
    if (lane == 0) scales[(long long)r * ng + g] = s;
    unsigned code[4];
#pragma unroll
    for (int i = 0; i < 4; i++) code[i] = aq_f32_to_e4m3(__fdiv_rn(v[i], s));
    e4m3_t* qr = q + (long long)r * cols;
    if (whole) {
        *(unsigned*)(qr + c0) = code[0] | (code[1] << 8) | (code[2] << 16) | (code[3] << 24);  // 4-byte aligned
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (c0 + i < cols && c0 + i < (g + 1) * AQ_GROUP) qr[c0 + i] = (e4m3_t)code[i];
    }
}

// Test hook: hw[i] = the encoder the kernels use (hardware on sm_89+),
// sw[i] = the software copy, for f32 bit patterns in[0..n).
extern "C" __global__ void act_quant_encode_check(const unsigned* in, int n, e4m3_t* hw, e4m3_t* sw)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float f = __uint_as_float(in[i]);
    hw[i] = (e4m3_t)aq_f32_to_e4m3(f);
    sw[i] = (e4m3_t)aq_f32_to_e4m3_sw(f);
}
