// Hopper (sm_90a) grouped GEMM for the MoE expert layer: wgmma from shared
// memory fed by a multi-stage pipeline (cp.async for the gathered rows, the
// bulk tensor copy engine for the weights). Same functions and kernel
// parameter lists as the "tall" mma.sync kernels of grouped_gemm.cu, plus
// one tensor map per weight matrix at the end (whose header describes the
// inputs: sorted_ids / expert_ids / total_padded from
// moe_align_block_size, weights [E,N,K] with K contiguous, i.e. C = A B^T):
//   moe_gate_up_wg_bf16_bf16: inter[s,n] = bf16(silu(x[s/topk].Wg[e,n]) * (x[s/topk].Wu[e,n]))
//   moe_down_wg_bf16_bf16:    out[s,n]   = inter[s].Wd[e,n]            (f32)
// with the tall kernels' epilogue rounding (silu in f64, product rounded
// once to f32, then to bf16 nearest-even), so the two paths differ only by
// the f32 summation order.
//
// Tiles: 192 rows (twelve 16-row sub-blocks of one expert's run, as tall's
// tiles follow the alignment at 16-row granularity) x 192 B rows: gate_up
// stacks 96 gate and 96 up rows of the same output columns so the SiLU
// epilogue stays in one thread; down takes 192 output columns. Why 192
// rows: a routed DeepSeek-V3 expert has ~128-160 rows at T = 4096 (mean
// T / 32; one 192-row tile up to about T = 4800), so it is one row tile and
// its weights cross HBM once per layer; the former 128 x 256 tile took two
// row tiles, i.e. two weight passes (issue 13 pass 5, kernels/GEMM_NOTES.md:
// -31% at T = 4096 on the H100, +0.3% at T = 1024, bit-identical outputs).
// K steps of 64 bf16 = one 128-byte row, stored with the 128-byte swizzle
// that the wgmma shared-memory descriptors name.
//
// CTA: 4 warpgroups (512 threads). Warpgroup 0 produces into a ring of
// WG_STAGES stages of 48 KB (A 24 KB + B 24 KB). The weight tile B comes by
// the bulk tensor copy engine: thread 0 issues one copy per stage (two for
// gate_up: 96 gate rows, then 96 up rows) through the tensor map of the
// weight matrix (a __grid_constant__ parameter the host encodes: the 3D
// view {K, N, experts}, box {64, rows, 1}, 128-byte swizzle, zeros outside
// N and K), completing on the stage's "full" mbarrier with the byte count
// thread 0 announced in its arrive.expect_tx. The gathered A rows (through
// sorted_ids) stay on 16-byte cp.async by the 128 producer threads, which
// arrive on the same mbarrier through cp.async.mbarrier.arrive.noinc (init
// count 129: the 128 copy arrivals and thread 0's expect_tx); 64-row groups
// that are all padding are neither copied nor multiplied. cp.async writes
// through the generic proxy and wgmma reads through the async proxy, so the
// consumers fence the async proxy after the barrier. Warpgroups 1-3
// consume: warpgroup c owns rows 64c .. 64c + 63 of the tile and issues one
// m64n192k16 wgmma per k16 (A and B from shared memory, f32 accumulators in
// registers, 96 a thread); a warpgroup whose 64 rows are all padding skips
// the multiplies but keeps the barrier protocol. A stage is released on its
// "empty" mbarrier (init count 384, every consumer thread) once
// wgmma.wait_group shows the multiplies that read it are done. The launch
// gives 128 registers a thread (the 512-thread cap, 65536 in all);
// setmaxnreg moves them from the producer (40) to the consumers (152).
//
// Schedule: a persistent grid (one CTA per SM; the launch sets the grid).
// Every CTA first derives the same tile list from expert_ids: the runs of
// equal expert ids over 16-row sub-blocks, each run of a local expert cut
// into ceil(len/12) row tiles. A run of n row tiles owns n x ncol work
// items in (column tile, row tile) order (row tiles fastest). A CTA's first
// item is blockIdx.x; its producer takes each next one from a global counter
// (wg_next_item in wg_common.cuh) and passes it to the consumers with the
// stage. So items start in order: the row tiles of a large run (a shared
// expert's replicas) share each weight tile through L2, and the column tiles
// of one expert, started together, share its gathered A rows through L2.
// The round-robin order before it (w = blockIdx.x + i * gridDim.x, still
// built with -DWG_DYNAMIC=0) let CTAs drift apart over their ~45 items at
// T=4096: gate_up read 20.3 GB from DRAM against 17.7 GB now, and took
// 7.17 ms against 6.52 ms (H100; kernels/GEMM_NOTES.md, pass 8).
//
// Limits (checked by the Go side, which falls back to the tall kernels):
// K % 8 == 0 (16-byte copies and tensor-map strides; the K tail of a step is
// zero-filled), 16-byte aligned weight matrices and expert strides, at
// most WG_MAX_RUNS - 1 runs (2 * experts + 1 bounds them), block_size a
// multiple of 16. Any N: columns past N are zero-filled and not written.
//
// Built for every target of the fatbin; only sm_90a has wgmma and
// setmaxnreg, so elsewhere the kernels are stubs that trap (the Go side
// picks this path on compute capability 9.0 only).
//
// The kernels instantiate the template below as <192, 192, 3, 4, 40, 152>:
// each consumer warpgroup owns one 64-row group of a tile. The tile
// variants measured before it (128 x 256, 256 x 128 with two row groups a
// warpgroup) are in kernels/GEMM_NOTES.md and at commit 117bd15.

