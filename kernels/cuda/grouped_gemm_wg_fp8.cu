// Hopper (sm_90a) grouped GEMM of the w8a8 (block-FP8 serving) mode: e4m3
// activations x e4m3 weights on the tensor cores (wgmma ...f32.e4m3.e4m3,
// QGMMA in SASS), with per-token-per-128-channel activation scales (from
// moe_act_quant_e4m3, act_quant.cu) and the weights' f32 128x128 block
// scales. The same CTA as grouped_gemm_wg.cu (read its header first; both
// are wg_common.cuh's wg_grouped_gemm, this file's variant WgW8A8): a
// persistent grid, one producer warpgroup (weight tiles by the bulk tensor
// copy engine into 128-byte-swizzled shared memory, gathered activation rows
// by 16-byte cp.async completing on the stage's mbarrier), consumer
// warpgroups of 64 rows each, the same tile list, work order and epilogue.
//
//   moe_gate_up_wg_fp8_fp8: inter[s,n] = bf16(silu(G) * U), G = sum_kb as[t,kb] bg[n/128,kb] (xq[t,kb-block] . Wg[e,n,kb-block])
//   moe_down_wg_fp8_fp8:    out[s,n]   = sum_kb as[s,kb] bd[n/128,kb] (iq[s,kb-block] . Wd[e,n,kb-block])   (f32)
// with t = s / topk, xq/as = act_quant(x), iq/as = act_quant(inter). The
// epilogue is grouped_gemm_wg.cu's (silu in f64, product rounded once to
// f32, then bf16 nearest-even; down f32).
//
// What differs from the bf16 kernel:
// - One K step is 128 e4m3 = one 128-byte swizzled row = one scale block,
//   so A (BM x 128 B) and B (BNB x 128 B) tiles have the bf16 kernel's byte
//   shapes and the same shared-memory descriptors (K advances 32 elements =
//   32 bytes per wgmma, as 16 bf16 do).
// - Per K step each consumer warpgroup issues four m64nBNBk32 wgmmas into a
//   partial accumulator (scale_d 0 on the first), waits for them
//   (wait_group 0), reads the stage's scales, releases the stage, and
//   promotes: acc += part * (a_scale[row, kb] * b_scale[n / 128, kb]), one
//   fmaf per element with the scale product rounded to f32. Restarting the
//   partial every 128 K also bounds the error of the tensor core's reduced-
//   precision fp8 accumulation (the reason DeepSeek-V3 promotes every 128):
//   measured on the H100, ~1.7e-4 relative L2 against exact f64 sums of the
//   same codes (integer codes, whose partials are exact, give 5e-8).
//   The row's scale is per thread: the thread holds rows g and g + 8 of its
//   warp's 16 (acc[4j + 2h + i]: row g + 8h, column 8j + 2q + i). The weight
//   scale is per 8-column group j: a tile of BN columns starting at a
//   multiple of BN spans at most two 128-wide scale blocks (static_assert),
//   so each matrix needs two scales per K step.
// - Scales come through shared memory: per stage the producer copies the
//   BM activation scales of the tile's rows (4-byte cp.async, zero for
//   padding) and 2 (down) or 4 (gate_up: gate lo/hi, up lo/hi) weight
//   scales, all completing on the stage's full barrier with the A copies.
// - acc + part are 2 x BNB / 2 registers a thread (192 at BNB = 192), more
//   than the bf16 kernel's 3-consumer layout leaves (152). The default
//   instance is therefore 2 consumer warpgroups (BM = 128, 384 threads,
//   setmaxnreg 40 / 232: 128 x 40 + 256 x 232 = 64512 = 384 x 168, the
//   launch allocation), 5 stages of 40 KB. A routed DeepSeek-V3 expert at
//   T = 4096 (~128-160 rows) then takes two row tiles whose CTAs run
//   together (row tiles fastest in the work order) and share each weight
//   tile through L2. The template also builds BM = 192 / BNB = 128 (3
//   consumer warpgroups, 152 registers: acc + part = 128); the harness
//   times both.
//
// Limits (checked by the Go side; there is no fallback): K % 16 == 0
// (16-byte copies, tensor-map strides of K bytes), weights and activations
// 16-byte aligned, at most WG_MAX_RUNS - 1 runs, block_size % 16 == 0. Any N.
// Scales: activation [rows, ceil(K/128)]; weight [E, ceil(N/128), ceil(K/128)]
// at s + e * s_estride (gate_up: s_gate and s_up, as the tall kernels take them).
//
// Weight tensor maps are 3D UINT8 views {K, N, E} of the e4m3 matrices
// (strides K and the expert stride, in bytes), box {128, rows of B per
// copy, 1}.
//
// Checked on an H100 (kernels/GEMM_NOTES.md, "w8a8 on the H100"): 168
// registers, 0 spills; against f64 references of the CPU twin's w8a8
// numerics (moe.GroupedGEMM with GEMMOptions.W8A8; scripts/wg/harness_fp8.cu)
// and the twin itself (kernels TestGroupedGEMMW8A8). Go side:
// kernels/grouped_gemm.go (GEMMOptions.W8A8).
#include "wg_common.cuh"

