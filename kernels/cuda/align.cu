// moe_align_block_size: group the T*K (token, slot) pairs by expert so the
// grouped GEMM can run one expert per block of block_size rows.
//
// CPU twin: moe.AlignBlockSize. Deterministic: inside an expert the
// slots appear in ascending slot index, as in the twin, so every output array
// is equal to the twin's, not only as a multiset. Any expert count (the
// per-chunk histogram is in dynamic shared memory, 4*E bytes).
//
// One launch where it fits and pays (moe_align_single, below: up to
// ALIGN_SINGLE_MAX_NUMEL slots and experts whose per-warp offsets fit 48 KiB
// of shared memory), otherwise three launches on one stream:
//   1. moe_align_count  (grid = chunks of ALIGN_CHUNK slots): per-chunk
//      histograms into chunk_counts [chunks, E] and each chunk's smallest
//      out-of-range slot into chunk_bad [chunks] (the scan reduces them
//      into status).
//   2. moe_align_scan   (one warp per expert, ceil(E/32) CTAs): per expert an
//      exclusive scan of its chunk counts (in place: chunk_counts becomes the
//      chunk's offset inside the expert) and counts; then the last CTA to
//      finish computes the padded exclusive prefix sum cumsum [E+1] and total.
//   3. moe_align_fill   (grid >= chunks): each slot's position = cumsum[e] +
//      its chunk's offset in e + its rank among same-expert slots of the
//      chunk; and, experts dealt over the grid, the sentinel padding and
//      expert_ids.
#include <stddef.h>
#include <stdint.h>

#define ALIGN_CHUNK 256
#define ALIGN_SCAN_THREADS 1024
#define ALIGN_SCAN_SEGS 8  // 32-chunk segments a warp loads before it stores any

extern "C" __global__ void __launch_bounds__(ALIGN_CHUNK)
moe_align_count(const int32_t* __restrict__ topk_ids, int numel, int E,
                int32_t* __restrict__ chunk_counts, int32_t* __restrict__ chunk_bad) {
    extern __shared__ int32_t hist[];
    __shared__ int32_t bad;
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    if (threadIdx.x == 0) bad = numel;
    __syncthreads();
    int i = blockIdx.x * ALIGN_CHUNK + threadIdx.x;
    if (i < numel) {
        int id = topk_ids[i];
        if (id < 0 || id >= E) {
            atomicMin(&bad, i);
        } else {
            atomicAdd(&hist[id], 1);
        }
    }
    __syncthreads();
    int32_t* row = chunk_counts + (size_t)blockIdx.x * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) row[e] = hist[e];
    // Every chunk writes its smallest bad slot (or numel), so the status
    // needs no memset before the launch: moe_align_scan reduces these.
    if (threadIdx.x == 0) chunk_bad[blockIdx.x] = bad;
}

