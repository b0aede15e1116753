// The Hopper (sm_90a) grouped GEMMs' shared CTA: grouped_gemm_wg.cu (bf16 x
// bf16) and grouped_gemm_wg_fp8.cu (e4m3 x e4m3, w8a8) are the same kernel
// (grouped_gemm_wg.cu's header describes it) over a different element type:
// wg_grouped_gemm below is its body (shared-memory layout, the run table,
// the persistent schedule, the producer and consumer warpgroups, the
// epilogue), and each source supplies a variant V, a struct with its tile
// constants, its gathered-row table and the consumers' K loop (see WgBf16
// in grouped_gemm_wg.cu and WgW8A8 in grouped_gemm_wg_fp8.cu). Each .cu is
// its own fatbin and includes this file.
#pragma once
#include "numeric.cuh"

// A CUtensorMap (128 opaque bytes, 64-byte aligned), built on the host by
// cuTensorMapEncodeTiled: 3D view {K, N, E} of a weight matrix (bf16, or e4m3 as
// UINT8; strides in bytes), box {128 bytes of K, rows of B per copy, 1},
// 128-byte swizzle, out-of-bounds elements filled with zeros.
struct alignas(64) WgTmap {
    unsigned long long v[16];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ENABLED 1
#endif

// Run starts kept per CTA (the run table): at most WG_MAX_RUNS - 1 runs of
// equal expert ids (2 x experts + 1 bound them; kernels/grouped_gemm.go,
// wgMaxExperts).
#define WG_MAX_RUNS 2048

// Dynamic schedule (WG_DYNAMIC 1): a CTA's first item is blockIdx.x, each
// next one the next free item of a global counter, so CTAs that the memory
// system serves more slowly take fewer items, and the column tiles of one
// expert (which read the same gathered rows) run close together in time
// instead of drifting apart over a CTA's ~45 items. Each kernel of a module
// has its own counter pair {next, done}; the last CTA to finish resets it
// for the next launch, so launches of one kernel must not overlap (the Go
// side queues the layer on one stream).
#ifndef WG_DYNAMIC
#define WG_DYNAMIC 1
#endif
#if WG_DYNAMIC
// Outside WG_ENABLED: a runtime-API build (scripts/wg/harness.cu) registers device
// variables from its host pass, which must declare them too.
__device__ unsigned wg_sched_gate_up[2], wg_sched_down[2];
#endif

#ifdef WG_ENABLED

__device__ __forceinline__ unsigned wg_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void wg_bar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_bar_arrive(unsigned bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void wg_bar_wait(unsigned bar, unsigned parity)
{
    // The retry loop stays inside one asm block. With a C++ loop around
    // try_wait (and the roles taken from threadIdx without a broadcast)
    // ptxas warned C7518 and serialised every wgmma; with both changed it
    // does not.
    asm volatile("{\n.reg .pred p;\nWG_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WG_WAIT;\n}\n" ::"r"(bar), "r"(parity)
                 : "memory");
}

// 16-byte async copy; src_bytes 0 zero-fills the destination without reading.
__device__ __forceinline__ void wg_cp16(unsigned dst, const void* src, unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// 4-byte async copy (cp-size 4 exists only with .ca); src_bytes 0 writes zero.
__device__ __forceinline__ void wg_cp4(unsigned dst, const void* src, unsigned src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// L2 cache policies of the producer's copies: WG_B_POLICY for the weight
// tiles, WG_A_POLICY for the gathered activation rows; 0 no hint, 1
// evict_first, 2 evict_last, 3 evict_normal. Each gathered row is read by
// every column tile of its expert (22 for gate_up, 38 for down at 192
// columns), while each weight byte is read once and streams through L2 at
// ~3 TB/s, pushing the rows out between those reads: at T=4096 (H100) the
// bf16 gate_up read 20.7 GB from DRAM for 15.5 GB of weights and 0.5 GB of
// rows. evict_last on the rows (the default) took gate_up 7.40 -> 7.18 ms,
// down 4.21 -> 3.95 ms and the w8a8 layer 8.89 -> 8.77 ms; evict_first on
// the weights was slower (7.50 ms), and so were tensor maps promoting 128
// bytes or none instead of 256 (8.3 ms; kernels/GEMM_NOTES.md).
#ifndef WG_B_POLICY
#define WG_B_POLICY 0
#endif
#ifndef WG_A_POLICY
#define WG_A_POLICY 2
#endif

template <int P>
__device__ __forceinline__ unsigned long long wg_policy()
{
    unsigned long long pol = 0;
    if (P == 1) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    if (P == 2) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    if (P == 3) asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

// wg_cp16 with an L2 policy (P 0: no hint).
template <int P>
__device__ __forceinline__ void wg_cp16p(unsigned dst, const void* src, unsigned src_bytes, unsigned long long pol)
{
    if (P == 0) wg_cp16(dst, src, src_bytes);
    else
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(src_bytes),
                     "l"(pol)
                     : "memory");
}

__device__ __forceinline__ void wg_bar_arrive_tx(unsigned bar, unsigned bytes)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Bulk tensor copy of box {128 bytes of K, rows, 1} at (k, n, e) into dst (1024-aligned),
// completing its bytes on bar.
__device__ __forceinline__ void wg_tma3(unsigned dst, const WgTmap* tm, int k, int n, int e, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(tm), "r"(k), "r"(n), "r"(e), "r"(bar)
                 : "memory");
}
// wg_tma3 with an L2 policy (P 0: no hint).
template <int P>
__device__ __forceinline__ void wg_tma3p(unsigned dst, const WgTmap* tm, int k, int n, int e, unsigned bar, unsigned long long pol)
{
    if (P == 0) wg_tma3(dst, tm, k, n, e, bar);
    else
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
                     "l"(tm), "r"(k), "r"(n), "r"(e), "r"(bar), "l"(pol)
                     : "memory");
}

// Shared-memory matrix descriptor of a K-major tile with the 128-byte
// swizzle: start address >> 4 (bits 0-13), leading byte offset (unused for
// swizzled K-major tiles; 1 by convention, bits 16-29), stride byte offset
// 1024 >> 4 between 8-row groups (bits 32-45), base offset 0 (the ring is
// 1024-aligned), swizzle mode 1 = 128 B (bits 62-63). Stepping K by 16
// elements inside the 128-byte row adds 32 bytes to the start address: the
// hardware applies the swizzle to the computed addresses.
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr)
{
    return (unsigned long long)((saddr & 0x3FFFFu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

#if WG_DYNAMIC
// The producer warpgroup's next item (every producer thread calls it).
__device__ __forceinline__ int wg_next_item(unsigned* sched, int* sched_s, int tid)
{
    if (tid == 0) ((volatile int*)sched_s)[8] = (int)atomicAdd(&sched[0], 1u) + (int)gridDim.x;
    // The value is overwritten only after two more producer barriers, which every reader passes first.
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    return ((volatile int*)sched_s)[8];
}

// The producer's end: stage `it` carries item -1 to the consumers (no copies,
// all 129 arrivals), then the done ticket; the last CTA resets the counters.
template <int STAGES>
__device__ __forceinline__ void wg_end_items(unsigned* sched, int* sched_s, int tid, int it, unsigned full0, unsigned empty0)
{
    static_assert(STAGES <= 8, "sched_s holds the stages' items in [0, 8)");
    const int s = it % STAGES, round = it / STAGES;
    if (round > 0) wg_bar_wait(empty0 + 8 * s, (round - 1) & 1);
    if (tid == 0) ((volatile int*)sched_s)[s] = -1;
    wg_bar_arrive(full0 + 8 * s);
    if (tid == 0) {
        wg_bar_arrive(full0 + 8 * s);
        __threadfence();
        if (atomicAdd(&sched[1], 1u) == gridDim.x - 1) {
            sched[0] = 0;
            sched[1] = 0;
        }
    }
}

// A consumer's next item: waits for stage `it` to fill and reads its item (-1: none left).
template <int STAGES>
__device__ __forceinline__ int wg_item_of_stage(const int* sched_s, int it, unsigned full0)
{
    wg_bar_wait(full0 + 8 * (it % STAGES), (it / STAGES) & 1);
    return ((const volatile int*)sched_s)[it % STAGES];
}
#endif

// wgmma.mma_async with both operands in shared memory (descriptors da, db,
// K-major): d[0 .. N/2) (+)= A (64 x k) B (N x k)^T over one k16 of bf16 or
// k32 of e4m3 (32 bytes of K either way); scale_d 0 overwrites d. A thread's
// accumulator fragment: 64 (N = 128) or 96 (N = 192) f32, the operands
// WG_ACC_N of d and the registers WG_REGS_N of the instruction. fp8 wgmma
// takes no transpose immediates (both operands are K-major anyway).
template <class T, int N>
__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long da, unsigned long long db, int scale_d);
#define WG_ACC_128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_ACC_192 WG_ACC_128, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define WG_REGS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_REGS_192 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
// One specialization: SHAPE the instruction's shape and types, IMM its
// immediates after the predicate, DA DB SD the operand numbers of da, db
// and scale_d (after the N/2 accumulators).
#define WGMMA_SS(T, N, SHAPE, IMM, DA, DB, SD)                                                                         \
    template <>                                                                                                      \
    __device__ __forceinline__ void wgmma_ss<T, N>(float* d, unsigned long long da, unsigned long long db, int scale_d) \
    {                                                                                                                \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SD ", 0;\n"                                              \
                     "wgmma.mma_async.sync.aligned." SHAPE " " WG_REGS_##N ", %" #DA ", %" #DB ", p" IMM ";\n}\n"    \
                     : WG_ACC_##N                                                                                    \
                     : "l"(da), "l"(db), "r"(scale_d));                                                              \
    }
WGMMA_SS(bf16_t, 128, "m64n128k16.f32.bf16.bf16", ", 1, 1, 0, 0", 64, 65, 66)
WGMMA_SS(bf16_t, 192, "m64n192k16.f32.bf16.bf16", ", 1, 1, 0, 0", 96, 97, 98)
WGMMA_SS(e4m3_t, 128, "m64n128k32.f32.e4m3.e4m3", ", 1, 1", 64, 65, 66)
WGMMA_SS(e4m3_t, 192, "m64n192k32.f32.e4m3.e4m3", ", 1, 1", 96, 97, 98)

// A consumer warpgroup's multiplies of one K step: waits for stage it %
// STAGES to fill, then issues the step's four wgmmas (128 bytes of K, 32 a
// wgmma) of its 64 rows at a0 against the B tile at b0 (addresses in stage
// 0) into d, the first overwriting d unless keep, and commits them. Returns
// the stage; the caller waits for the group and releases the stage.
template <class T, int BNB, int STAGES, int STAGE_BYTES>
__device__ __forceinline__ int wg_stage_mma(float* d, unsigned a0, unsigned b0, int it, bool keep, unsigned full0)
{
    const int s = it % STAGES;
    wg_bar_wait(full0 + 8 * s, (it / STAGES) & 1);
    // A was written by cp.async (generic proxy); wgmma reads through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    const unsigned sa = a0 + s * STAGE_BYTES, sb = b0 + s * STAGE_BYTES;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_ss<T, BNB>(d, wg_desc(sa + kk * 32), wg_desc(sb + kk * 32), keep || kk != 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    return s;
}

struct WgTile {
    int sb0, rows, e, n0;
};

// Work item w (the persistent schedule in grouped_gemm_wg.cu's header): run lo
// owns items [tp[lo] * ncol, tp[lo + 1] * ncol).
template <int BM>
__device__ __forceinline__ WgTile wg_tile(int w, int ncol, int bn, const int* runs, const int* tp, int nruns,
                                          const int* __restrict__ expert_ids, int block_size)
{
    const int rt = w / ncol;
    int lo = 0, hi = nruns - 1;
    while (lo < hi) {  // last run whose first tile is <= rt (runs of 0 tiles share it with the next)
        int mid = (lo + hi + 1) >> 1;
        if (tp[mid] <= rt) lo = mid;
        else hi = mid - 1;
    }
    const int nt = tp[lo + 1] - tp[lo], local = w - tp[lo] * ncol;
    const int ct = local / nt, r = local - ct * nt;
    WgTile t;
    t.sb0 = runs[lo] + (BM / 16) * r;
    t.rows = 16 * min(BM / 16, runs[lo + 1] - t.sb0);
    t.e = expert_ids[(runs[lo] * 16) / block_size];
    t.n0 = ct * bn;
    return t;
}

#endif  // WG_ENABLED

// The shape of an instance: gate_up (GATED: the BNB weight rows of a tile
// are BN = BNB / 2 gate and BN up rows of the same output columns) or down
// (BN = BNB output columns), tiles of BM rows of one expert x BNB weight
// rows, NCW consumer warpgroups (64 rows each) and a producer, STAGES
// stages of one K step (128 bytes of K a row: 64 bf16 or 128 e4m3),
// setmaxnreg PREG for the producer and CREG for the consumers.
template <bool GATED_, int BM_, int BNB_, int NCW_, int STAGES_, int PREG_, int CREG_>
struct WgShape {
    static constexpr bool GATED = GATED_;
    static constexpr int BM = BM_, BNB = BNB_, NCW = NCW_, STAGES = STAGES_, PREG = PREG_, CREG = CREG_;
    static constexpr int THREADS = 128 * (1 + NCW);
    static constexpr int BN = GATED ? BNB / 2 : BNB;  // output columns of a tile
    static constexpr int A_BYTES = BM * 128;
    static constexpr int B_BYTES = BNB * 128;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static_assert(BM % 64 == 0 && BM / 64 == NCW, "one 64-row group a consumer warpgroup");
    static_assert(BNB % 16 == 0 && BNB <= 256 && BN % 8 == 0, "wgmma N / tensor-map box");
    static_assert(THREADS / 32 <= 32, "warp counts");
    static_assert(STAGE_BYTES % 1024 == 0 && A_BYTES % 1024 == 0, "swizzled tiles stay 1024-aligned");
    static_assert(STAGES <= 8, "the schedule's item slots (wg_end_items)");
    static_assert(128 * PREG + 128 * NCW * CREG <= 65536, "setmaxnreg: more registers than the launch has");
    static_assert(PREG % 8 == 0 && CREG % 8 == 0, "setmaxnreg takes multiples of 8");
};

// The dynamic shared memory of a CTA of shape S whose stages carry
// SC_STRIDE floats of scales each (0: none) and whose producer's row table
// has ROW_BYTES an entry: ring + scale ring + run starts + tile prefix +
// warp counts + barriers + row table + 1024 for aligning the ring.
template <class S, int SC_STRIDE_, int ROW_BYTES>
struct WgLayout {
    static constexpr int SC_STRIDE = SC_STRIDE_;
    static constexpr int SMEM = S::STAGES * S::STAGE_BYTES + S::STAGES * SC_STRIDE * 4 + (2 * WG_MAX_RUNS + 32) * 4 +
                                2 * S::STAGES * 8 + S::BM * ROW_BYTES + 1024;
    static_assert(SMEM <= 232448, "shared memory");
};

// What a variant of wg_grouped_gemm declares: its shape S, its element type
// T (BK = 128 bytes of K a stage, CHUNK elements a 16-byte copy), its row
// table entry R and SC_STRIDE floats of scales a stage.
template <class S, class T, class R, int SC_STRIDE>
struct WgVariant {
    typedef S shape;
    typedef T elem_t;
    typedef R row_t;
    static constexpr int BK = 128 / sizeof(T), CHUNK = 16 / sizeof(T);
    typedef WgLayout<S, SC_STRIDE, sizeof(R)> L;
};

#ifdef WG_ENABLED

// Epilogue of one 64-row group (rows rg .. rg + 63 of tile t): the thread
// holds rows g and g + 8 of its warp's 16, columns 8j + 2q + {0,1}
// (acc[4j + 2h + i]); gate_up's up columns are j + BN / 8. gate_up writes
// bf16(swiglu(gate, up)) into c_bf16, down the f32 sums into c_f32, two
// columns at a time where N is even.
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
                if (GATED) v[i] = swiglu(v[i], acc[4 * (j + BN / 8) + 2 * h + i]);
            }
            if (GATED) {
                bf16_t* p = c_bf16 + (long long)s * N + n;
                if (n + 1 < N && (N & 1) == 0) {
                    *(unsigned*)p = (unsigned)f32_to_bf16(v[0]) | ((unsigned)f32_to_bf16(v[1]) << 16);
                } else {
                    if (n < N) p[0] = f32_to_bf16(v[0]);
                    if (n + 1 < N) p[1] = f32_to_bf16(v[1]);
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

// The CTA of both kernels (grouped_gemm_wg.cu's header describes it) for
// variant V, which supplies:
//   shape, L  its WgShape and WgLayout;
//   elem_t, BK, CHUNK  the element type of A and B, K elements a stage (128
//       bytes) and a 16-byte copy;
//   row_t, row_of(a, s, numel, a_div, K), has_row(r), row_src(a, r, k, K)
//       the producer's table of the tile's gathered rows (an entry per row:
//       which activation row, or none for padding) and where the 16-byte
//       chunk at k of a row starts;
//   tile_scales(t, tid, s0, s1, s_estride, nbn, nk), copy_scales(...)  the
//       scales a stage carries besides its tiles (w8a8; bf16: none);
//   consume(acc, part, a0, b0, sc, rg, n0, nk, it, full0, empty0)  a
//       consumer warpgroup's K loop over one tile into acc [BNB / 2], with
//       part [BNB / 2] as scratch.
// a [rows, K] (gathered through sorted_ids, token s / a_div) and its
// scales a_scales, the weights by tm0 / tm1 (gate and up, or down twice)
// with their scales s0 / s1 (unused by bf16), c_bf16 (gate_up) or c_f32
// (down) the output.
template <class V>
__device__ __forceinline__ void wg_grouped_gemm(const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
                                                const int* __restrict__ total_padded, const typename V::elem_t* __restrict__ a,
                                                const float* __restrict__ a_scales, int a_div, const WgTmap* tm0,
                                                const WgTmap* tm1, const float* __restrict__ s0, const float* __restrict__ s1,
                                                long long s_estride, bf16_t* __restrict__ c_bf16, float* __restrict__ c_f32,
                                                int numel, int N, int K, int block_size, int num_experts)
{
#ifdef WG_ENABLED
    typedef typename V::shape S;
    typedef typename V::L L;
    typedef typename V::row_t row_t;
    constexpr bool GATED = S::GATED;
    constexpr int BM = S::BM, STAGES = S::STAGES;
    constexpr int BN = S::BN;  // output columns per tile
    extern __shared__ unsigned char wg_smem_raw[];
    unsigned char* ring = wg_smem_raw + ((1024u - (wg_smem_addr(wg_smem_raw) & 1023u)) & 1023u);
    float* scr = (float*)(ring + STAGES * S::STAGE_BYTES);  // [STAGES][SC_STRIDE] scales, if any
    int* runs = (int*)(scr + STAGES * L::SC_STRIDE);        // [WG_MAX_RUNS]: run starts, then the end
    int* tp = runs + WG_MAX_RUNS;                           // [WG_MAX_RUNS]: first tile of each run
    int* wcnt = tp + WG_MAX_RUNS;                           // [32]
    unsigned long long* bars = (unsigned long long*)(wcnt + 32);  // 8-aligned: everything before is a multiple of 8 bytes
    row_t* rowt = (row_t*)(bars + 2 * STAGES);              // [BM] gathered row of each tile row, producer only
    const unsigned ring_s = wg_smem_addr(ring), scr_s = wg_smem_addr(scr);
    const unsigned full0 = wg_smem_addr(bars), empty0 = full0 + STAGES * 8;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            wg_bar_init(full0 + 8 * s, 129);              // every producer thread's copies, thread 0 once more with B's bytes
            wg_bar_init(empty0 + 8 * s, 128 * S::NCW);    // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    // Runs of equal expert ids over the 16-row sub-blocks, compacted in order.
    const int nsb = *total_padded / 16;
    int nruns = 0;
    for (int base = 0; base < nsb; base += S::THREADS) {
        int i = base + tid;
        bool f = false;
        if (i < nsb) f = i == 0 || expert_ids[(i * 16) / block_size] != expert_ids[((i - 1) * 16) / block_size];
        unsigned m = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wcnt[warp] = __popc(m);
        __syncthreads();
        int off = nruns, tot = 0;
#pragma unroll
        for (int w = 0; w < S::THREADS / 32; w++) {
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
    const int nk = (K + V::BK - 1) / V::BK;                   // K steps
    const int nbn = (N + 127) / 128;                          // 128-wide weight-scale blocks of N
#if WG_DYNAMIC
    // wcnt is free after the run table: [0, STAGES) the item of each stage, [8] the next item.
    int* sched_s = wcnt;
    unsigned* sched = GATED ? wg_sched_gate_up : wg_sched_down;
#endif

    if (role == 0) {
        // ---- producer warpgroup ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::PREG));
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
                int s = i < t.rows ? sorted_ids[t.sb0 * 16 + i] : -1;
                rowt[i] = V::row_of(a, s, numel, a_div, K);
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
            const int ngrp = (t.rows + 63) >> 6;  // 64-row groups of A that hold real rows
            const float* bsp = V::tile_scales(t, tid, s0, s1, s_estride, nbn, nk);
            for (int kt = 0; kt < nk; kt++, it++) {
                const int s = it % STAGES, round = it / STAGES;
                if (round > 0) wg_bar_wait(empty0 + 8 * s, (round - 1) & 1);
                const int k = kt * V::BK + c * V::CHUNK;
                const bool kin = k < K;  // K % CHUNK == 0: a chunk is all in or all out
                const unsigned sa = ring_s + s * S::STAGE_BYTES, fb = full0 + 8 * s;
                const unsigned ss = scr_s + s * L::SC_STRIDE * 4;  // the stage's scales, if any
                if (tid == 0) {
#if WG_DYNAMIC
                    if (kt == 0) sched_s[s] = w;  // the consumers read the item after this stage's full barrier
#endif
                    // B by the bulk tensor copy engine: rows past N and the K tail read as zeros.
                    wg_bar_arrive_tx(fb, S::B_BYTES);
                    if (GATED) {
                        wg_tma3p<WG_B_POLICY>(sa + S::A_BYTES, tm0, kt * V::BK, t.n0, t.e, fb, bpol);
                        wg_tma3p<WG_B_POLICY>(sa + S::A_BYTES + S::B_BYTES / 2, tm1, kt * V::BK, t.n0, t.e, fb, bpol);
                    } else {
                        wg_tma3p<WG_B_POLICY>(sa + S::A_BYTES, tm0, kt * V::BK, t.n0, t.e, fb, bpol);
                    }
                }
#pragma unroll
                for (int j = 0; j < BM / 16; j++) {
                    if ((j >> 2) >= ngrp) continue;  // all-padding 64-row group: not read
                    const int r = r0 + 16 * j;
                    const row_t row = rowt[r];
                    const bool ok = kin && V::has_row(row);
                    wg_cp16p<WG_A_POLICY>(sa + r * 128 + ((c ^ (r & 7)) << 4), ok ? V::row_src(a, row, k, K) : a, ok ? 16u : 0u, apol);
                }
                V::copy_scales(ss, tid, ngrp, rowt, a_scales, nk, kt, bsp);
                // A (and its scales) complete on the same barrier, as one of its 128 arrivals.
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
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::CREG));
        const int cw = role - 1;  // 64-row group cw of the tile
        float acc[S::BNB / 2], part[S::BNB / 2];  // part: the variant's scratch (w8a8's partial sums)
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
            V::consume(acc, part, ring_s + cw * 64 * 128, ring_s + S::A_BYTES, scr, cw * 64, t.n0, nk, it, full0, empty0);
            wg_epilogue<GATED, BN>(acc, cw * 64, t, sorted_ids, c_bf16, c_f32, numel, N);
        }
    }
#else
    __trap();
#endif
}