#include "wg_common.cuh"

// The tile (the Go side mirrors these: kernels/grouped_gemm.go wgBN, wgSmemBytes, the block size).
#define WG_BM 192   // rows of a tile: WG_NCW consumer warpgroups x 64
#define WG_BNB 192  // weight rows of a tile: tensor-map boxes {64, 96, 1} (gate, up) and {64, 192, 1} (down)
#define WG_NCW 3    // consumer warpgroups
#define WG_BK 64
#define WG_STAGES 4
#define WG_PRODUCER_REGS 40
#define WG_CONSUMER_REGS 152  // 128 x 40 + 384 x 152 = 63488 <= 512 x 128, the launch allocation
#define WG_THREADS (128 * (1 + WG_NCW))
#define WG_MAX_RUNS 2048
#define WG_A_BYTES (WG_BM * WG_BK * 2)
#define WG_B_BYTES (WG_BNB * WG_BK * 2)
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)
// ring + run starts + tile prefix + warp counts + barriers + producer row table + 1024 for aligning the ring
// (215744 bytes)
#define WG_SMEM_BYTES (WG_STAGES * WG_STAGE_BYTES + (2 * WG_MAX_RUNS + 32) * 4 + 2 * WG_STAGES * 8 + WG_BM * 8 + 1024)

static_assert(128 * WG_PRODUCER_REGS + 128 * WG_NCW * WG_CONSUMER_REGS <= 65536, "setmaxnreg: more registers than the launch has");
static_assert(WG_PRODUCER_REGS % 8 == 0 && WG_CONSUMER_REGS % 8 == 0, "setmaxnreg takes multiples of 8");

template <int N>
__device__ __forceinline__ void wg_mma(float* d, unsigned long long da, unsigned long long db, int scale_d);

#ifdef WG_ENABLED

