// Issue 13 deliverable 2 (w8a8). Checked on an H100 (kernels/GEMM_NOTES.md,
// 2026-11-23 "w8a8 on the H100"): 168 registers, 0 spills; against f64
// references of validate's W8A8 twin (scripts/wg/harness_fp8.cu) and the
// twin itself (kernels TestGroupedGEMMW8A8). Go side: kernels/grouped_gemm.go
// (GEMMOptions.W8A8).
//
// Hopper (sm_90a) grouped GEMM of the w8a8 (block-FP8 serving) mode: e4m3
// activations x e4m3 weights on the tensor cores (wgmma ...f32.e4m3.e4m3,
// QGMMA in SASS), with per-token-per-128-channel activation scales (from
// moe_act_quant_e4m3, act_quant.cu) and the weights' f32 128x128 block
// scales. Same structure as grouped_gemm_wg.cu (read its header first): a
// persistent grid, one producer warpgroup (weight tiles by the bulk tensor
// copy engine into 128-byte-swizzled shared memory, gathered activation rows
// by 16-byte cp.async completing on the stage's mbarrier), consumer
// warpgroups of 64 rows each, the same tile list and work order.
//
//   moe_gate_up_wg_fp8_fp8: inter[s,n] = bf16(silu(G) * U), G = sum_kb as[t,kb] bg[n/128,kb] (xq[t,kb-block] . Wg[e,n,kb-block])
//   moe_down_wg_fp8_fp8:    out[s,n]   = sum_kb as[s,kb] bd[n/128,kb] (iq[s,kb-block] . Wd[e,n,kb-block])   (f32)
// with t = s / topk, xq/as = act_quant(x), iq/as = act_quant(inter). The
// epilogues are grouped_gemm_wg.cu's (silu in f64, product rounded once to
// f32, then bf16 nearest-even; down f32).
//
// What differs from the bf16 kernel:
// - One K step is 128 e4m3 = one 128-byte swizzled row = one scale block,
//   so A (BM x 128 B) and B (BNB x 128 B) tiles have the bf16 kernel's byte
//   shapes and the same shared-memory descriptors (K advances 32 elements =
//   32 bytes per wgmma, as 16 bf16 did).
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
// Limits (the Go side must check them and fall back): K % 16 == 0 (16-byte
// copies, tensor-map strides of K bytes), weights and activations 16-byte
// aligned, at most WF_MAX_RUNS - 1 runs, block_size % 16 == 0. Any N.
// Scales: activation [rows, ceil(K/128)]; weight [E, ceil(N/128), ceil(K/128)]
// at s + e * s_estride (gate_up: s_gate and s_up, as the tall kernels take them).
//
// The mbarrier, copy, descriptor and schedule helpers are grouped_gemm_wg.cu's
// (wg_common.cuh). Weight tensor maps are 3D UINT8 views {K, N, E} of the
// e4m3 matrices (strides K and the expert stride, in bytes), box {128, rows
// of B per copy, 1}.
#include "wg_common.cuh"

typedef unsigned char e4m3_t;

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
#define WF_MAX_RUNS 2048
#define WF_SCALE_BLOCK 128

static_assert(WF_BK == WF_SCALE_BLOCK, "one K step is one scale block");


