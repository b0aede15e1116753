// Router GEMM: logits [T,E] (f32) = x [T,H] times Wg [E,H] transposed, f32
// accumulation; x and Wg each f32 or bf16 (raw 16 bits). The CPU twin is
// moe.RouterLogits (float64 accumulation rounded to f32): the two agree
// to |d| <= ~1e-6 * sum_h |x_h w_h|.
//
// One warp per expert, RT_TOKENS tokens per CTA so each weight element read
// serves several tokens; lanes stride over H (coalesced), then a shuffle sum.
#include "numeric.cuh"
#include "mma_sync.cuh"

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
        float wv = ld_f32(wr, k);
#pragma unroll
        for (int i = 0; i < RT_TOKENS; i++)
            if (t0 + i < T) acc[i] = fmaf(ld_f32(x, (long long)(t0 + i) * H + k), wv, acc[i]);
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
    frag_zero(acc);

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
        frag_each<MT, NT>([&](int mt, int nt, int i) { mine[((mt * NT + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i]; });
        __syncthreads();
        if (kw != 0) return;
        frag_each<MT, NT>([&](int mt, int nt, int i) {
            float s = 0.f;
            for (int q = 0; q < KW; q++) s += red[(warp + q) * (MT * NT * 4 * 32) + ((mt * NT + nt) * 4 + i) * 32 + lane];
            acc[mt][nt][i] = s;
        });
    }
    frag_each<MT, NT>([&](int mt, int nt, int i) {
        const int r = m0 + 16 * mt + g + 8 * (i >> 1);
        const int n = n0 + 8 * nt + 2 * c + (i & 1);
        if (r < T && n < E) logits[(long long)r * E + n] = acc[mt][nt][i];
    });
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

// ---------------------------------------------------------------------------
// router_mma_c{BM}n{BN}s{S}: bf16 x and Wg for many tokens on Hopper (sm_90;
// other archs get an empty stub and kernels/router_gemm.go never picks these
// there).
//
// router_mma_l re-read its operands from L2 per 64 x 64 tile and kept only
// one K chunk of loads in flight (259 us at T = 4096, DeepSeek-V3). Here a
// CTA owns BM tokens x BN experts (BN = 256: all of DeepSeek-V3's, so x
// crosses HBM once), and the S CTAs of a thread block cluster split K, so
// that large tiles still make enough CTAs for the SMs. Operands go global ->
// shared by 16-byte cp.async into a ring of RC_STAGES K steps of 64 (rows of
// 128 bytes, 16-byte chunk c at chunk c ^ (row & 7): swizzled_chunk), fragments by
// ldmatrix, mma.sync m16n8k16 with f32 accumulation; 8 warps (2 x 4) of
// (BM / 2) x (BN / 4), each k16 product in increasing k within a CTA's K
// range. One CTA an SM (up to 213 KB of shared memory, up to 255 registers).
//
// Deterministic K reduction, no atomics and no workspace: each CTA of the
// cluster writes its partial tile into its own shared memory, a cluster
// barrier, then CTA r sums slice r of the tile over the S partials in rank
// order (p0 + p1 + ... through distributed shared memory) and writes the
// logits; a second cluster barrier keeps every CTA's shared memory alive
// until all have read it. Dynamic shared memory: RC_STAGES x (BM + BN) x
// 128 bytes (kernels/router_gemm.go, routerClusterSmem); the partial tile
// (BM x BN x 4 bytes) reuses it.

#define RC_BK 64
#ifndef RC_STAGES
#define RC_STAGES 4
#endif
#define RC_THREADS 256
// L2 prefetch of the copies, bytes (as grouped_gemm.cu's M3_L2_PREFETCH):
// each miss also brings the row's next 128 bytes, the next K step, into L2.
#ifndef RC_L2_PREFETCH
#define RC_L2_PREFETCH 256
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned rc_cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// Full cluster barrier: arrive has release, wait acquire semantics, so the
// shared-memory writes before it are visible to every CTA of the cluster.
__device__ __forceinline__ void rc_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// Address of the same shared-memory location in CTA rank of the cluster.
__device__ __forceinline__ unsigned rc_mapa(unsigned addr, unsigned rank)
{
    unsigned r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// No memory clobber: the cluster barriers order these loads, and without
// one the compiler may keep many of them in flight at once.
__device__ __forceinline__ float2 rc_ld_cluster(unsigned addr)
{
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}
#define RC_CLUSTER(S) __cluster_dims__(1, 1, S)
#else
#define RC_CLUSTER(S)
#endif

template <int BM, int BN, int S>
__device__ __forceinline__ void router_cluster_impl(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                                    float* __restrict__ logits, int T, int E, int H)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int MT = BM / 32;  // m16 tiles a warp (warp tile BM / 2 rows)
    constexpr int NT = BN / 32;  // n8 tiles a warp (warp tile BN / 4 experts)
    constexpr int STAGE_BYTES = (BM + BN) * 128;
    constexpr int CP = (BM + BN) * (RC_BK / 8) / RC_THREADS;  // 16-byte copies a thread a stage
    constexpr int AJ = BM * (RC_BK / 8) / RC_THREADS;         // of which A (x) copies
    static_assert(BM % 32 == 0 && BN % 64 == 0 && S >= 1 && S <= 8, "tile shape");
    static_assert(BM * BN * 4 <= RC_STAGES * STAGE_BYTES, "partial tile fits the ring");
    extern __shared__ __align__(128) unsigned char rc_smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const unsigned rank = S > 1 ? rc_cluster_rank() : 0u;
    const int nk = (H + RC_BK - 1) / RC_BK;
    const int kt0 = (int)rank * nk / S, kt1 = ((int)rank + 1) * nk / S;

    // Copy j of a stage: row cr + 32 j of the stage (A rows first, then B),
    // chunk cc. Rows past T or E read nothing and land as zeros.
    const int cr = tid >> 3, cc = tid & 7;
    const long long rstride = 32LL * H;  // elements between copy j and j + 1
    const bf16_t* abase = x + (long long)(m0 + cr) * H + cc * 8;
    const bf16_t* bbase = w + (long long)(n0 + cr) * H + cc * 8;
    unsigned rin = 0;  // bit j: copy j's row exists
#pragma unroll
    for (int j = 0; j < CP; j++) {
        const bool in = j < AJ ? m0 + cr + 32 * j < T : n0 + cr + 32 * (j - AJ) < E;
        rin |= (in ? 1u : 0u) << j;
    }
    const unsigned sbase = (unsigned)__cvta_generic_to_shared(rc_smem);
    // Queue K step kt into its stage; one commit group per step, empty past
    // this CTA's range, so the wait below always counts the same groups.
    auto load = [&](int kt) {
        if (kt < kt1) {
            const unsigned st = sbase + (unsigned)(((kt - kt0) % RC_STAGES) * STAGE_BYTES);
            const int k = kt * RC_BK;
            const bool kin = k + cc * 8 < H;
#pragma unroll
            for (int j = 0; j < CP; j++) {
                const bool in = kin && ((rin >> j) & 1u);
                const bf16_t* p = j < AJ ? abase + j * rstride + k : bbase + (j - AJ) * rstride + k;
                cp_async16<RC_L2_PREFETCH>(st + swizzled_chunk<128>(cr + 32 * j, cc), in ? (const void*)p : (const void*)x, in);
            }
        }
        cp_async_commit();
    };

    float acc[MT][NT][4];
    frag_zero(acc);

#pragma unroll
    for (int s = 0; s < RC_STAGES - 1; s++) load(kt0 + s);

    for (int kt = kt0; kt < kt1; kt++) {
        // Step kt has landed (at most STAGES - 2 younger groups pending), and
        // after the barrier every warp is done with step kt - 1, whose stage
        // the next copies overwrite.
        cp_async_wait<RC_STAGES - 2>();
        __syncthreads();
        load(kt + RC_STAGES - 1);
        const unsigned st = sbase + (unsigned)(((kt - kt0) % RC_STAGES) * STAGE_BYTES);
        const unsigned sb = st + BM * 128;
#pragma unroll
        for (int ks = 0; ks < RC_BK / 16; ks++) {
            unsigned af[MT][4], bf[NT / 2][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(af[mt], st + swizzled_chunk<128>(wm * (BM / 2) + mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
            // bf[p]: (n8 tile 2p: k 0-7, 8-15), (n8 tile 2p + 1: k 0-7, 8-15).
#pragma unroll
            for (int p = 0; p < NT / 2; p++)
                ldmatrix_x4(bf[p], sb + swizzled_chunk<128>(wn * (BN / 4) + p * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                            2 * ks + ((lane >> 3) & 1)));
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mma_bf16_16816(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[nt >> 1][2 * (nt & 1)],
                                   bf[nt >> 1][2 * (nt & 1) + 1]);
        }
    }
    cp_async_wait<0>();  // only empty groups remain; leave none behind

    // Partial tile as float2 (fragment rows g / g + 8, columns 2c, 2c + 1):
    // element j = (((warp * MT + mt) * NT + nt) * 2 + h) * 32 + lane, lane-minor
    // so the stores are conflict-free.
    __syncthreads();  // every warp is done reading the ring
    float2* part = reinterpret_cast<float2*>(rc_smem);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                part[(((warp * MT + mt) * NT + nt) * 2 + h) * 32 + lane] =
                    make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
    if (S > 1) rc_cluster_sync();
    else __syncthreads();
    // This CTA's slice [lo, hi) of the J float2 elements, summed over the S
    // partials in rank order, U elements a thread at a time (U x S loads in
    // flight before the first add).
    constexpr int J = BM * BN / 2, U = 4;
    const int lo = (int)rank * J / S, hi = ((int)rank + 1) * J / S;
    for (int j0 = lo + tid; j0 < hi; j0 += U * RC_THREADS) {
        float2 v[U][S];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = min(j0 + u * RC_THREADS, hi - 1);
            const unsigned a = sbase + (unsigned)j * 8u;
#pragma unroll
            for (int q = 0; q < S; q++) v[u][q] = S > 1 ? rc_ld_cluster(rc_mapa(a, (unsigned)q)) : part[j];
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * RC_THREADS;
            if (j >= hi) break;
            float2 sum = v[u][0];
#pragma unroll
            for (int q = 1; q < S; q++) {
                sum.x += v[u][q].x;
                sum.y += v[u][q].y;
            }
            const int ln = j & 31, hh = (j >> 5) & 1, nt = (j >> 6) % NT, mt = (j >> 6) / NT % MT;
            const int wp = (j >> 6) / (NT * MT);
            const int r = m0 + (wp >> 2) * (BM / 2) + mt * 16 + (ln >> 2) + 8 * hh;
            const int n = n0 + (wp & 3) * (BN / 4) + nt * 8 + 2 * (ln & 3);
            if (r < T) {
                if (n < E) logits[(long long)r * E + n] = sum.x;
                if (n + 1 < E) logits[(long long)r * E + n + 1] = sum.y;
            }
        }
    }
    if (S > 1) rc_cluster_sync();  // no CTA leaves while another still reads its partial
#endif
}

#define RC_KERNEL(NAME, BM, BN, S)                                                                   \
    extern "C" __global__ void __launch_bounds__(RC_THREADS, 1) RC_CLUSTER(S)                        \
        NAME(const bf16_t* x, const bf16_t* w, float* logits, int T, int E, int H)                   \
    {                                                                                                \
        router_cluster_impl<BM, BN, S>(x, w, logits, T, E, H);                                       \
    }

RC_KERNEL(router_mma_c64n256s8, 64, 256, 8)
RC_KERNEL(router_mma_c64n256s2, 64, 256, 2)
RC_KERNEL(router_mma_c64n128s2, 64, 128, 2)
RC_KERNEL(router_mma_c128n256s3, 128, 256, 3)
RC_KERNEL(router_mma_c128n256s4, 128, 256, 4)
RC_KERNEL(router_mma_c128n256s6, 128, 256, 6)
RC_KERNEL(router_mma_c128n256s8, 128, 256, 8)
RC_KERNEL(router_mma_c128n128s2, 128, 128, 2)
RC_KERNEL(router_mma_c160n256s4, 160, 256, 4)