// d[0..63] (+)= A(64x16) B(128x16)^T; scale_d 0 overwrites d.
template <>
__device__ __forceinline__ void wg_mma<128>(float* d, unsigned long long da, unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// d[0..95] (+)= A(64x16) B(192x16)^T; scale_d 0 overwrites d.
template <>
__device__ __forceinline__ void wg_mma<192>(float* d, unsigned long long da, unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// The K loop of one tile for a consumer warpgroup's 64-row group at a0 in stage 0.
template <int NB, int STAGES, int STAGE_BYTES>
__device__ __forceinline__ void wg_consume(float* acc0, unsigned a0, unsigned b0, int nk, int& it, unsigned full0,
                                           unsigned empty0)
{
    for (int kt = 0; kt < nk; kt++, it++) {
        const int s = it % STAGES;
        wg_bar_wait(full0 + 8 * s, (it / STAGES) & 1);
        // A was written by cp.async (generic proxy); wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const unsigned sa = a0 + s * STAGE_BYTES, sb = b0 + s * STAGE_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) {
            wg_mma<NB>(acc0, wg_desc(sa + kk * 32), wg_desc(sb + kk * 32), (kt | kk) != 0);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kt > 0) wg_bar_arrive(empty0 + 8 * ((it - 1) % STAGES));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wg_bar_arrive(empty0 + 8 * ((it - 1) % STAGES));
}

// Epilogue of one 64-row group (rows rg .. rg + 63 of tile t):
// the thread holds rows g and g + 8 of its warp's 16, columns 8j + 2q + {0,1}
// (acc[4j + 2h + i]); gate_up's up columns are j + BN / 8.
template <bool GATED, int BN>
__device__ __forceinline__ void wg_epilogue(const float* acc, int rg, const WgTile& t, const int* __restrict__ sorted_ids,
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

template <int BM, int BNB, int NCW, int STAGES>
struct WgCfg {
    static constexpr int THREADS = 128 * (1 + NCW);
    static constexpr int A_BYTES = BM * WG_BK * 2;
    static constexpr int B_BYTES = BNB * WG_BK * 2;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    // ring + run starts + tile prefix + warp counts + barriers + producer row table + 1024 for aligning the ring
    static constexpr int SMEM = STAGES * STAGE_BYTES + (2 * WG_MAX_RUNS + 32) * 4 + 2 * STAGES * 8 + BM * 8 + 1024;
    static_assert(BM == 64 * NCW, "one 64-row group a consumer warpgroup");
    static_assert(BNB % 16 == 0 && BNB <= 256 && (BNB / 2) % 8 == 0, "wgmma N / tensor-map box");
    static_assert(THREADS / 32 <= 32, "warp counts");
    static_assert(SMEM <= 232448, "shared memory");
};

template <bool GATED, int BM, int BNB, int NCW, int STAGES, int PREG, int CREG>
__device__ __forceinline__ void wg_body(const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
                                        const int* __restrict__ total_padded, const bf16_t* __restrict__ a, int a_div,
                                        const WgTmap* tm0, const WgTmap* tm1, bf16_t* __restrict__ c_bf16,
                                        float* __restrict__ c_f32, int numel, int N, int K, int block_size, int num_experts)
{
#ifdef WG_ENABLED
    typedef WgCfg<BM, BNB, NCW, STAGES> C;
    constexpr int BN = GATED ? BNB / 2 : BNB;  // output columns per tile
    extern __shared__ unsigned char wg_smem_raw[];
    unsigned char* ring = wg_smem_raw + ((1024u - (wg_smem_addr(wg_smem_raw) & 1023u)) & 1023u);
    int* runs = (int*)(ring + STAGES * C::STAGE_BYTES);  // [WG_MAX_RUNS]: run starts, then the end
    int* tp = runs + WG_MAX_RUNS;                        // [WG_MAX_RUNS]: first tile of each run
    int* wcnt = tp + WG_MAX_RUNS;                        // [32]
    unsigned long long* bars = (unsigned long long*)(wcnt + 32);
    const bf16_t** rowp = (const bf16_t**)(bars + 2 * STAGES);  // [BM], producer only
    const unsigned ring_s = wg_smem_addr(ring);
    const unsigned full0 = wg_smem_addr(bars), empty0 = full0 + STAGES * 8;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            wg_bar_init(full0 + 8 * s, 129);          // every producer thread arrives for A, thread 0 once more with B's bytes
            wg_bar_init(empty0 + 8 * s, 128 * NCW);   // every consumer thread arrives
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    // Runs of equal expert ids over the 16-row sub-blocks, compacted in order.
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
            if (pos < WG_MAX_RUNS - 1) runs[pos] = i;
        }
        nruns += tot;
        __syncthreads();
    }
    if (nruns > WG_MAX_RUNS - 1) __trap();
    // Row tiles of each run (0 for experts not on this rank), prefix-summed by warp 0.
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
    const int nk = (K + WG_BK - 1) / WG_BK;
#if WG_DYNAMIC
    // wcnt is free after the run table: [0, STAGES) the item of each stage, [8] the next item.
    int* sched_s = wcnt;
    unsigned* sched = GATED ? wg_sched_gate_up : wg_sched_down;
#endif

    if (role == 0) {
        // ---- producer warpgroup ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREG));
        const int c = tid & 7, r0 = tid >> 3;  // 16-byte chunk of the K step; first row
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
                const bf16_t* p = nullptr;
                int s = i < t.rows ? sorted_ids[t.sb0 * 16 + i] : -1;
                if (s >= 0 && s < numel) p = a + (long long)(s / a_div) * K;
                rowp[i] = p;
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
            const int ngrp = (t.rows + 63) >> 6;  // 64-row groups of A that hold real rows
            for (int kt = 0; kt < nk; kt++, it++) {
                const int s = it % STAGES, round = it / STAGES;
                if (round > 0) wg_bar_wait(empty0 + 8 * s, (round - 1) & 1);
                const int k = kt * WG_BK + c * 8;
                const bool kin = k < K;
                const unsigned sa = ring_s + s * C::STAGE_BYTES, fb = full0 + 8 * s;
                if (tid == 0) {
#if WG_DYNAMIC
                    if (kt == 0) sched_s[s] = w;  // the consumers read the item after this stage's full barrier
#endif
                    // B by the bulk tensor copy engine: rows past N and the K tail read as zeros.
                    wg_bar_arrive_tx(fb, C::B_BYTES);
                    if (GATED) {
                        wg_tma3p<WG_B_POLICY>(sa + C::A_BYTES, tm0, kt * WG_BK, t.n0, t.e, fb, bpol);
                        wg_tma3p<WG_B_POLICY>(sa + C::A_BYTES + C::B_BYTES / 2, tm1, kt * WG_BK, t.n0, t.e, fb, bpol);
                    } else {
                        wg_tma3p<WG_B_POLICY>(sa + C::A_BYTES, tm0, kt * WG_BK, t.n0, t.e, fb, bpol);
                    }
                }
#pragma unroll
                for (int j = 0; j < BM / 16; j++) {
                    if ((j >> 2) >= ngrp) continue;  // all-padding 64-row group: not read
                    int r = r0 + 16 * j;
                    const bf16_t* p = rowp[r];
                    bool ok = kin && p != nullptr;
                    wg_cp16p<WG_A_POLICY>(sa + r * 128 + ((c ^ (r & 7)) << 4), ok ? p + k : a, ok ? 16u : 0u, apol);
                }
                // A completes on the same barrier, as one of its 128 arrivals.
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
        float acc0[BNB / 2];
        int it = 0;
#if WG_DYNAMIC
        for (;;) {
            const int w = wg_item_of_stage<STAGES>(sched_s, it, full0);
            if (w < 0) break;
#else
        for (int w = blockIdx.x; w < items; w += gridDim.x) {
#endif
            WgTile t = wg_tile<BM>(w, ncol, BN, runs, tp, nruns, expert_ids, block_size);
            // Whether this warpgroup's group has a real row, warpgroup-uniform.
            const int na = __shfl_sync(0xffffffffu, cw * 64 < t.rows, 0);
            const unsigned sa0 = ring_s + cw * 64 * 128, sb0 = ring_s + C::A_BYTES;  // stage 0
            if (na == 0) {
                // All its rows padding: keep the barrier protocol, no multiplies.
                for (int kt = 0; kt < nk; kt++, it++) {
                    wg_bar_wait(full0 + 8 * (it % STAGES), (it / STAGES) & 1);
                    wg_bar_arrive(empty0 + 8 * (it % STAGES));
                }
                continue;
            }
            wg_consume<BNB, STAGES, C::STAGE_BYTES>(acc0, sa0, sb0, nk, it, full0, empty0);
            wg_epilogue<GATED, BN>(acc0, cw * 64, t, sorted_ids, c_bf16, c_f32, numel, N);
        }
    }
#else
    __trap();
#endif
}

// Only the <WG_BM, WG_BNB, WG_NCW, WG_STAGES> instance is launched; the Go side mirrors its block size and shared memory.
static_assert(WgCfg<WG_BM, WG_BNB, WG_NCW, WG_STAGES>::THREADS == WG_THREADS, "block size");
static_assert(WgCfg<WG_BM, WG_BNB, WG_NCW, WG_STAGES>::SMEM == WG_SMEM_BYTES, "dynamic shared memory");

// Tensor maps: boxes {64, WG_BNB / 2, 1} (gate, up) and {64, WG_BNB, 1} (down).
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) moe_gate_up_wg_bf16_bf16(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* x,
    const bf16_t* w_gate, const bf16_t* w_up, long long w_estride, const float* s_gate,
    const float* s_up, long long s_estride, bf16_t* inter, int numel, int topk, int I, int H,
    int block_size, int num_experts, const __grid_constant__ WgTmap tm_gate, const __grid_constant__ WgTmap tm_up)
{
    // On targets other than sm_90a wg_body only traps: the Go side never launches it there.
    wg_body<true, WG_BM, WG_BNB, WG_NCW, WG_STAGES, WG_PRODUCER_REGS, WG_CONSUMER_REGS>(
        sorted_ids, expert_ids, total_padded, x, topk, &tm_gate, &tm_up, inter, nullptr, numel, I, H, block_size, num_experts);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) moe_down_wg_bf16_bf16(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* inter,
    const bf16_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out,
    int numel, int H, int I, int block_size, int num_experts, const __grid_constant__ WgTmap tm_down)
{
    wg_body<false, WG_BM, WG_BNB, WG_NCW, WG_STAGES, WG_PRODUCER_REGS, WG_CONSUMER_REGS>(
        sorted_ids, expert_ids, total_padded, inter, 1, &tm_down, &tm_down, nullptr, out, numel, H, I, block_size, num_experts);
}