// Inclusive scan of x over the warp's lanes.
__device__ __forceinline__ int align_warp_scan(int x, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// Grid: ceil(E/32) CTAs of ALIGN_SCAN_THREADS (32 warps), warp w of CTA b
// scanning expert 32*b + w; the CTA that finishes last (an atomic ticket in
// done, which it resets to 0 for the next launch) does the rest. Dynamic
// shared memory: cnt [E], used by that last CTA.
extern "C" __global__ void __launch_bounds__(ALIGN_SCAN_THREADS)
moe_align_scan(int32_t* __restrict__ chunk_counts, const int32_t* __restrict__ chunk_bad, int chunks, int E,
               int block_size, int numel, int32_t* __restrict__ counts, int32_t* __restrict__ cumsum,
               int32_t* __restrict__ total, int32_t* __restrict__ sorted_ids, int32_t* __restrict__ expert_ids,
               int32_t* __restrict__ status, int32_t* __restrict__ done) {
    extern __shared__ int32_t sm[];
    __shared__ int32_t wsum[32];
    __shared__ int32_t bad;
    __shared__ bool last;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int warp = tid >> 5, lane = tid & 31, nw = nt >> 5;

    // 1. Expert e's column of chunk counts, scanned in place by one warp (it
    // becomes each chunk's offset inside e): the loads of up to
    // ALIGN_SCAN_SEGS segments of 32 chunks are issued before any store and
    // the segments' shuffle scans are independent, so a column costs about
    // one load latency, and every expert's column is scanned at once across
    // the CTAs. (One CTA with a thread per expert walking its column took
    // 29 us under ncu at T=4096, K=9: most of the 3-launch path.)
    const int e = blockIdx.x * nw + warp;
    if (e < E) {
        int base = 0;
        for (int c0 = 0; c0 < chunks; c0 += 32 * ALIGN_SCAN_SEGS) {
            int v[ALIGN_SCAN_SEGS], x[ALIGN_SCAN_SEGS];
#pragma unroll
            for (int s = 0; s < ALIGN_SCAN_SEGS; s++) {
                const int c = c0 + s * 32 + lane;
                v[s] = c < chunks ? chunk_counts[(size_t)c * E + e] : 0;
            }
#pragma unroll
            for (int s = 0; s < ALIGN_SCAN_SEGS; s++) x[s] = v[s];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
                for (int s = 0; s < ALIGN_SCAN_SEGS; s++) {
                    const int y = __shfl_up_sync(0xffffffffu, x[s], o);
                    if (lane >= o) x[s] += y;
                }
            }
#pragma unroll
            for (int s = 0; s < ALIGN_SCAN_SEGS; s++) {
                const int c = c0 + s * 32 + lane;
                if (c < chunks) chunk_counts[(size_t)c * E + e] = base + x[s] - v[s];
                base += __shfl_sync(0xffffffffu, x[s], 31);
            }
        }
        if (lane == 0) counts[e] = base;
    }

    // 2. The last CTA to get here sees every count.
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(done, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    int32_t* cnt = sm;
    if (tid == 0) bad = numel;
    for (int i = tid; i < E; i += nt) cnt[i] = __ldcg(counts + i);
    __syncthreads();
    int mine = numel;
    for (int c = tid; c < chunks; c += nt) mine = min(mine, chunk_bad[c]);
    if (mine < numel) atomicMin(&bad, mine);

    // Padded exclusive prefix sum over experts: thread tid owns experts
    // [lo, hi); the threads' sums are scanned with shuffles inside each
    // warp, then the warps' totals by warp 0.
    const int per = (E + nt - 1) / nt;
    const int lo = min(E, tid * per), hi = min(E, lo + per);
    int local = 0;
    for (int i = lo; i < hi; i++) local += (cnt[i] + block_size - 1) / block_size * block_size;
    const int incl = align_warp_scan(local, lane);
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int w = lane < nw ? wsum[lane] : 0;
        wsum[lane] = align_warp_scan(w, lane) - w;  // exclusive
    }
    __syncthreads();
    int run = wsum[warp] + incl - local;  // exclusive
    for (int i = lo; i < hi; i++) {
        cumsum[i] = run;
        run += (cnt[i] + block_size - 1) / block_size * block_size;
    }
    if (tid == nt - 1) {
        cumsum[E] = run;
        *total = run;
        *done = 0;  // ready for the next launch
    }
    __syncthreads();
    if (tid == 0) *status = bad;
    // The sentinel padding and expert_ids are written by moe_align_fill,
    // spread over its grid rather than left to this one CTA.
}

