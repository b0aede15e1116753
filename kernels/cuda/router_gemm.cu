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

// ---------------------------------------------------------------------------
// router_mma_{s,m,l}: bf16 x and Wg on the tensor cores (mma.sync m16n8k16,
// f32 accumulation), fragments loaded straight from global memory (the
// operands are read about once: no shared-memory staging). H % 8 == 0 and
// 16-byte aligned rows.
//
// k permutation: the sum over k does not care about order, so each thread
// loads 8 consecutive bf16 (16 bytes) of its row for a 32-wide k chunk and
// feeds them as the logical k's {2c,2c+1,2c+8,2c+9} of two k16 steps: thread
// c of a quad holds physical k 8c..8c+7, A and B alike, so the products pair
// up exactly as in the plain layout.
//
// A CTA is WM x WN x KW warps: WM x WN warp tiles of (16*MT tokens) x
// (8*NT experts), and KW warps splitting K; the KW partial tiles are summed in
// shared memory in a fixed order (deterministic).

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int MT, int NT, int WM, int WN, int KW>
__device__ __forceinline__ void router_mma_impl(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                                float* __restrict__ logits, int T, int E, int H, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int kw = warp % KW, wn = (warp / KW) % WN, wm = warp / (KW * WN);
    const int m0 = blockIdx.y * (16 * MT * WM) + wm * 16 * MT;
    const int n0 = blockIdx.x * (8 * NT * WN) + wn * 8 * NT;
    const int nchunks = (H + 31) / 32;
    const int kc0 = kw * nchunks / KW, kc1 = (kw + 1) * nchunks / KW;

    const uint4* xr[MT][2];
    bool xv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = m0 + 16 * mt + 8 * h + g;
            xv[mt][h] = r < T;
            xr[mt][h] = reinterpret_cast<const uint4*>(x + (long long)(r < T ? r : 0) * H);
        }
    const uint4* wr[NT];
    bool wv[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int n = n0 + 8 * nt + g;
        wv[nt] = n < E;
        wr[nt] = reinterpret_cast<const uint4*>(w + (long long)(n < E ? n : 0) * H);
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;

    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 4
    for (int kc = kc0; kc < kc1; kc++) {
        const int k8 = kc * 4 + c;  // index of this thread's 16-byte piece in a row
        const bool kin = k8 * 8 < H;
        uint4 a[MT][2], b[NT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) a[mt][h] = (kin && xv[mt][h]) ? __ldg(xr[mt][h] + k8) : zero;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) b[nt] = (kin && wv[nt]) ? __ldg(wr[nt] + k8) : zero;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mma_bf16_16816(acc[mt][nt], a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, b[nt].x, b[nt].y);
                mma_bf16_16816(acc[mt][nt], a[mt][0].z, a[mt][1].z, a[mt][0].w, a[mt][1].w, b[nt].z, b[nt].w);
            }
    }

    if (KW > 1) {
        // red: [warp][MT][NT][4][32], lane-minor (conflict-free).
        float* mine = red + warp * (MT * NT * 4 * 32);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) mine[((mt * NT + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
        __syncthreads();
        if (kw != 0) return;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float s = 0.f;
                    for (int q = 0; q < KW; q++)
                        s += red[(warp + q) * (MT * NT * 4 * 32) + ((mt * NT + nt) * 4 + i) * 32 + lane];
                    acc[mt][nt][i] = s;
                }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = m0 + 16 * mt + g + 8 * (i >> 1);
                const int n = n0 + 8 * nt + 2 * c + (i & 1);
                if (r < T && n < E) logits[(long long)r * E + n] = acc[mt][nt][i];
            }
}

#define RT_MMA_KERNEL(NAME, MT, NT, WM, WN, KW)                                                       \
    extern "C" __global__ void __launch_bounds__(WM * WN * KW * 32)                                   \
        NAME(const bf16_t* x, const bf16_t* w, float* logits, int T, int E, int H)                    \
    {                                                                                                 \
        __shared__ float red[(KW > 1 ? WM * WN * KW : 1) * MT * NT * 4 * 32];                         \
        router_mma_impl<MT, NT, WM, WN, KW>(x, w, logits, T, E, H, red);                              \
    }

// s: T <= 16, a 16 x 8 tile per CTA, K split over 8 warps (32 CTAs for 256 experts).
RT_MMA_KERNEL(router_mma_s, 1, 1, 1, 1, 8)
// m: T <= 1024, 32 x 16 tiles, K split over 8 warps.
RT_MMA_KERNEL(router_mma_m, 2, 2, 1, 1, 8)
// l: 64 x 64 tiles, 2 x 2 warps of 32 x 32, no K split.
RT_MMA_KERNEL(router_mma_l, 2, 4, 2, 2, 1)
