// Device helpers shared by the Hopper grouped GEMMs: grouped_gemm_wg.cu (bf16
// x bf16) and grouped_gemm_wg_fp8.cu (e4m3 x e4m3, w8a8). Each .cu is its own
// fatbin and includes this file; scripts/build-kernels.sh and the kernels
// package's TestBuildMatchesSources hash every kernels/cuda/*.cuh with each
// source, so a change here marks every fatbin stale.
#pragma once

typedef unsigned short bf16_t;

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

// Round to nearest even, NaN kept quiet (validate.F32ToBF16; as grouped_gemm.cu).
__device__ __forceinline__ bf16_t wg_f32_to_bf16(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

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
// bytes or none instead of 256 (8.3 ms; kernels/GEMM_NOTES.md, issue 13
// pass 8).
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

struct WgTile {
    int sb0, rows, e, n0;
};

// Work item w (the persistent schedule in grouped_gemm_wg.cu's header): run lo owns items [tp[lo] * ncol, tp[lo + 1] * ncol).
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