extern "C" __global__ void __launch_bounds__(ALIGN_CHUNK)
moe_align_fill(const int32_t* __restrict__ topk_ids, int numel, int E,
               const int32_t* __restrict__ chunk_offsets, const int32_t* __restrict__ cumsum,
               int32_t* __restrict__ sorted_ids, const int32_t* __restrict__ counts,
               int32_t* __restrict__ expert_ids, int block_size) {
    __shared__ int32_t ids[ALIGN_CHUNK];
    const int i = blockIdx.x * ALIGN_CHUNK + threadIdx.x;
    const int id = i < numel ? topk_ids[i] : -1;
    ids[threadIdx.x] = id;
    __syncthreads();
    if (i < numel && id >= 0 && id < E) {
        int rank = 0;
        for (int j = 0; j < (int)threadIdx.x; j++) rank += ids[j] == id;
        sorted_ids[cumsum[id] + chunk_offsets[(size_t)blockIdx.x * E + id] + rank] = i;
    }
    // Sentinel padding after each expert's slots and the expert of each
    // block, the experts dealt over the grid (positions past an expert's
    // slots, so never where a slot goes).
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        const int start = cumsum[e], end = cumsum[e + 1];
        for (int p = start + counts[e] + threadIdx.x; p < end; p += blockDim.x) sorted_ids[p] = numel;
        for (int b = start / block_size + threadIdx.x; b < end / block_size; b += blockDim.x) expert_ids[b] = e;
    }
}

// ---------------------------------------------------------------------------
// moe_align_single: the whole of moe_align_block_size in one CTA of nw warps
// and one launch (the three-kernel path above costs a memset and three
// launch latencies, which is most of its time below a few thousand slots).
// Warp w owns the contiguous slot range [w*per, (w+1)*per), so ordering the
// slots by (warp, step, lane) is ordering them by index: each warp counts
// its range per expert, an exclusive scan over warps gives each warp its
// offset inside every expert, and the fill walks each range 32 slots at a
// time, ranking equal ids inside a step with __match_any_sync. The arrays
// are therefore exactly the twin's, order inside each expert included.
//
// Dynamic shared memory (int32): woff [owners][E], cnt [E], cums [E+1],
// wsum [32], bad [1]; the launcher sizes owners so that this is <= 48 KiB.
// status receives the smallest slot with an out-of-range id, or numel:
// written unconditionally, so it needs no memset before the launch.
#define ALIGN_SINGLE_MAX_NUMEL (1 << 16)
// Slots each lane loads before using any of them, so a warp has that many
// global loads in flight instead of one latency per 32 slots.
#define ALIGN_UNROLL 8

__device__ __forceinline__ int align_padded(int c, int block_size) {
    return (c + block_size - 1) / block_size * block_size;
}

// align_batch gives idv[u] = the id of slot base + 32u + lane, -1 past hi:
// the lane's share of one batch of a warp's range, all loads issued before
// any is used. The range's first batch (base == lo) comes from first, which
// phase 1 loaded and kept (called with lo = -1 to fill first itself).
__device__ __forceinline__ void align_batch(const int32_t* __restrict__ topk_ids, int base, int lo, int hi,
                                            int lane, const int (&first)[ALIGN_UNROLL], int (&idv)[ALIGN_UNROLL]) {
#pragma unroll
    for (int u = 0; u < ALIGN_UNROLL; u++) {
        const int i = base + u * 32 + lane;
        idv[u] = base == lo ? first[u] : (i < hi ? topk_ids[i] : -1);
    }
}