// The default instance (kernels/grouped_gemm.go mirrors these: wfBM, wfBN,
// wfStages, wfThreads, wfSmemBytes).
#define WF_BM 128
#define WF_BNB 192  // tensor-map boxes {128, 96, 1} (gate, up) and {128, 192, 1} (down)
#define WF_NCW 2
#define WF_BK 128   // e4m3 elements = bytes of one swizzled row = one scale block
#define WF_STAGES 5
#define WF_PRODUCER_REGS 40
#define WF_CONSUMER_REGS 232
#define WF_THREADS (128 * (1 + WF_NCW))
#define WF_SCALE_BLOCK 128

static_assert(WF_BK == WF_SCALE_BLOCK, "one K step is one scale block");

constexpr int wf_gcd(int a, int b) { return b == 0 ? a : wf_gcd(b, a % b); }

// The w8a8 variant of wg_grouped_gemm: K steps of WF_BK e4m3 (one scale
// block), the producer's row table holds each tile row's activation row
// (-1: padding), and each stage carries SC_STRIDE = BM + 8 floats of scales:
// the BM rows' activation scales of its K block, then the weight scales
// (gate or down lo, hi, up lo, hi: the two 128-wide blocks a tile's columns
// can span).
template <class S>
struct WgW8A8 : WgVariant<S, e4m3_t, int, S::BM + 8> {
    static constexpr bool GATED = S::GATED;
    static constexpr int BM = S::BM, BNB = S::BNB, STAGES = S::STAGES, SC_STRIDE = S::BM + 8;
    static constexpr int NBS = GATED ? 4 : 2;  // weight scales a stage
    // A tile's columns n0 .. n0 + BN - 1 (n0 a multiple of BN) lie in at most two 128-wide scale blocks.
    static_assert(128 - wf_gcd(S::BN, 128) + S::BN <= 256, "a tile spans at most two weight-scale blocks");
#ifdef WG_ENABLED
    static __device__ __forceinline__ int row_of(const e4m3_t*, int s, int numel, int a_div, int)
    {
        return (s >= 0 && s < numel) ? s / a_div : -1;
    }
    static __device__ __forceinline__ bool has_row(int row) { return row >= 0; }
    static __device__ __forceinline__ const e4m3_t* row_src(const e4m3_t* aq, int row, int k, int K)
    {
        return aq + (long long)row * K + k;
    }
    // The weight scales thread tid copies each K step (tid < NBS): matrix
    // tid >> 1 (gate or down, up), block lo / hi of the tile's columns.
    static __device__ __forceinline__ const float* tile_scales(const WgTile& t, int tid, const float* s0, const float* s1,
                                                               long long s_estride, int nbn, int nk)
    {
        const float* bsp = nullptr;
        if (tid < NBS) {
            const int blk = min((t.n0 >> 7) + (tid & 1), nbn - 1);
            bsp = (GATED && (tid >> 1) ? s1 : s0) + (long long)t.e * s_estride + (long long)blk * nk;
        }
        return bsp;
    }
    // The stage's scales at ss: the activation scales of the tile's rows in
    // K block kt (zero for padding) and the NBS weight scales.
    static __device__ __forceinline__ void copy_scales(unsigned ss, int tid, int ngrp, const int* rowt, const float* as, int nk,
                                                       int kt, const float* bsp)
    {
        for (int i = tid; i < BM; i += 128) {
            if ((i >> 6) >= ngrp) continue;
            const int row = rowt[i];
            wg_cp4(ss + i * 4, row >= 0 ? as + (long long)row * nk + kt : as, row >= 0 ? 4u : 0u);
        }
        if (tid < NBS) wg_cp4(ss + (BM + tid) * 4, bsp + kt, 4u);
    }