#ifdef WG_ENABLED
// 4-byte async copy (cp-size 4 exists only with .ca); src_bytes 0 writes zero.
__device__ __forceinline__ void wf_cp4(unsigned dst, const void* src, unsigned src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
#endif  // WG_ENABLED

template <int N>
__device__ __forceinline__ void wf_mma(float* d, unsigned long long da, unsigned long long db, int scale_d);

#ifdef WG_ENABLED

// d[0..95] (+)= A(64x32 e4m3) B(192x32 e4m3)^T; scale_d 0 overwrites d. fp8 wgmma takes no
// transpose immediates: both operands are K-major in shared memory.
template <>
__device__ __forceinline__ void wf_mma<192>(float* d, unsigned long long da, unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// d[0..63] (+)= A(64x32 e4m3) B(128x32 e4m3)^T; scale_d 0 overwrites d. fp8 wgmma takes no
// transpose immediates: both operands are K-major in shared memory.
template <>
__device__ __forceinline__ void wf_mma<128>(float* d, unsigned long long da, unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}
// The K loop of one tile for one consumer warpgroup (rows rg .. rg + 63 of
// the tile): per K step four k32 wgmmas into part, then the promotion into
// acc with the stage's scales (see the header). sc0: the scale ring (per
// stage BM activation scales, then the weight scales: gate/down lo, hi, up lo, hi).
template <bool GATED, int BM, int BNB, int STAGES, int STAGE_BYTES>
__device__ __forceinline__ void wf_consume(float* acc, float* part, unsigned a0, unsigned b0, const float* sc0, int rg,
                                           int n0, int nk, int& it, unsigned full0, unsigned empty0)
{
    constexpr int J = BNB / 8;                 // n8 column groups of the accumulator
    constexpr int JO = GATED ? J / 2 : J;      // of one output matrix (gate_up: up is j >= JO)
    const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
    const int ra = rg + wq * 16 + (lane >> 2);  // rows ra and ra + 8 of the tile
    const int nb0 = n0 >> 7;
#pragma unroll
    for (int i = 0; i < BNB / 2; i++) acc[i] = part[i] = 0.f;
    for (int kt = 0; kt < nk; kt++, it++) {
        const int s = it % STAGES;
        wg_bar_wait(full0 + 8 * s, (it / STAGES) & 1);
        // A was written by cp.async (generic proxy); wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const unsigned sa = a0 + s * STAGE_BYTES, sb = b0 + s * STAGE_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WF_BK / 32; kk++) wf_mma<BNB>(part, wg_desc(sa + kk * 32), wg_desc(sb + kk * 32), kk != 0);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // Pin every read of part after the wait: the wait names no registers, so without
        // this the compiler may hoist the promotion's reads of part above it.
#pragma unroll
        for (int i = 0; i < BNB / 2; i++) asm volatile("" : "+f"(part[i])::"memory");
        const float* sc = sc0 + s * (BM + 8);
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

// Epilogue of one 64-row group: grouped_gemm_wg.cu's wg_epilogue.
template <bool GATED, int BN>
__device__ __forceinline__ void wf_epilogue(const float* acc, int rg, const WgTile& t, const int* __restrict__ sorted_ids,
                                            bf16_t* __restrict__ c_bf16, float* __restrict__ c_f32, int numel, int N)
{
    const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = rg + wq * 16 + g + 8 * h;
        int s = r < t.rows ? sorted_ids[t.sb0 * 16 + r] : -1;
        if (s < 0 || s >= numel) continue;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            int n = t.n0 + 8 * j + 2 * q;
            float v[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                v[i] = acc[4 * j + 2 * h + i];
                if (GATED) {
                    double gv = (double)v[i];
                    float sg = (float)(gv / (1.0 + exp(-gv)));
                    v[i] = __fmul_rn(sg, acc[4 * (j + BN / 8) + 2 * h + i]);
                }
            }
            if (GATED) {
                bf16_t* p = c_bf16 + (long long)s * N + n;
                if (n + 1 < N && (N & 1) == 0) {
                    *(unsigned*)p = (unsigned)wg_f32_to_bf16(v[0]) | ((unsigned)wg_f32_to_bf16(v[1]) << 16);
                } else {
                    if (n < N) p[0] = wg_f32_to_bf16(v[0]);
                    if (n + 1 < N) p[1] = wg_f32_to_bf16(v[1]);
                }
            } else {
                float* p = c_f32 + (long long)s * N + n;
                if (n + 1 < N && (N & 1) == 0) {
                    *(float2*)p = make_float2(v[0], v[1]);
                } else {
                    if (n < N) p[0] = v[0];
                    if (n + 1 < N) p[1] = v[1];
                }
            }
        }
    }
}
#endif  // WG_ENABLED

constexpr int wf_gcd(int a, int b) { return b == 0 ? a : wf_gcd(b, a % b); }

template <bool GATED, int BM, int BNB, int NCW, int STAGES>
struct WfCfg {
    static constexpr int THREADS = 128 * (1 + NCW);
    static constexpr int BN = GATED ? BNB / 2 : BNB;  // output columns of a tile
    static constexpr int A_BYTES = BM * WF_BK;
    static constexpr int B_BYTES = BNB * WF_BK;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SC_STRIDE = BM + 8;  // floats of scales a stage: BM activation, up to 4 weight
    // ring + scale ring + run starts + tile prefix + warp counts + barriers + producer row table + 1024 for aligning the ring
    static constexpr int SMEM = STAGES * STAGE_BYTES + STAGES * SC_STRIDE * 4 + (2 * WF_MAX_RUNS + 32) * 4 + 2 * STAGES * 8 + BM * 4 + 1024;
    static_assert(BM % 64 == 0 && BM / 64 == NCW, "one 64-row group a consumer warpgroup");
    static_assert(BNB % 16 == 0 && BNB <= 256 && BN % 8 == 0, "wgmma N / tensor-map box");
    // A tile's columns n0 .. n0 + BN - 1 (n0 a multiple of BN) lie in at most two 128-wide scale blocks.
    static_assert(128 - wf_gcd(BN, 128) + BN <= 256, "a tile spans at most two weight-scale blocks");
    static_assert(THREADS / 32 <= 32, "warp counts");
    static_assert(STAGE_BYTES % 1024 == 0 && A_BYTES % 1024 == 0, "swizzled tiles stay 1024-aligned");
    static_assert(SMEM <= 232448, "shared memory");
};

template <bool GATED, int BM, int BNB, int NCW, int STAGES, int PREG, int CREG>
__device__ __forceinline__ void wf_body(const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
                                        const int* __restrict__ total_padded, const e4m3_t* __restrict__ aq,
                                        const float* __restrict__ as, int a_div, const WgTmap* tm0, const WgTmap* tm1,
                                        const float* __restrict__ s0, const float* __restrict__ s1, long long s_estride,
                                        bf16_t* __restrict__ c_bf16, float* __restrict__ c_f32, int numel, int N, int K,
                                        int block_size, int num_experts)
{
#ifdef WG_ENABLED
    typedef WfCfg<GATED, BM, BNB, NCW, STAGES> C;
    static_assert(128 * PREG + 128 * NCW * CREG <= 65536 && PREG % 8 == 0 && CREG % 8 == 0, "setmaxnreg");
    constexpr int BN = C::BN;
    constexpr int NBS = GATED ? 4 : 2;  // weight scales a stage
    extern __shared__ unsigned char wf_smem_raw[];
    unsigned char* ring = wf_smem_raw + ((1024u - (wg_smem_addr(wf_smem_raw) & 1023u)) & 1023u);
    float* scr = (float*)(ring + STAGES * C::STAGE_BYTES);  // [STAGES][SC_STRIDE]
    int* runs = (int*)(scr + STAGES * C::SC_STRIDE);        // [WF_MAX_RUNS]: run starts, then the end
    int* tp = runs + WF_MAX_RUNS;                           // [WF_MAX_RUNS]: first tile of each run
    int* wcnt = tp + WF_MAX_RUNS;                           // [32]
    unsigned long long* bars = (unsigned long long*)(wcnt + 32);  // 8-aligned: everything before is a multiple of 8 bytes
    int* rowt = (int*)(bars + 2 * STAGES);                  // [BM] activation row of each tile row (-1: padding), producer only
    const unsigned ring_s = wg_smem_addr(ring), scr_s = wg_smem_addr(scr);
    const unsigned full0 = wg_smem_addr(bars), empty0 = full0 + STAGES * 8;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            wg_bar_init(full0 + 8 * s, 129);         // every producer thread's copies, thread 0 once more with B's bytes
            wg_bar_init(empty0 + 8 * s, 128 * NCW);  // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    // Runs of equal expert ids over the 16-row sub-blocks (grouped_gemm_wg.cu).
    const int nsb = *total_padded / 16;
    int nruns = 0;
    for (int base = 0; base < nsb; base += C::THREADS) {
        int i = base + tid;
        bool f = false;
        if (i < nsb) f = i == 0 || expert_ids[(i * 16) / block_size] != expert_ids[((i - 1) * 16) / block_size];
        unsigned m = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wcnt[warp] = __popc(m);
        __syncthreads();
        int off = nruns, tot = 0;
#pragma unroll
        for (int w = 0; w < C::THREADS / 32; w++) {
            int c = wcnt[w];
            off += w < warp ? c : 0;
            tot += c;
        }
        if (f) {
            int pos = off + __popc(m & ((1u << lane) - 1u));
            if (pos < WF_MAX_RUNS - 1) runs[pos] = i;
        }
        nruns += tot;
        __syncthreads();
    }
    if (nruns > WF_MAX_RUNS - 1) __trap();
    if (warp == 0) {
        if (lane == 0) runs[nruns] = nsb;
        __syncwarp();
        int acc = 0;
        for (int r0 = 0; r0 < nruns; r0 += 32) {
            int r = r0 + lane, t = 0;
            if (r < nruns) {
                int e = expert_ids[(runs[r] * 16) / block_size];
                if (e >= 0 && e < num_experts) t = (runs[r + 1] - runs[r] + BM / 16 - 1) / (BM / 16);
            }
            int v = t;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, v, d);
                if (lane >= d) v += u;
            }
            if (r < nruns) tp[r] = acc + v - t;
            acc += __shfl_sync(0xffffffffu, v, 31);
        }
        if (lane == 0) tp[nruns] = acc;
    }
    __syncthreads();
    const int ncol = (N + BN - 1) / BN;
    const int items = __shfl_sync(0xffffffffu, tp[nruns] * ncol, 0);
    const int role = __shfl_sync(0xffffffffu, warp >> 2, 0);  // warpgroup
    const int nk = (K + WF_BK - 1) / WF_BK;                   // K steps = scale blocks of K
    const int nbn = (N + WF_SCALE_BLOCK - 1) / WF_SCALE_BLOCK;
#if WG_DYNAMIC
    // wcnt is free after the run table: [0, STAGES) the item of each stage, [8] the next item.
    int* sched_s = wcnt;
    unsigned* sched = GATED ? wg_sched_gate_up : wg_sched_down;
#endif

    if (role == 0) {
        // ---- producer warpgroup ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREG));
        const int c = tid & 7, r0 = tid >> 3;  // 16-byte chunk of the 128-byte K step; first row
        const unsigned long long bpol = wg_policy<WG_B_POLICY>(), apol = wg_policy<WG_A_POLICY>();
        int it = 0;
#if WG_DYNAMIC
        for (int w = blockIdx.x; w < items;) {
#else
        for (int w = blockIdx.x; w < items; w += gridDim.x) {
#endif
            WgTile t = wg_tile<BM>(w, ncol, BN, runs, tp, nruns, expert_ids, block_size);
            asm volatile("bar.sync 1, 128;\n" ::: "memory");  // the last tile's table is no longer read
            for (int i = tid; i < BM; i += 128) {
                int s = i < t.rows ? sorted_ids[t.sb0 * 16 + i] : -1;
                rowt[i] = (s >= 0 && s < numel) ? s / a_div : -1;
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
            const int ngrp = (t.rows + 63) >> 6;  // 64-row groups of A that hold real rows
            // Weight scales this thread copies each K step (tid < NBS): matrix tid >> 1, block lo / hi.
            const float* bsp = nullptr;
            if (tid < NBS) {
                const int blk = min((t.n0 >> 7) + (tid & 1), nbn - 1);
                bsp = (GATED && (tid >> 1) ? s1 : s0) + (long long)t.e * s_estride + (long long)blk * nk;
            }
            for (int kt = 0; kt < nk; kt++, it++) {
                const int s = it % STAGES, round = it / STAGES;
                if (round > 0) wg_bar_wait(empty0 + 8 * s, (round - 1) & 1);
                const int k = kt * WF_BK + c * 16;
                const bool kin = k < K;  // K % 16 == 0: a chunk is all in or all out
                const unsigned sa = ring_s + s * C::STAGE_BYTES, fb = full0 + 8 * s;
                const unsigned ss = scr_s + s * C::SC_STRIDE * 4;
                if (tid == 0) {
#if WG_DYNAMIC
                    if (kt == 0) sched_s[s] = w;  // the consumers read the item after this stage's full barrier
#endif
                    // B by the bulk tensor copy engine: rows past N and the K tail read as zeros.
                    wg_bar_arrive_tx(fb, C::B_BYTES);
                    if (GATED) {
                        wg_tma3p<WG_B_POLICY>(sa + C::A_BYTES, tm0, kt * WF_BK, t.n0, t.e, fb, bpol);
                        wg_tma3p<WG_B_POLICY>(sa + C::A_BYTES + C::B_BYTES / 2, tm1, kt * WF_BK, t.n0, t.e, fb, bpol);
                    } else {
                        wg_tma3p<WG_B_POLICY>(sa + C::A_BYTES, tm0, kt * WF_BK, t.n0, t.e, fb, bpol);
                    }
                }
#pragma unroll
                for (int j = 0; j < BM / 16; j++) {
                    if ((j >> 2) >= ngrp) continue;  // all-padding 64-row group: not read
                    const int r = r0 + 16 * j, row = rowt[r];
                    const bool ok = kin && row >= 0;
                    wg_cp16p<WG_A_POLICY>(sa + r * 128 + ((c ^ (r & 7)) << 4), ok ? aq + (long long)row * K + k : aq, ok ? 16u : 0u, apol);
                }
                for (int i = tid; i < BM; i += 128) {
                    if ((i >> 6) >= ngrp) continue;
                    const int row = rowt[i];
                    wf_cp4(ss + i * 4, row >= 0 ? as + (long long)row * nk + kt : as, row >= 0 ? 4u : 0u);
                }
                if (tid < NBS) wf_cp4(ss + (BM + tid) * 4, bsp + kt, 4u);
                // A and its scales complete on the same barrier, as one of its 128 arrivals.
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fb) : "memory");
            }
#if WG_DYNAMIC
            w = wg_next_item(sched, sched_s, tid);
#endif
        }
#if WG_DYNAMIC
        wg_end_items<STAGES>(sched, sched_s, tid, it, full0, empty0);
#endif
        asm volatile("cp.async.wait_all;\n" ::: "memory");  // no thread exits with copies in flight
    } else {
        // ---- consumer warpgroups ----
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CREG));
        const int cw = role - 1;  // 64-row group cw of the tile
        float acc[BNB / 2], part[BNB / 2];
        int it = 0;
