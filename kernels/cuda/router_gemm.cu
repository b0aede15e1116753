// Router GEMM: logits [T,E] (f32) = x [T,H] times Wg [E,H] transposed, f32
// accumulation; x and Wg each f32 or bf16 (raw 16 bits). The CPU twin is
// validate.RouterLogits (float64 accumulation rounded to f32): the two agree
// to |d| <= ~1e-6 * sum_h |x_h w_h|.
//
// One warp per expert, RT_TOKENS tokens per CTA so each weight element read
// serves several tokens; lanes stride over H (coalesced), then a shuffle sum.

typedef unsigned short bf16_t;

__device__ __forceinline__ float rt_ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float rt_ld(const bf16_t* p, long long i) {
    return __uint_as_float(((unsigned)p[i]) << 16);
}

#define RT_WARPS 8
#define RT_TOKENS 4

template <class XT, class WT>
__device__ __forceinline__ void router_gemm_impl(const XT* __restrict__ x, const WT* __restrict__ w,
                                                 float* __restrict__ logits, int T, int E, int H)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int e = blockIdx.x * RT_WARPS + warp;
    const int t0 = blockIdx.y * RT_TOKENS;
    if (e >= E) return;  // whole warp; no block-wide barrier follows
    float acc[RT_TOKENS];
#pragma unroll
    for (int i = 0; i < RT_TOKENS; i++) acc[i] = 0.f;
    const WT* wr = w + (long long)e * H;
    for (int k = lane; k < H; k += 32) {
        float wv = rt_ld(wr, k);
#pragma unroll
        for (int i = 0; i < RT_TOKENS; i++)
            if (t0 + i < T) acc[i] = fmaf(rt_ld(x, (long long)(t0 + i) * H + k), wv, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < RT_TOKENS; i++) {
        float v = acc[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && t0 + i < T) logits[(long long)(t0 + i) * E + e] = v;
    }
}

#define RT_KERNEL(NAME, XT, WT)                                                            \
    extern "C" __global__ void __launch_bounds__(RT_WARPS * 32)                            \
        NAME(const XT* x, const WT* w, float* logits, int T, int E, int H)                 \
    {                                                                                      \
        router_gemm_impl<XT, WT>(x, w, logits, T, E, H);                                   \
    }

RT_KERNEL(router_gemm_f32_f32, float, float)
RT_KERNEL(router_gemm_f32_bf16, float, bf16_t)
RT_KERNEL(router_gemm_bf16_f32, bf16_t, float)
RT_KERNEL(router_gemm_bf16_bf16, bf16_t, bf16_t)