extern "C" __global__ void __launch_bounds__(1024)
moe_align_single(const int32_t* __restrict__ topk_ids, int numel, int E, int block_size, int owners,
                 int32_t* __restrict__ counts, int32_t* __restrict__ cumsum, int32_t* __restrict__ total,
                 int32_t* __restrict__ sorted_ids, int32_t* __restrict__ expert_ids,
                 int32_t* __restrict__ status) {
    // The first `owners` warps own the slots (phases 1 and 5); every warp
    // works on the experts (phases 2 to 4). nw below is the owner count.
    extern __shared__ int32_t sm[];
    const int tid = threadIdx.x, nt = blockDim.x, nwarps = nt >> 5, nw = owners, warp = tid >> 5, lane = tid & 31;
    int32_t* woff = sm;
    int32_t* cnt = woff + nw * E;
    int32_t* cums = cnt + E;
    int32_t* wsum = cums + E + 1;
    int32_t* bad = wsum + 32;

    for (int i = tid; i < nw * E; i += nt) woff[i] = 0;
    if (tid == 0) *bad = numel;
    __syncthreads();

    // 1. Each owner warp's histogram of its range. The first batch of ids
    // stays in registers for phase 5 (with owners = ceil(numel / 256), the
    // launcher's choice below the auto limit, it is the whole range).
    const int per = (numel + nw - 1) / nw;
    const int lo = warp < nw ? min(numel, warp * per) : numel, hi = warp < nw ? min(numel, lo + per) : numel;
    int first[ALIGN_UNROLL];
    align_batch(topk_ids, lo, -1, hi, lane, first, first);
    for (int base = lo; base < hi; base += 32 * ALIGN_UNROLL) {
        int idv[ALIGN_UNROLL];
        align_batch(topk_ids, base, lo, hi, lane, first, idv);
#pragma unroll
        for (int u = 0; u < ALIGN_UNROLL; u++) {
            const int i = base + u * 32 + lane;
            if (i >= hi) continue;
            if (idv[u] < 0 || idv[u] >= E) {
                atomicMin(bad, i);
            } else {
                atomicAdd(&woff[warp * E + idv[u]], 1);
            }
        }
    }
    __syncthreads();

    // 2. Per expert: exclusive scan over the warps, in place; the count.
    for (int e = tid; e < E; e += nt) {
        int run = 0;
#pragma unroll 8
        for (int w = 0; w < nw; w++) {
            const int v = woff[w * E + e];
            woff[w * E + e] = run;
            run += v;
        }
        cnt[e] = run;
        counts[e] = run;
    }
    __syncthreads();

    // 3. Padded exclusive prefix sum over experts: thread tid owns experts
    // [elo, ehi); a warp scan of the per-thread sums, then of the warp sums.
    const int eper = (E + nt - 1) / nt;
    const int elo = min(E, tid * eper), ehi = min(E, elo + eper);
    int local = 0;
    for (int e = elo; e < ehi; e++) local += align_padded(cnt[e], block_size);
    int incl = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int ws = lane < nwarps ? wsum[lane] : 0;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, ws, off);
            if (lane >= off) ws += v;
        }
        if (lane < nwarps) wsum[lane] = ws;  // inclusive over warps
    }
    __syncthreads();
    int run = (warp > 0 ? wsum[warp - 1] : 0) + incl - local;
    for (int e = elo; e < ehi; e++) {
        cums[e] = run;
        cumsum[e] = run;
        run += align_padded(cnt[e], block_size);
    }
    if (tid == nt - 1) {
        cums[E] = run;
        cumsum[E] = run;
        *total = run;
    }
    __syncthreads();

    // 4. Sentinel padding and the expert of each block: a warp per expert,
    // its lanes writing consecutive entries (coalesced stores).
    for (int e = warp; e < E; e += nwarps) {
        const int start = cums[e], end = cums[e + 1];
        for (int p = start + cnt[e] + lane; p < end; p += 32) sorted_ids[p] = numel;
        for (int b = start / block_size + lane; b < end / block_size; b += 32) expert_ids[b] = e;
    }

    // 5. The fill: each owner warp walks its range in ascending steps of 32.
    const unsigned below = (1u << lane) - 1u;
    for (int base = lo; base < hi; base += 32 * ALIGN_UNROLL) {
        int idv[ALIGN_UNROLL];
        align_batch(topk_ids, base, lo, hi, lane, first, idv);
#pragma unroll
        for (int u = 0; u < ALIGN_UNROLL; u++) {
            const int i = base + u * 32 + lane;
            const int id = idv[u] < E ? idv[u] : -1;  // out of range: reported through status, not placed
            const unsigned peers = __match_any_sync(0xffffffffu, id);
            const int off = id >= 0 ? woff[warp * E + id] : 0;
            __syncwarp();
            if (id >= 0) {
                sorted_ids[cums[id] + off + __popc(peers & below)] = i;
                if (lane == 31 - __clz(peers)) woff[warp * E + id] = off + __popc(peers);
            }
            __syncwarp();
        }
    }
    __syncthreads();
    if (tid == 0) *status = *bad;
}