#if WG_DYNAMIC
        for (;;) {
            const int w = wg_item_of_stage<STAGES>(sched_s, it, full0);
            if (w < 0) break;
#else
        for (int w = blockIdx.x; w < items; w += gridDim.x) {
#endif
            WgTile t = wg_tile<BM>(w, ncol, BN, runs, tp, nruns, expert_ids, block_size);
            const int na = __shfl_sync(0xffffffffu, cw * 64 < t.rows ? 1 : 0, 0);  // warpgroup-uniform
            if (na == 0) {
                // All its rows padding: keep the barrier protocol, no multiplies.
                for (int kt = 0; kt < nk; kt++, it++) {
                    wg_bar_wait(full0 + 8 * (it % STAGES), (it / STAGES) & 1);
                    wg_bar_arrive(empty0 + 8 * (it % STAGES));
                }
                continue;
            }
            wf_consume<GATED, BM, BNB, STAGES, C::STAGE_BYTES>(acc, part, ring_s + cw * 64 * 128, ring_s + C::A_BYTES, scr,
                                                               cw * 64, t.n0, nk, it, full0, empty0);
            wf_epilogue<GATED, BN>(acc, cw * 64, t, sorted_ids, c_bf16, c_f32, numel, N);
        }
    }
#else
    __trap();
