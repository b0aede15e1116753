// On-device decode of quantised expert weights to bf16, so the bf16
// grouped GEMM runs them. Every kernel here is bit for bit its format's
// Dequantise (weightfmt) followed by numfmt.F32ToBF16: each f32 product is
// one multiply rounded to nearest (__fmul_rn, never fused or reordered),
// then f32_to_bf16's round to nearest even. A NaN stays NaN (its payload
// may differ from the CPU's).
//
// FP8 with one scale per output row or per run of rows (fp8_channel and
// fp8_tensor, weightfmt/fp8scaled.go):
//   out[r, c] = bf16_rne(f32(e4m3(q[r, c])) * scale[(row0 + r) / rows_per_scale])
// The e4m3 decode is exact (numfmt.E4M3ToF32: 0x7f and 0xff are NaN,
// subnormals kept, -0 keeps its sign). scale is f32, bf16 or f16
// (scale_dtype 0, 1, 2: kernels.DequantScale*), widened exactly.
// rows_per_scale is 1 per channel; per tensor it is a weight's row count
// (I for each half of a fused gate-up stack, whose per-tensor scales are
// [E, 2, 1]). q and out may be rows [row0, row0 + rows) of a larger matrix
// whose scales start at scale (the loader decodes a weight in row chunks
// through a bounded scratch).
//
// Launch: moe_dequant_fp8_rows with DQ_THREADS threads a block, one block
// per (row, chunk of DQ_THREADS * 8 columns): grid = rows * ceil(cols /
// 2048). Each thread decodes 8 consecutive bytes (an 8-byte load and a
// 16-byte store when cols % 8 == 0, element by element otherwise), so a
// warp reads 256 contiguous bytes and writes 512.
//
// 4-bit weights (one template, dq4_rows, over three decoders): rows of
// cols elements packed eight to a little-endian 32-bit word, element 8j+k
// in bits 4k..4k+3 of word j (compressed-tensors' INT4 words and the FP4
// bytes of MXFP4 and NVFP4, even element in the low nibble, are the same
// bits), ceil(cols / 8) words a row; a scale grid [rows, cols / group]
// (row-major, one row per weight row: the loader uploads a chunk's rows of
// both). Per element n (the nibble) with its group's scale:
//   int4  (weightfmt/int4pack.go): f32(n - 8) * s, s f32/bf16/f16
//         widened exactly; group = cols for one scale a row
//   mxfp4 (weightfmt/mxfp4.go):    e2m1(n) * 2^(e - 127), e the E8M0 byte
//         (0xff NaN, 0 the subnormal 2^-127), group 32
//   nvfp4 (weightfmt/nvfp4.go):    e2m1(n) * eff, eff = f32(e4m3(s) *
//         global) (ModelOpt's weight_scale_2; / global for
//         compressed-tensors), rounded to f32 first, group 16;
//         global[(row0 + r) / rows_per_global] is the row's weight's
//         per-tensor scale (one per expert, or per half of a gate-up stack)
// Launch: one thread a word, DQ_THREADS threads a block, one block per
// (row, chunk of DQ_THREADS words): grid = rows * ceil(ceil(cols / 8) /
// 256). A warp reads 128 contiguous bytes and writes 512 (one 16-byte
// store a thread where the row's 8 outputs are whole and aligned).
//
// MXFP8 (moe_dequant_mxfp8_rows, below dq_e8m0_to_f32): E4M3 bytes times
// an E8M0 scale per 32 columns of a row.
//
// FP8 in blocks of any size (moe_dequant_fp8_blocks, below it): E4M3 bytes
// times their block's F32 or E8M0 scale.
//
// Go side: kernels/dequant.go.
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

// dq_store8 decodes the 8 codes of row qr from column c0 with one scale s
// into orow: one 8-byte load and one 16-byte store (c0 % 8 == 0 and a row
// length that keeps both aligned: cols % 8 == 0).
__device__ __forceinline__ void dq_store8(const e4m3_t* __restrict__ qr, int c0, float s, bf16_t* __restrict__ orow)
{
    uint2 u = *(const uint2*)(qr + c0);
    uint4 o;
    o.x = dq_pair(u.x, s);
    o.y = dq_pair(u.x >> 16, s);
    o.z = dq_pair(u.y, s);
    o.w = dq_pair(u.y >> 16, s);
    *(uint4*)(orow + c0) = o;
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
        dq_store8(qr, c0, s, orow);
        return;
    }
#pragma unroll
    for (int i = 0; i < DQ_PER_THREAD; i++)
        if (c0 + i < cols) orow[c0 + i] = f32_to_bf16(__fmul_rn(dq_e4m3_to_f32(qr[c0 + i]), s));
}

