// Host and device helpers of the standalone wgmma harnesses (harness.cu:
// bf16, harness_fp8.cu: w8a8), included after the kernel sources (it uses
// their bf16_t and WgTmap): error checks, hash-filled buffers, the synthetic
// alignment (DeepSeek-style routing with shared-expert replicas), tensor
// maps, the poison check and CUDA-event timing.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#include <random>
#include <cmath>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKL() do { CK(cudaGetLastError()); } while (0)

static int g_sms;  // multiprocessors: the persistent kernels' grid

__device__ __forceinline__ uint32_t hsh(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (uint32_t)x;
}
__global__ void fill_u32(uint32_t* p, size_t n, uint32_t v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static float h_bf16_to_f32(bf16_t v) { return u2f(((uint32_t)v) << 16); }
// Distance of two bf16 values in ulps (sign-magnitude bits to a line).
static int bf16_ulps(bf16_t a, bf16_t b)
{
    int oa = (a & 0x8000) ? -(int)(a & 0x7fff) : (int)a, ob = (b & 0x8000) ? -(int)(b & 0x7fff) : (int)b;
    return abs(oa - ob);
}

static double median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// Median of 10 timed calls of fn (after 2 warm-ups), microseconds, by CUDA events.
template <class F>
static double time_us(F fn)
{
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> v;
    for (int r = 0; r < 12; r++) {
        CK(cudaEventRecord(e0)); fn(); CKL(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); if (r >= 2) v.push_back(ms * 1000.f);
    }
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    return median(v);
}

// The routing of a config: T tokens of topk slots over E experts, the last
// `shared` of them shared-expert replicas (each token's last slot, token t
// on replica t % shared), the rest uniform random without repeats; aligned
// to blocks of bs as moe_align_block_size does, expert local_skip not on
// this rank (its blocks' expert id -1).
struct Align { std::vector<int> sorted, eids; int total; std::vector<int> slot_expert; };
template <class Cfg>
static Align make_align(const Cfg& c, std::mt19937& rng)
{
    int routed = c.E - c.shared;  // shared replicas at the end
    int numel = c.T * c.topk;
    Align a; a.slot_expert.assign(numel, 0);
    std::vector<std::vector<int>> lists(c.E);
    std::vector<int> perm(routed);
    for (int t = 0; t < c.T; t++) {
        int kr = c.shared ? c.topk - 1 : c.topk;
        for (int i = 0; i < routed; i++) perm[i] = i;
        for (int k = 0; k < kr; k++) { int j = k + rng() % (routed - k); std::swap(perm[k], perm[j]); a.slot_expert[t * c.topk + k] = perm[k]; }
        if (c.shared) a.slot_expert[t * c.topk + c.topk - 1] = routed + t % c.shared;
    }
    for (int s = 0; s < numel; s++) lists[a.slot_expert[s]].push_back(s);
    int maxp = numel + c.E * (c.bs - 1); maxp = (maxp + c.bs - 1) / c.bs * c.bs;
    a.sorted.assign(maxp, numel); a.eids.assign(maxp / c.bs, -1);
    int pos = 0;
    for (int e = 0; e < c.E; e++) {
        if (lists[e].empty()) continue;
        int p0 = pos;
        for (int s : lists[e]) a.sorted[pos++] = s;
        pos = (pos + c.bs - 1) / c.bs * c.bs;
        for (int b = p0 / c.bs; b < pos / c.bs; b++) a.eids[b] = (e == c.local_skip) ? -1 : e;
    }
    a.total = pos;
    return a;
}

// An alignment on the device: sorted_ids, expert_ids, total_padded.
struct DevAlign {
    int *sorted, *eids, *total;
    explicit DevAlign(const Align& al)
    {
        CK(cudaMalloc(&sorted, al.sorted.size() * 4)); CK(cudaMalloc(&eids, al.eids.size() * 4)); CK(cudaMalloc(&total, 4));
        CK(cudaMemcpy(sorted, al.sorted.data(), al.sorted.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(eids, al.eids.data(), al.eids.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(total, &al.total, 4, cudaMemcpyHostToDevice));
    }
    ~DevAlign() { CK(cudaFree(sorted)); CK(cudaFree(eids)); CK(cudaFree(total)); }
};

// 3D view {K, N, E} of a weight matrix [E][N][K] of dt (elem bytes each;
// expert stride es elements), box {128 bytes of K, rows, 1}, 128-byte
// swizzle: what the Go side encodes (kernels/grouped_gemm.go, wgLaunch).
static WgTmap weight_tmap(const void* base, CUtensorMapDataType dt, int elem, int K, int N, int E, long long es, int rows)
{
    static_assert(sizeof(WgTmap) == sizeof(CUtensorMap), "tensor map size");
    CUtensorMap m;
    cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)N, (cuuint64_t)E};
    cuuint64_t strides[2] = {(cuuint64_t)K * elem, (cuuint64_t)es * elem};
    cuuint32_t box[3] = {(cuuint32_t)(128 / elem), (cuuint32_t)rows, 1}, es1[3] = {1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, dt, 3, (void*)base, dims, strides, box, es1, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r); exit(1); }
    WgTmap t; memcpy(&t, &m, sizeof t); return t;
}

// The poison check of outputs filled with all-ones bits before the kernels:
// values still poison in slots of local experts (unwritten: bad_i in inter
// [numel, I] bf16, bad_o in out [numel, H] f32) and values written in slots
// of the expert not on this rank (written_skip).
struct Unwritten { long long bad_i = 0, bad_o = 0, written_skip = 0; };
static Unwritten count_unwritten(const Align& al, int local_skip, int numel, int I, int H, const std::vector<bf16_t>& inter,
                                 const std::vector<float>& out)
{
    Unwritten u;
    for (int s = 0; s < numel; s++) {
        bool local = al.slot_expert[s] != local_skip;
        for (int n = 0; n < I; n++) { bool p = inter[(size_t)s * I + n] == 0xFFFF; if (local && p) u.bad_i++; if (!local && !p) u.written_skip++; }
        for (int n = 0; n < H; n++) { bool p = f2u(out[(size_t)s * H + n]) == 0xFFFFFFFFu; if (local && p) u.bad_o++; if (!local && !p) u.written_skip++; }
    }
    return u;
}