#endif
}

// The default instance; kernels/grouped_gemm.go mirrors its block size and shared memory.
#define WF_SMEM_BYTES (WfCfg<true, WF_BM, WF_BNB, WF_NCW, WF_STAGES>::SMEM)
static_assert(WfCfg<true, WF_BM, WF_BNB, WF_NCW, WF_STAGES>::SMEM == WfCfg<false, WF_BM, WF_BNB, WF_NCW, WF_STAGES>::SMEM, "one size for both");
static_assert(WfCfg<true, WF_BM, WF_BNB, WF_NCW, WF_STAGES>::THREADS == WF_THREADS, "block size");

// Tensor maps: boxes {128, WF_BNB / 2, 1} (gate, up) and {128, WF_BNB, 1} (down).
// xq [T, H] e4m3 and xs [T, ceil(H/128)] from moe_act_quant_e4m3 on x.
extern "C" __global__ void __launch_bounds__(WF_THREADS, 1) moe_gate_up_wg_fp8_fp8(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const e4m3_t* xq, const float* xs,
    const e4m3_t* w_gate, const e4m3_t* w_up, long long w_estride, const float* s_gate, const float* s_up,
    long long s_estride, bf16_t* inter, int numel, int topk, int I, int H, int block_size, int num_experts,
    const __grid_constant__ WgTmap tm_gate, const __grid_constant__ WgTmap tm_up)
{
    // On targets other than sm_90a wf_body only traps: the Go side never launches it there.
    wf_body<true, WF_BM, WF_BNB, WF_NCW, WF_STAGES, WF_PRODUCER_REGS, WF_CONSUMER_REGS>(
        sorted_ids, expert_ids, total_padded, xq, xs, topk, &tm_gate, &tm_up, s_gate, s_up, s_estride, inter, nullptr,
        numel, I, H, block_size, num_experts);
}

// iq [numel, I] e4m3 and is [numel, ceil(I/128)] from moe_act_quant_e4m3 on the bf16 intermediate.
extern "C" __global__ void __launch_bounds__(WF_THREADS, 1) moe_down_wg_fp8_fp8(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const e4m3_t* iq, const float* is,
    const e4m3_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out, int numel, int H,
    int I, int block_size, int num_experts, const __grid_constant__ WgTmap tm_down)
{
    wf_body<false, WF_BM, WF_BNB, WF_NCW, WF_STAGES, WF_PRODUCER_REGS, WF_CONSUMER_REGS>(
        sorted_ids, expert_ids, total_padded, iq, is, 1, &tm_down, &tm_down, s_down, s_down, s_estride, nullptr, out,
        numel, H, I, block_size, num_experts);
}
