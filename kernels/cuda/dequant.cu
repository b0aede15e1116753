// On-device decode of FP8 weights with one scale per output row or per run
// of rows (the fp8_channel and fp8_tensor formats, weightfmt/fp8scaled.go)
// to bf16, so the bf16 grouped GEMM runs them:
//   out[r, c] = bf16_rne(f32(e4m3(q[r, c])) * scale[(row0 + r) / rows_per_scale])
// with one f32 multiply rounded to nearest (__fmul_rn) and f32_to_bf16's
// round to nearest even: bit for bit weightfmt's Dequantise followed by
// numfmt.F32ToBF16. The e4m3 decode is exact (numfmt.E4M3ToF32: 0x7f and
// 0xff are NaN, subnormals kept, -0 keeps its sign); a NaN stays NaN.
// scale is f32, bf16 or f16 (scale_dtype 0, 1, 2: kernels.DequantScale*),
// widened exactly. rows_per_scale is 1 per channel; per tensor it is a
// weight's row count (I for each half of a fused gate-up stack, whose
// per-tensor scales are [E, 2, 1]). q and out may be rows [row0, row0 + rows)
// of a larger matrix whose scales start at scale (the loader decodes a
// weight in row chunks through a bounded scratch).
//
// Launch: moe_dequant_fp8_rows with DQ_THREADS threads a block, one block
// per (row, chunk of DQ_THREADS * 8 columns): grid = rows * ceil(cols /
// 2048). Each thread decodes 8 consecutive bytes (an 8-byte load and a
// 16-byte store when cols % 8 == 0, element by element otherwise), so a
// warp reads 256 contiguous bytes and writes 512. Go side:
// kernels/dequant.go.
#include "numeric.cuh"

#define DQ_THREADS 256
#define DQ_PER_THREAD 8
#define DQ_CHUNK (DQ_THREADS * DQ_PER_THREAD)

// numfmt.E4M3ToF32, exact: bias 7, 3 mantissa bits, no infinities.
__device__ __forceinline__ float dq_e4m3_to_f32(unsigned b)
{
    unsigned sign = (b & 0x80u) << 24;
    unsigned e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(sign | 0x7fc00000u);
    if (e == 0u) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));  // m * 2^-9, exact
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

// numfmt.F16ToF32, exact.
__device__ __forceinline__ float dq_f16_to_f32(unsigned h)
{
    unsigned sign = (h & 0x8000u) << 16;
    unsigned e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 31u) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0u) return __uint_as_float(sign | __float_as_uint((float)m * 5.9604644775390625e-8f));  // m * 2^-24, exact
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ float dq_scale(const void* scale, int dtype, long long i)
{
    switch (dtype) {
    case 1: return bf16_to_f32(((const bf16_t*)scale)[i]);
    case 2: return dq_f16_to_f32(((const unsigned short*)scale)[i]);
    default: return ((const float*)scale)[i];
    }
}

__device__ __forceinline__ unsigned dq_pair(unsigned two, float s)
{
    unsigned lo = f32_to_bf16(__fmul_rn(dq_e4m3_to_f32(two & 0xffu), s));
    unsigned hi = f32_to_bf16(__fmul_rn(dq_e4m3_to_f32((two >> 8) & 0xffu), s));
    return lo | (hi << 16);
}

extern "C" __global__ void __launch_bounds__(DQ_THREADS) moe_dequant_fp8_rows(const e4m3_t* __restrict__ q, int rows, int cols,
                                                                               const void* __restrict__ scale, int scale_dtype,
                                                                               int rows_per_scale, long long row0, bf16_t* __restrict__ out)
{
    const int chunks = (cols + DQ_CHUNK - 1) / DQ_CHUNK;
    const long long b = blockIdx.x;
    const int r = (int)(b / chunks), k = (int)(b - (long long)r * chunks);
    if (r >= rows) return;
    const float s = dq_scale(scale, scale_dtype, (row0 + r) / rows_per_scale);
    const int c0 = k * DQ_CHUNK + threadIdx.x * DQ_PER_THREAD;
    const e4m3_t* qr = q + (long long)r * cols;
    bf16_t* orow = out + (long long)r * cols;
    if ((cols & 7) == 0) {
        if (c0 >= cols) return;
        uint2 u = *(const uint2*)(qr + c0);  // 8-byte aligned: cols % 8 == 0, c0 % 8 == 0
        uint4 o;
        o.x = dq_pair(u.x, s);
        o.y = dq_pair(u.x >> 16, s);
        o.z = dq_pair(u.y, s);
        o.w = dq_pair(u.y >> 16, s);
        *(uint4*)(orow + c0) = o;  // 16-byte aligned: 2 * cols % 16 == 0
        return;
    }
#pragma unroll
    for (int i = 0; i < DQ_PER_THREAD; i++)
        if (c0 + i < cols) orow[c0 + i] = f32_to_bf16(__fmul_rn(dq_e4m3_to_f32(qr[c0 + i]), s));
}
