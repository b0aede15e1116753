// Variants of the mma3 kernels (kernels/cuda/grouped_gemm.cu) for the T = 128
// study (GEMM_NOTES.md, issue 13 pass 7). Same parameter lists as
// moe_gate_up_mma3_bf16_bf16 / moe_down_mma3_bf16_bf16; every variant keeps
// mma2's per-element arithmetic (k16 products in increasing k, zero-padded
// K steps), so its outputs must be bit-identical to the shipped kernels.
//
// Knobs (-D):
//   V_GU_STAGES, V_DN_STAGES  ring depth of gate_up / down
//   V_BK                      K per stage (64 or 128)
//   V_PREFETCH                L2 prefetch qualifier of the copies
//   V_EVICT                   1: weight copies carry an L2 evict_first policy
//   V_GU_BN, V_DN_BN          columns a CTA (gate_up: of each matrix): 32, 64, 128
//   V_COLS_FAST               1: grid x = column tiles, y = row blocks
//   V_PDL                     1: gate_up triggers its dependents at once; down
//                             queues its first weight stages, then waits
//                             (griddepcontrol) before touching the intermediate
typedef unsigned short bf16_t;

#ifndef V_GU_STAGES
#define V_GU_STAGES 4
#endif
#ifndef V_DN_STAGES
#define V_DN_STAGES 4
#endif
#ifndef V_BK
#define V_BK 64
#endif
#ifndef V_PREFETCH
#define V_PREFETCH ".L2::256B"
#endif
#ifndef V_EVICT
#define V_EVICT 0
#endif
#ifndef V_GU_BN
#define V_GU_BN 64
#endif
#ifndef V_DN_BN
#define V_DN_BN 64
#endif
#ifndef V_COLS_FAST
#define V_COLS_FAST 0
#endif
#ifndef V_PDL
#define V_PDL 0
#endif

#define MM_THREADS 128

