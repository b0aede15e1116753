// moe_align_block_size: group the T*K (token, slot) pairs by expert so the
// grouped GEMM can run one expert per block of block_size rows.
//
// CPU twin: validate.AlignBlockSize. Deterministic: inside an expert the
// slots appear in ascending slot index, as in the twin, so every output array
// is equal to the twin's, not only as a multiset. Any expert count (the
// per-chunk histogram is in dynamic shared memory, 4*E bytes).
//
// Three launches on one stream:
//   1. moe_align_count  (grid = chunks of ALIGN_CHUNK slots): per-chunk
//      histograms into chunk_counts [chunks, E]; out-of-range ids set status.
//   2. moe_align_scan   (one CTA of ALIGN_SCAN_THREADS): per expert an
//      exclusive scan of its chunk counts (in place: chunk_counts becomes the
//      chunk's offset inside the expert), counts, the padded exclusive prefix
//      sum cumsum [E+1], total, the sentinel padding and expert_ids.
//   3. moe_align_fill   (grid = chunks): each slot's position = cumsum[e] +
//      its chunk's offset in e + its rank among same-expert slots of the chunk.
#include <stddef.h>
#include <stdint.h>

#define ALIGN_CHUNK 256
#define ALIGN_SCAN_THREADS 1024

extern "C" __global__ void __launch_bounds__(ALIGN_CHUNK)
moe_align_count(const int32_t* __restrict__ topk_ids, int numel, int E,
                int32_t* __restrict__ chunk_counts, int32_t* __restrict__ status) {
    extern __shared__ int32_t hist[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    int i = blockIdx.x * ALIGN_CHUNK + threadIdx.x;
    if (i < numel) {
        int id = topk_ids[i];
        if (id < 0 || id >= E) {
            atomicMin(status, i);
        } else {
            atomicAdd(&hist[id], 1);
        }
    }
    __syncthreads();
    int32_t* row = chunk_counts + (size_t)blockIdx.x * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) row[e] = hist[e];
}

extern "C" __global__ void __launch_bounds__(ALIGN_SCAN_THREADS)
moe_align_scan(int32_t* __restrict__ chunk_counts, int chunks, int E, int block_size, int numel,
               int32_t* __restrict__ counts, int32_t* __restrict__ cumsum, int32_t* __restrict__ total,
               int32_t* __restrict__ sorted_ids, int32_t* __restrict__ expert_ids) {
    __shared__ int32_t part[2][ALIGN_SCAN_THREADS];
    const int tid = threadIdx.x, nt = blockDim.x;

    // Per expert: scan its column of chunk counts in place.
    for (int e = tid; e < E; e += nt) {
        int run = 0;
        for (int c = 0; c < chunks; c++) {
            int32_t* p = chunk_counts + (size_t)c * E + e;
            int v = *p;
            *p = run;
            run += v;
        }
        counts[e] = run;
    }
    __syncthreads();

    // Padded exclusive prefix sum: thread tid owns experts [lo, hi).
    const int per = (E + nt - 1) / nt;
    const int lo = min(E, tid * per), hi = min(E, lo + per);
    int local = 0;
    for (int e = lo; e < hi; e++) local += (counts[e] + block_size - 1) / block_size * block_size;
    part[0][tid] = local;
    __syncthreads();
    int src = 0;
    for (int off = 1; off < nt; off <<= 1) {
        int v = part[src][tid];
        if (tid >= off) v += part[src][tid - off];
        part[src ^ 1][tid] = v;
        src ^= 1;
        __syncthreads();
    }
    int run = part[src][tid] - local;  // exclusive
    for (int e = lo; e < hi; e++) {
        cumsum[e] = run;
        run += (counts[e] + block_size - 1) / block_size * block_size;
    }
    if (tid == nt - 1) {
        cumsum[E] = part[src][tid];
        *total = part[src][tid];
    }
    __syncthreads();

    // Sentinel padding and the expert of each block.
    for (int e = tid; e < E; e += nt) {
        int start = cumsum[e], end = cumsum[e + 1];
        for (int p = start + counts[e]; p < end; p++) sorted_ids[p] = numel;
        for (int b = start / block_size; b < end / block_size; b++) expert_ids[b] = e;
    }
}

extern "C" __global__ void __launch_bounds__(ALIGN_CHUNK)
moe_align_fill(const int32_t* __restrict__ topk_ids, int numel, int E,
               const int32_t* __restrict__ chunk_offsets, const int32_t* __restrict__ cumsum,
               int32_t* __restrict__ sorted_ids) {
    __shared__ int32_t ids[ALIGN_CHUNK];
    const int i = blockIdx.x * ALIGN_CHUNK + threadIdx.x;
    const int id = i < numel ? topk_ids[i] : -1;
    ids[threadIdx.x] = id;
    __syncthreads();
    if (i >= numel || id < 0 || id >= E) return;
    int rank = 0;
    for (int j = 0; j < (int)threadIdx.x; j++) rank += ids[j] == id;
    sorted_ids[cumsum[id] + chunk_offsets[(size_t)blockIdx.x * E + id] + rank] = i;
}