// numfmt.E2M1ToF32, exact: bit 3 the sign, bits 0-2 index
// [0, 0.5, 1, 1.5, 2, 3, 4, 6] (code 8 is -0).
__device__ __forceinline__ float dq_e2m1_to_f32(unsigned n)
{
    unsigned e = (n >> 1) & 3u, m = n & 1u;
    unsigned mag = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(((n & 8u) << 28) | mag);
}

// numfmt.E8M0ToF32, exact: 2^(e - 127), 0xff NaN.
__device__ __forceinline__ float dq_e8m0_to_f32(unsigned e)
{
    if (e == 255u) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(e ? e << 23 : 0x00400000u);
}

// MXFP8 (weightfmt/mxfp8.go): rows of cols E4M3 bytes, cols a multiple of
// 32, and their scale grid [rows, cols / 32] of E8M0 bytes (row-major;
// the loader uploads a chunk's rows of both):
//   out[r, c] = bf16_rne(f32(e4m3(q[r, c])) * 2^(scale[r, c / 32] - 127))
// 0xff scales are NaN, 0 the subnormal 2^-127. Launch as
// moe_dequant_fp8_rows: grid = rows * ceil(cols / 2048), each thread 8
// bytes, which lie in one group of 32 (c0 % 8 == 0) and are 8-byte
// aligned, their 16 output bytes 16-byte aligned (cols % 32 == 0).
extern "C" __global__ void __launch_bounds__(DQ_THREADS) moe_dequant_mxfp8_rows(const e4m3_t* __restrict__ q, int rows, int cols,
                                                                                const unsigned char* __restrict__ scale, bf16_t* __restrict__ out)
{
    const int chunks = (cols + DQ_CHUNK - 1) / DQ_CHUNK;
    const long long b = blockIdx.x;
    const int r = (int)(b / chunks), k = (int)(b - (long long)r * chunks);
    if (r >= rows) return;
    const int c0 = k * DQ_CHUNK + threadIdx.x * DQ_PER_THREAD;
    if (c0 >= cols) return;
    dq_store8(q + (long long)r * cols, c0, dq_e8m0_to_f32(scale[(long long)r * (cols >> 5) + (c0 >> 5)]), out + (long long)r * cols);
}

// FP8 in blocks of block_rows x block_cols (weightfmt/fp8block.go, any
// block size: DeepSeek-V4.1's 32x32 with E8M0 x.scale; 128x128 runs
// through the FP8 GEMM as stored and is decoded here only in tests):
//   out[r, c] = bf16_rne(f32(e4m3(q[r, c])) * scale[w][rr / block_rows][c / block_cols])
// where row row0 + r of the launch is row rr of weight w of a stack of
// weights of rows_per_weight rows each (one weight: rows_per_weight the
// row count), each weight's grid [ceil(rows_per_weight / block_rows),
// ceil(cols / block_cols)] row-major (ragged edge blocks, as weightfmt's
// DequantE4M3). scale_dtype 0-2 as moe_dequant_fp8_rows', 3 E8M0
// (kernels.DequantScaleE8M0: 2^(e - 127), 255 NaN, 0 the subnormal
// 2^-127), widened exactly. Launch as moe_dequant_fp8_rows: grid = rows *
// ceil(cols / 2048), each thread 8 bytes; when cols and block_cols are
// multiples of 8 a thread's 8 bytes lie in one block and take one scale.
__device__ __forceinline__ float dq_block_scale(const void* scale, int dtype, long long i)
{
    if (dtype == 3) return dq_e8m0_to_f32(((const unsigned char*)scale)[i]);
    return dq_scale(scale, dtype, i);
}

extern "C" __global__ void __launch_bounds__(DQ_THREADS) moe_dequant_fp8_blocks(const e4m3_t* __restrict__ q, int rows, int cols,
                                                                                 const void* __restrict__ scale, int scale_dtype,
                                                                                 int block_rows, int block_cols, int rows_per_weight,
                                                                                 long long row0, bf16_t* __restrict__ out)
{
    const int chunks = (cols + DQ_CHUNK - 1) / DQ_CHUNK;
    const long long b = blockIdx.x;
    const int r = (int)(b / chunks), k = (int)(b - (long long)r * chunks);
    if (r >= rows) return;
    const long long gr = row0 + r, w = gr / rows_per_weight;
    const int rr = (int)(gr - w * rows_per_weight);
    const long long grid_rows = ((long long)rows_per_weight + block_rows - 1) / block_rows;
    const long long grid_cols = ((long long)cols + block_cols - 1) / block_cols;
    const long long srow = (w * grid_rows + rr / block_rows) * grid_cols;
    const int c0 = k * DQ_CHUNK + threadIdx.x * DQ_PER_THREAD;
    const e4m3_t* qr = q + (long long)r * cols;
    bf16_t* orow = out + (long long)r * cols;
    if ((cols & 7) == 0 && (block_cols & 7) == 0) {
        if (c0 >= cols) return;
        dq_store8(qr, c0, dq_block_scale(scale, scale_dtype, srow + c0 / block_cols), orow);
        return;
    }
#pragma unroll
    for (int i = 0; i < DQ_PER_THREAD; i++)
        if (c0 + i < cols)
            orow[c0 + i] = f32_to_bf16(__fmul_rn(dq_e4m3_to_f32(qr[c0 + i]), dq_block_scale(scale, scale_dtype, srow + (c0 + i) / block_cols)));
}