__device__ __forceinline__ bf16_t f32_to_bf16(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ void mma_bf16_16816(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void v_cp16(unsigned dst, const void* src, bool in)
{
    asm volatile("cp.async.cg.shared.global" V_PREFETCH " [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void v_cp16w(unsigned dst, const void* src, bool in, unsigned long long pol)
{
#if V_EVICT
    asm volatile("cp.async.cg.shared.global.L2::cache_hint" V_PREFETCH " [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(in ? 16 : 0), "l"(pol)
                 : "memory");
#else
    v_cp16(dst, src, in);
#endif
}
__device__ __forceinline__ void v_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void v_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void v_ldm4(unsigned* r, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void v_ldm2(unsigned* r, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Rows of V_BK bf16 (128 or 256 bytes); chunk c of row r at c ^ (r & 7).
__device__ __forceinline__ unsigned v_off(int r, int c) { return (unsigned)(r * (V_BK * 2) + ((c ^ (r & 7)) << 4)); }

template <bool GATED, int STAGES, int BN>
__device__ __forceinline__ void v_tile(const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
                                       const int* __restrict__ total_padded, const bf16_t* __restrict__ a, int a_div,
                                       const bf16_t* __restrict__ b0, const bf16_t* __restrict__ b1,
                                       long long b_estride, bf16_t* __restrict__ c_bf16, float* __restrict__ c_f32,
                                       int numel, int N, int K, int block_size, int num_experts)
{
    constexpr int NB = GATED ? 2 : 1;
    constexpr int CPR = V_BK / 8;          // 16-byte chunks a row
    constexpr int ROWB = V_BK * 2;         // bytes a row
    constexpr int A_BYTES = 16 * ROWB;
    constexpr int B_BYTES = BN * ROWB;
    constexpr int STAGE_BYTES = A_BYTES + NB * B_BYTES;
    constexpr int AV = 16 * CPR / MM_THREADS;
    constexpr int BV = BN * CPR / MM_THREADS;
    constexpr int WN = BN / 4;  // columns a warp
    constexpr int J = WN / 8;   // n8 tiles a warp
    static_assert(AV >= 1 && BV >= 1 && J >= 1, "shape");
    extern __shared__ __align__(128) unsigned char v_smem[];
    __shared__ int slot[16];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
#if V_COLS_FAST
    const int row0 = blockIdx.y * 16;
    const int n0 = blockIdx.x * BN;
#else
    const int row0 = blockIdx.x * 16;
    const int n0 = blockIdx.y * BN;
#endif
#if V_PDL
    if (GATED) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    if (row0 >= *total_padded) return;
    const int e = expert_ids[row0 / block_size];
    if (e < 0 || e >= num_experts) return;
    if (tid < 16) {
        int s = sorted_ids[row0 + tid];
        slot[tid] = (s >= 0 && s < numel) ? s : -1;
    }
    __syncthreads();

    unsigned long long pol = 0;
#if V_EVICT
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
#endif
    const bf16_t* bm[2] = {b0 + (long long)e * b_estride, (GATED ? b1 : b0) + (long long)e * b_estride};
    float acc[NB][J][4];
#pragma unroll
    for (int m = 0; m < NB; m++)
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][j][i] = 0.f;

    const bf16_t* arow[AV];
    int aslot[AV];
#pragma unroll
    for (int v = 0; v < AV; v++) {
        int r = (tid + v * MM_THREADS) / CPR;
        aslot[v] = slot[r];
        arow[v] = a + (long long)(aslot[v] >= 0 ? aslot[v] / a_div : 0) * K;
    }
    const unsigned sbase = (unsigned)__cvta_generic_to_shared(v_smem);
    const int nk = (K + V_BK - 1) / V_BK;
    auto load_a = [&](int kt) {
        const unsigned st = sbase + (unsigned)((kt % STAGES) * STAGE_BYTES);
#pragma unroll
        for (int v = 0; v < AV; v++) {
            const int idx = tid + v * MM_THREADS, r = idx / CPR, c = idx % CPR;
            const int k = kt * V_BK + c * 8;
            const bool in = k < K && aslot[v] >= 0;
            v_cp16(st + v_off(r, c), in ? (const void*)(arow[v] + k) : (const void*)a, in);
        }
    };
    auto load_b = [&](int kt) {
        const unsigned st = sbase + (unsigned)((kt % STAGES) * STAGE_BYTES);
#pragma unroll
        for (int m = 0; m < NB; m++)
#pragma unroll
            for (int j = 0; j < BV; j++) {
                const int idx = tid + j * MM_THREADS, nn = idx / CPR, c = idx % CPR;
                const int k = kt * V_BK + c * 8, n = n0 + nn;
                const bool in = k < K && n < N;
                v_cp16w(st + A_BYTES + m * B_BYTES + v_off(nn, c),
                        in ? (const void*)(bm[m] + (long long)n * K + k) : (const void*)bm[m], in, pol);
            }
    };
#if V_PDL
    if (!GATED) {
        // Weights do not depend on gate_up: queue their first stages, then
        // wait for gate_up's intermediate. The B copies join group 0.
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++)
            if (s < nk) load_b(s);
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < nk) load_a(s);
            v_commit();
        }
    } else
#endif
    {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < nk) {
                load_a(s);
                load_b(s);
            }
            v_commit();
        }
    }

    for (int kt = 0; kt < nk; kt++) {
        v_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < nk) {
            load_a(kt + STAGES - 1);
            load_b(kt + STAGES - 1);
        }
        v_commit();
        const unsigned st = sbase + (unsigned)((kt % STAGES) * STAGE_BYTES);
#pragma unroll
        for (int ks = 0; ks < V_BK / 16; ks++) {
            unsigned af[4];
            v_ldm4(af, st + v_off(lane & 15, 2 * ks + (lane >> 4)));
#pragma unroll
            for (int m = 0; m < NB; m++) {
                const unsigned bb = st + A_BYTES + m * B_BYTES;
                if constexpr (J == 1) {
                    unsigned bf[2];
                    v_ldm2(bf, bb + v_off(warp * WN + (lane & 7), 2 * ks + ((lane >> 3) & 1)));
                    mma_bf16_16816(acc[m][0], af[0], af[1], af[2], af[3], bf[0], bf[1]);
                } else {
#pragma unroll
                    for (int h = 0; h < J / 2; h++) {
                        unsigned bf[4];
                        v_ldm4(bf, bb + v_off(warp * WN + 16 * h + (lane & 7) + ((lane >> 4) << 3),
                                              2 * ks + ((lane >> 3) & 1)));
                        mma_bf16_16816(acc[m][2 * h], af[0], af[1], af[2], af[3], bf[0], bf[1]);
                        mma_bf16_16816(acc[m][2 * h + 1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
                    }
                }
            }
        }
    }
    v_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; h++) {
        int s = slot[g + 8 * h];
        if (s < 0) continue;
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int n = n0 + warp * WN + j * 8 + 2 * q + i;
                if (n >= N) continue;
                float v = acc[0][j][2 * h + i];
                if (GATED) {
                    double gv = (double)v;
                    float sg = (float)(gv / (1.0 + exp(-gv)));
                    v = __fmul_rn(sg, acc[NB - 1][j][2 * h + i]);
                    c_bf16[(long long)s * N + n] = f32_to_bf16(v);
                } else {
                    c_f32[(long long)s * N + n] = v;
                }
            }
    }
}

extern "C" __global__ void __launch_bounds__(MM_THREADS) moe_gate_up_mma3_bf16_bf16(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* x, const bf16_t* w_gate,
    const bf16_t* w_up, long long w_estride, const float* s_gate, const float* s_up, long long s_estride,
    bf16_t* inter, int numel, int topk, int I, int H, int block_size, int num_experts)
{
    v_tile<true, V_GU_STAGES, V_GU_BN>(sorted_ids, expert_ids, total_padded, x, topk, w_gate, w_up, w_estride, inter,
                                       nullptr, numel, I, H, block_size, num_experts);
}

extern "C" __global__ void __launch_bounds__(MM_THREADS) moe_down_mma3_bf16_bf16(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* inter,
    const bf16_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out, int numel, int H,
    int I, int block_size, int num_experts)
{
    v_tile<false, V_DN_STAGES, V_DN_BN>(sorted_ids, expert_ids, total_padded, inter, 1, w_down, w_down, w_estride,
                                        nullptr, out, numel, H, I, block_size, num_experts);
}
