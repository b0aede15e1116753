// Number formats the kernels share: bf16 and e4m3 as their raw bits, the
// conversions every kernel must round the same way, and the SwiGLU
// epilogue's arithmetic. Each kernels/cuda/*.cu is its own fatbin; the build
// (scripts/build-kernels.sh) and the kernels package's TestBuildMatchesSources
// hash every kernels/cuda/*.cuh with each source, so a change here marks every
// fatbin stale.
#pragma once

typedef unsigned short bf16_t;  // bf16, its 16 bits
typedef unsigned char e4m3_t;   // torch.float8_e4m3fn, its byte

// bf16 -> f32 is exact: the bits move to the high half.
__device__ __forceinline__ float bf16_to_f32(bf16_t v) { return __uint_as_float(((unsigned)v) << 16); }

// f32 -> bf16, round to nearest even, NaN kept quiet (numfmt.F32ToBF16, the
// CPU side's conversion).
__device__ __forceinline__ bf16_t f32_to_bf16(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// Element i of an f32 or bf16 array as f32, and f32 v stored into one (bf16
// rounded as f32_to_bf16): kernels templated over the element type use these.
__device__ __forceinline__ float ld_f32(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld_f32(const bf16_t* p, long long i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void st_val(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st_val(bf16_t* p, long long i, float v) { p[i] = f32_to_bf16(v); }

// SwiGLU of the f32 gate and up projections g and u as the CPU twin
// (moe.Activate) computes it: silu(g) in double, rounded once to f32, then
// one f32 multiply by u. Every fused gate_up epilogue runs this.
__device__ __forceinline__ float swiglu(float g, float u)
{
    double gv = (double)g;
    float sg = (float)(gv / (1.0 + exp(-gv)));
    return __fmul_rn(sg, u);
}