// The three 4-bit decoders: a row's group scale, and an element's value
// from its nibble and that scale. groups is the scale grid's row length.
struct dq_int4 {
    const void* scale;
    int dtype, groups;
    __device__ __forceinline__ float group_scale(int r, int g) const { return dq_scale(scale, dtype, (long long)r * groups + g); }
    __device__ __forceinline__ float value(unsigned n, float s) const { return __fmul_rn((float)((int)n - 8), s); }
};

struct dq_mxfp4 {
    const unsigned char* scale;
    int groups;
    __device__ __forceinline__ float group_scale(int r, int g) const { return dq_e8m0_to_f32(scale[(long long)r * groups + g]); }
    __device__ __forceinline__ float value(unsigned n, float s) const { return __fmul_rn(dq_e2m1_to_f32(n), s); }
};

struct dq_nvfp4 {
    const e4m3_t* scale;
    int groups;
    const float* global;
    int rows_per_global, divides;
    long long row0;
    __device__ __forceinline__ float group_scale(int r, int g) const
    {
        float b = dq_e4m3_to_f32(scale[(long long)r * groups + g]), gl = global[(row0 + r) / rows_per_global];
        return divides ? __fdiv_rn(b, gl) : __fmul_rn(b, gl);
    }
    __device__ __forceinline__ float value(unsigned n, float s) const { return __fmul_rn(dq_e2m1_to_f32(n), s); }
};

// One thread decodes word j of row r: elements 8j .. 8j+7 (those < cols),
// with one scale when they share a group and one per element otherwise
// (an INT4 group that splits words; never written in practice).
template <class D>
__device__ __forceinline__ void dq4_rows(const unsigned* __restrict__ q, int rows, int cols, int group, const D& d, bf16_t* __restrict__ out)
{
    const int words = (cols + 7) >> 3;
    const int chunks = (words + DQ_THREADS - 1) / DQ_THREADS;
    const long long b = blockIdx.x;
    const int r = (int)(b / chunks), j = (int)(b - (long long)r * chunks) * DQ_THREADS + threadIdx.x;
    if (r >= rows || j >= words) return;
    const unsigned w = q[(long long)r * words + j];
    const int c0 = j * DQ_PER_THREAD, n = min(DQ_PER_THREAD, cols - c0);
    const int g0 = c0 / group;
    const bool one = (c0 + n - 1) / group == g0;
    const float s0 = d.group_scale(r, g0);
    unsigned p[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int k = 0; k < DQ_PER_THREAD; k++) {
        float s = one || k >= n ? s0 : d.group_scale(r, (c0 + k) / group);
        p[k >> 1] |= (unsigned)f32_to_bf16(d.value((w >> (4 * k)) & 15u, s)) << (16 * (k & 1));
    }
    bf16_t* o = out + (long long)r * cols + c0;
    if (n == DQ_PER_THREAD && ((unsigned long long)o & 15ull) == 0) {
        *(uint4*)o = make_uint4(p[0], p[1], p[2], p[3]);
        return;
    }
#pragma unroll
    for (int k = 0; k < DQ_PER_THREAD; k++)
        if (k < n) o[k] = (bf16_t)(p[k >> 1] >> (16 * (k & 1)));
}

// group: the columns a scale covers (cols: one scale a row); cols % group == 0.
extern "C" __global__ void __launch_bounds__(DQ_THREADS) moe_dequant_int4_rows(const unsigned* __restrict__ q, int rows, int cols, int group,
                                                                                const void* __restrict__ scale, int scale_dtype, bf16_t* __restrict__ out)
{
    dq4_rows(q, rows, cols, group, dq_int4{scale, scale_dtype, cols / group}, out);
}

extern "C" __global__ void __launch_bounds__(DQ_THREADS) moe_dequant_mxfp4_rows(const unsigned* __restrict__ q, int rows, int cols,
                                                                                 const unsigned char* __restrict__ scale, bf16_t* __restrict__ out)
{
    dq4_rows(q, rows, cols, 32, dq_mxfp4{scale, cols / 32}, out);
}

extern "C" __global__ void __launch_bounds__(DQ_THREADS) moe_dequant_nvfp4_rows(const unsigned* __restrict__ q, int rows, int cols,
                                                                                 const e4m3_t* __restrict__ scale, const float* __restrict__ global,
                                                                                 int rows_per_global, long long row0, int divides, bf16_t* __restrict__ out)
{
    dq4_rows(q, rows, cols, 16, dq_nvfp4{scale, cols / 16, global, rows_per_global, divides, row0}, out);
}
