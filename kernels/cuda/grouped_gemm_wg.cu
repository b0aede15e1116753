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
// its weights cross HBM once per layer, where a 128 x 256 tile takes two
// row tiles, i.e. two weight passes (kernels/GEMM_NOTES.md: -31% at
// T = 4096 on the H100, +0.3% at T = 1024, bit-identical outputs).
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
// The round-robin order (w = blockIdx.x + i * gridDim.x, built with
// -DWG_DYNAMIC=0) lets CTAs drift apart over their ~45 items at T=4096:
// gate_up read 20.3 GB from DRAM against 17.7 GB, and took 7.17 ms against
// 6.52 ms (H100; kernels/GEMM_NOTES.md).
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
// The CTA is wg_common.cuh's wg_grouped_gemm, shared with the w8a8 kernels
// of grouped_gemm_wg_fp8.cu; WgBf16 below is its bf16 variant, instantiated
// as <192, 192, 3, 4, 40, 152>: each consumer warpgroup owns one 64-row
// group of a tile. The other tile shapes measured (128 x 256, 256 x 128
// with two row groups a warpgroup) are in kernels/GEMM_NOTES.md.

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
#define WG_A_BYTES (WG_BM * WG_BK * 2)
#define WG_B_BYTES (WG_BNB * WG_BK * 2)
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)
// ring + run starts + tile prefix + warp counts + barriers + producer row table + 1024 for aligning the ring
// (215744 bytes)
#define WG_SMEM_BYTES (WG_STAGES * WG_STAGE_BYTES + (2 * WG_MAX_RUNS + 32) * 4 + 2 * WG_STAGES * 8 + WG_BM * 8 + 1024)

// The bf16 variant of wg_grouped_gemm: K steps of WG_BK bf16, the producer's
// row table holds a pointer to each tile row's activation row (nullptr:
// padding), no scales; each consumer warpgroup issues one m64nBNBk16 wgmma
// per k16 into its accumulator.
template <class S>
struct WgBf16 : WgVariant<S, bf16_t, const bf16_t*, 0> {
#ifdef WG_ENABLED
    static __device__ __forceinline__ const bf16_t* row_of(const bf16_t* a, int s, int numel, int a_div, int K)
    {
        const bf16_t* p = nullptr;
        if (s >= 0 && s < numel) p = a + (long long)(s / a_div) * K;
        return p;
    }
    static __device__ __forceinline__ bool has_row(const bf16_t* p) { return p != nullptr; }
    static __device__ __forceinline__ const bf16_t* row_src(const bf16_t*, const bf16_t* p, int k, int) { return p + k; }
    static __device__ __forceinline__ const float* tile_scales(const WgTile&, int, const float*, const float*, long long, int, int)
    {
        return nullptr;
    }
    static __device__ __forceinline__ void copy_scales(unsigned, int, int, const bf16_t* const*, const float*, int, int,
                                                       const float*) {}

    // The K loop of one tile for a consumer warpgroup's 64-row group at a0
    // (B at b0) in stage 0; acc is overwritten (scale_d 0 on the first k16).
    static __device__ __forceinline__ void consume(float* acc, float*, unsigned a0, unsigned b0, const float*, int, int, int nk,
                                                   int& it, unsigned full0, unsigned empty0)
    {
        for (int kt = 0; kt < nk; kt++, it++) {
            wg_stage_mma<bf16_t, S::BNB, S::STAGES, S::STAGE_BYTES>(acc, a0, b0, it, kt != 0, full0);
            // The previous step's group is done: its stage is released, this one stays in flight.
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (kt > 0) wg_bar_arrive(empty0 + 8 * ((it - 1) % S::STAGES));
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_bar_arrive(empty0 + 8 * ((it - 1) % S::STAGES));
    }
#endif
};

// Only this instance is launched; the Go side mirrors its block size and shared memory.
typedef WgBf16<WgShape<true, WG_BM, WG_BNB, WG_NCW, WG_STAGES, WG_PRODUCER_REGS, WG_CONSUMER_REGS>> WgBf16GateUp;
typedef WgBf16<WgShape<false, WG_BM, WG_BNB, WG_NCW, WG_STAGES, WG_PRODUCER_REGS, WG_CONSUMER_REGS>> WgBf16Down;
static_assert(WgBf16GateUp::shape::THREADS == WG_THREADS && WgBf16Down::shape::THREADS == WG_THREADS, "block size");
static_assert(WgBf16GateUp::L::SMEM == WG_SMEM_BYTES && WgBf16Down::L::SMEM == WG_SMEM_BYTES, "dynamic shared memory");
static_assert(WgBf16GateUp::shape::STAGE_BYTES == WG_STAGE_BYTES && WgBf16GateUp::BK == WG_BK, "stage");

// Tensor maps: boxes {64, WG_BNB / 2, 1} (gate, up) and {64, WG_BNB, 1} (down).
// On targets other than sm_90a wg_grouped_gemm only traps: the Go side never launches these there.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) moe_gate_up_wg_bf16_bf16(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* x,
    const bf16_t* w_gate, const bf16_t* w_up, long long w_estride, const float* s_gate,
    const float* s_up, long long s_estride, bf16_t* inter, int numel, int topk, int I, int H,
    int block_size, int num_experts, const __grid_constant__ WgTmap tm_gate, const __grid_constant__ WgTmap tm_up)
{
    wg_grouped_gemm<WgBf16GateUp>(sorted_ids, expert_ids, total_padded, x, nullptr, topk, &tm_gate, &tm_up, nullptr, nullptr, 0,
                                  inter, nullptr, numel, I, H, block_size, num_experts);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) moe_down_wg_bf16_bf16(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* inter,
    const bf16_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out,
    int numel, int H, int I, int block_size, int num_experts, const __grid_constant__ WgTmap tm_down)
{
    wg_grouped_gemm<WgBf16Down>(sorted_ids, expert_ids, total_padded, inter, nullptr, 1, &tm_down, &tm_down, nullptr, nullptr, 0,
                                nullptr, out, numel, H, I, block_size, num_experts);
}