    // The K loop of one tile for one consumer warpgroup (rows rg .. rg + 63 of
    // the tile): per K step four k32 wgmmas into part, then the promotion into
    // acc with the stage's scales (see the header). sc0: the scale ring (per
    // stage BM activation scales, then the weight scales: gate/down lo, hi, up lo, hi).
    static __device__ __forceinline__ void consume(float* acc, float* part, unsigned a0, unsigned b0, const float* sc0, int rg,
                                                   int n0, int nk, int& it, unsigned full0, unsigned empty0)
    {
        constexpr int J = BNB / 8;             // n8 column groups of the accumulator
        constexpr int JO = GATED ? J / 2 : J;  // of one output matrix (gate_up: up is j >= JO)
        const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
        const int ra = rg + wq * 16 + (lane >> 2);  // rows ra and ra + 8 of the tile
        const int nb0 = n0 >> 7;
#pragma unroll
        for (int i = 0; i < BNB / 2; i++) acc[i] = part[i] = 0.f;
        for (int kt = 0; kt < nk; kt++, it++) {
            const int s = wg_stage_mma<e4m3_t, BNB, STAGES, S::STAGE_BYTES>(part, a0, b0, it, false, full0);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            // Pin every read of part after the wait: the wait names no registers, so without
            // this the compiler may hoist the promotion's reads of part above it.
#pragma unroll
            for (int i = 0; i < BNB / 2; i++) asm volatile("" : "+f"(part[i])::"memory");
            const float* sc = sc0 + s * SC_STRIDE;
            const float as0 = sc[ra], as1 = sc[ra + 8];
            const float b_lo = sc[BM], b_hi = sc[BM + 1];
            const float u_lo = GATED ? sc[BM + 2] : 0.f, u_hi = GATED ? sc[BM + 3] : 0.f;
            // Every read of the stage (wgmma done, scales in registers) is over.
            wg_bar_arrive(empty0 + 8 * s);
#pragma unroll
            for (int j = 0; j < J; j++) {
                const bool up = GATED && j >= JO;
                const int jj = up ? j - JO : j;
                const bool hi = ((n0 + 8 * jj) >> 7) != nb0;
                const float bs = up ? (hi ? u_hi : u_lo) : (hi ? b_hi : b_lo);
                const float f0 = as0 * bs, f1 = as1 * bs;
                acc[4 * j + 0] = fmaf(part[4 * j + 0], f0, acc[4 * j + 0]);
                acc[4 * j + 1] = fmaf(part[4 * j + 1], f0, acc[4 * j + 1]);
                acc[4 * j + 2] = fmaf(part[4 * j + 2], f1, acc[4 * j + 2]);
                acc[4 * j + 3] = fmaf(part[4 * j + 3], f1, acc[4 * j + 3]);
            }
        }
    }
#endif
};

// The default instance; kernels/grouped_gemm.go mirrors its block size and shared memory.
typedef WgW8A8<WgShape<true, WF_BM, WF_BNB, WF_NCW, WF_STAGES, WF_PRODUCER_REGS, WF_CONSUMER_REGS>> WgW8A8GateUp;
typedef WgW8A8<WgShape<false, WF_BM, WF_BNB, WF_NCW, WF_STAGES, WF_PRODUCER_REGS, WF_CONSUMER_REGS>> WgW8A8Down;
#define WF_SMEM_BYTES (WgW8A8GateUp::L::SMEM)
static_assert(WgW8A8GateUp::L::SMEM == WgW8A8Down::L::SMEM, "one size for both");
static_assert(WgW8A8GateUp::shape::THREADS == WF_THREADS && WgW8A8GateUp::BK == WF_BK, "block size, K step");

// Tensor maps: boxes {128, WF_BNB / 2, 1} (gate, up) and {128, WF_BNB, 1} (down).
// xq [T, H] e4m3 and xs [T, ceil(H/128)] from moe_act_quant_e4m3 on x.
// On targets other than sm_90a wg_grouped_gemm only traps: the Go side never launches these there.
extern "C" __global__ void __launch_bounds__(WF_THREADS, 1) moe_gate_up_wg_fp8_fp8(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const e4m3_t* xq, const float* xs,
    const e4m3_t* w_gate, const e4m3_t* w_up, long long w_estride, const float* s_gate, const float* s_up,
    long long s_estride, bf16_t* inter, int numel, int topk, int I, int H, int block_size, int num_experts,
    const __grid_constant__ WgTmap tm_gate, const __grid_constant__ WgTmap tm_up)
{
    wg_grouped_gemm<WgW8A8GateUp>(sorted_ids, expert_ids, total_padded, xq, xs, topk, &tm_gate, &tm_up, s_gate, s_up, s_estride,
                                  inter, nullptr, numel, I, H, block_size, num_experts);
}

// iq [numel, I] e4m3 and is [numel, ceil(I/128)] from moe_act_quant_e4m3 on the bf16 intermediate.
extern "C" __global__ void __launch_bounds__(WF_THREADS, 1) moe_down_wg_fp8_fp8(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const e4m3_t* iq, const float* is,
    const e4m3_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out, int numel, int H,
    int I, int block_size, int num_experts, const __grid_constant__ WgTmap tm_down)
{
    wg_grouped_gemm<WgW8A8Down>(sorted_ids, expert_ids, total_padded, iq, is, 1, &tm_down, &tm_down, s_down, s_down, s_estride,
                                nullptr, out, numel, H, I, block_size, num_experts);
}
