// Tile-shape variants (scripts/wg/tile256_tma.cu) against the current wgmma kernel
// (kernels/cuda/grouped_gemm_wg.cu) and the tall kernels, in one binary: bitwise comparison
// with tall on the harness shapes, then CUDA-event timings (median of 10 after 2 warm-ups) of
// current / variant / tall / current again at DeepSeek-V3 shapes, T = 1024 and 4096.
// (Since the 192x192 adoption the current kernel is TV_VARIANT 2's code: variant 2 then times it twice.)
// On a GPU machine:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -DTV_VARIANT=1 -o h1 scripts/wg/harness_tile.cu -lcuda && ./h1
// TV_VARIANT 1: 256 rows x 128 weight rows, 2 consumer warpgroups (two m64n128k16 each)
// TV_VARIANT 2: 192 rows x 192 weight rows, 3 consumer warpgroups (one m64n192k16 each)
// Argument 0: the small shapes only.
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
#include "../../kernels/cuda/grouped_gemm.cu"
#include "../../kernels/cuda/grouped_gemm_wg.cu"
#include "tile256_tma.cu"

#ifndef TV_VARIANT
#define TV_VARIANT 1
#endif
#if TV_VARIANT == 1
#define TV_BM 256
#define TV_BNB 128
#define TV_NCW 2
#define TV_ARGS 256, 128, 2, 4, 72, 216
#define TV_POOL (128 * 72 + 256 * 216)
#define TV_NAME "256x128"
#else
#define TV_BM 192
#define TV_BNB 192
#define TV_NCW 3
#define TV_ARGS 192, 192, 3, 4, 40, 152
#define TV_POOL (128 * 40 + 384 * 152)
#define TV_NAME "192x192"
#endif
typedef TvCfg<TV_BM, TV_BNB, TV_NCW, 4> TvC;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKL() do { CK(cudaGetLastError()); } while (0)

__device__ __forceinline__ uint32_t hsh(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (uint32_t)x;
}
__global__ void fill_bf16(bf16_t* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = (hsh(i * 0x9E3779B97F4A7C15ull + seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
        p[i] = f32_to_bf16(u * scale);
    }
}
__global__ void fill_u32(uint32_t* p, size_t n, uint32_t v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
// Bitwise differences of two buffers of 32-bit words; [1] counts words that are poison in a.
__global__ void diff_u32(const uint32_t* a, const uint32_t* b, size_t n, unsigned long long* cnt) {
    unsigned long long d = 0, p = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        d += a[i] != b[i];
        p += a[i] == 0xFFFFFFFFu;
    }
    atomicAdd(&cnt[0], d); atomicAdd(&cnt[1], p);
}

struct Cfg { const char* name; int T, H, I, E, topk, shared, bs, local_skip; bool fused; bool timeit; };

struct Align { std::vector<int> sorted, eids; int total; std::vector<int> slot_expert; };
static Align make_align(const Cfg& c, std::mt19937& rng) {
    int routed = c.E - c.shared; // shared replicas at the end
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

static double median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

static int g_sms;
static bool g_var_ok = true;

// 3D view {K, N, E} of a weight matrix [E][N][K] (expert stride es elements), box {64, rows, 1}, 128-byte swizzle.
static WgTmap make_tmap(const bf16_t* base, int K, int N, int E, long long es, int rows) {
    static_assert(sizeof(WgTmap) == sizeof(CUtensorMap), "tensor map size");
    CUtensorMap m;
    cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)N, (cuuint64_t)E};
    cuuint64_t strides[2] = {(cuuint64_t)K * 2, (cuuint64_t)es * 2};
    cuuint32_t box[3] = {(cuuint32_t)WG_BK, (cuuint32_t)rows, 1}, es1[3] = {1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void*)base, dims, strides, box, es1,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r); exit(1); }
    WgTmap t; memcpy(&t, &m, sizeof t); return t;
}

static unsigned long long* g_cnt;
static void diff(const char* what, const void* a, const void* b, size_t words) {
    CK(cudaMemset(g_cnt, 0, 16));
    diff_u32<<<1024, 256>>>((const uint32_t*)a, (const uint32_t*)b, words, g_cnt); CKL();
    unsigned long long h[2]; CK(cudaMemcpy(h, g_cnt, 16, cudaMemcpyDeviceToHost));
    printf("  %-26s %s: %llu of %zu words differ (%llu poison words)\n", what, h[0] == 0 ? "BITEXACT" : "DIFFERS", h[0], words, h[1]);
}

static void run_cfg(const Cfg& c, bf16_t* wgu, bf16_t* wdn, std::mt19937& rng) {
    int numel = c.T * c.topk;
    Align al = make_align(c, rng);
    printf("== %s: T=%d H=%d I=%d E=%d topk=%d bs=%d total_padded=%d numel=%d\n", c.name, c.T, c.H, c.I, c.E, c.topk, c.bs, al.total, numel);
    int *d_sorted, *d_eids, *d_total;
    CK(cudaMalloc(&d_sorted, al.sorted.size() * 4)); CK(cudaMalloc(&d_eids, al.eids.size() * 4)); CK(cudaMalloc(&d_total, 4));
    CK(cudaMemcpy(d_sorted, al.sorted.data(), al.sorted.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_eids, al.eids.data(), al.eids.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_total, &al.total, 4, cudaMemcpyHostToDevice));
    size_t nx = (size_t)c.T * c.H, ni = (size_t)numel * c.I, no = (size_t)numel * c.H;
    if (ni & 1) { fprintf(stderr, "odd inter size\n"); exit(1); }
    bf16_t *x, *i_tt, *i_cu, *i_tv; float *o_tt, *o_cu, *o_tv;
    CK(cudaMalloc(&x, nx * 2)); CK(cudaMalloc(&i_tt, ni * 2)); CK(cudaMalloc(&i_cu, ni * 2)); CK(cudaMalloc(&i_tv, ni * 2));
    CK(cudaMalloc(&o_tt, no * 4)); CK(cudaMalloc(&o_cu, no * 4)); CK(cudaMalloc(&o_tv, no * 4));
    fill_bf16<<<1024, 256>>>(x, nx, rng(), 1.0f); CKL();
    // weights: fused [E,2I,H] (gate rows first) or separate halves of the same buffer
    long long gu_es = c.fused ? 2LL * c.I * c.H : (long long)c.I * c.H;
    const bf16_t* wg_g = wgu; const bf16_t* wg_u = c.fused ? wgu + (size_t)c.I * c.H : wgu + (size_t)c.E * c.I * c.H;
    long long dn_es = (long long)c.H * c.I;
    int sb = (int)(al.sorted.size() / 16);
    dim3 g_tall_gu(c.I / 64 + (c.I % 64 != 0), sb), g_tall_dn((c.H + 127) / 128, sb);
    auto poison = [&]() {
        for (bf16_t* p : {i_tt, i_cu, i_tv}) fill_u32<<<1024, 256>>>((uint32_t*)p, ni / 2, 0xFFFFFFFFu);
        for (float* p : {o_tt, o_cu, o_tv}) fill_u32<<<1024, 256>>>((uint32_t*)p, no, 0xFFFFFFFFu);
        CKL();
    };
    WgTmap tm_g = make_tmap(wg_g, c.H, c.I, c.E, gu_es, WG_BNB / 2), tm_u = make_tmap(wg_u, c.H, c.I, c.E, gu_es, WG_BNB / 2);
    WgTmap tm_d = make_tmap(wdn, c.I, c.H, c.E, dn_es, WG_BNB);
    WgTmap tv_g = make_tmap(wg_g, c.H, c.I, c.E, gu_es, TV_BNB / 2), tv_u = make_tmap(wg_u, c.H, c.I, c.E, gu_es, TV_BNB / 2);
    WgTmap tv_d = make_tmap(wdn, c.I, c.H, c.E, dn_es, TV_BNB);
    auto cu_gu = [&](bf16_t* out) { moe_gate_up_wg_bf16_bf16<<<g_sms, WG_THREADS, WG_SMEM_BYTES>>>(d_sorted, d_eids, d_total, x, wg_g, wg_u, gu_es, nullptr, nullptr, 0, out, numel, c.topk, c.I, c.H, c.bs, c.E, tm_g, tm_u); };
    auto tv_gu = [&](bf16_t* out) { tv_gate_up<TV_ARGS><<<g_sms, TvC::THREADS, TvC::SMEM>>>(d_sorted, d_eids, d_total, x, wg_g, wg_u, gu_es, nullptr, nullptr, 0, out, numel, c.topk, c.I, c.H, c.bs, c.E, tv_g, tv_u); };
    auto tt_gu = [&](bf16_t* out) { moe_gate_up_tall_bf16_bf16<<<g_tall_gu, TT_THREADS>>>(d_sorted, d_eids, d_total, x, wg_g, wg_u, gu_es, nullptr, nullptr, 0, out, numel, c.topk, c.I, c.H, c.bs, c.E); };
    // every down stage reads tall's intermediate
    auto cu_dn = [&](float* out) { moe_down_wg_bf16_bf16<<<g_sms, WG_THREADS, WG_SMEM_BYTES>>>(d_sorted, d_eids, d_total, i_tt, wdn, dn_es, nullptr, 0, out, numel, c.H, c.I, c.bs, c.E, tm_d); };
    auto tv_dn = [&](float* out) { tv_down<TV_ARGS><<<g_sms, TvC::THREADS, TvC::SMEM>>>(d_sorted, d_eids, d_total, i_tt, wdn, dn_es, nullptr, 0, out, numel, c.H, c.I, c.bs, c.E, tv_d); };
    auto tt_dn = [&](float* out) { moe_down_tall_bf16_bf16<<<g_tall_dn, TT_THREADS>>>(d_sorted, d_eids, d_total, i_tt, wdn, dn_es, nullptr, 0, out, numel, c.H, c.I, c.bs, c.E); };

    poison(); CK(cudaDeviceSynchronize());
    tt_gu(i_tt); CKL(); CK(cudaDeviceSynchronize());
    cu_gu(i_cu); CKL(); CK(cudaDeviceSynchronize());
    tt_dn(o_tt); CKL(); CK(cudaDeviceSynchronize());
    cu_dn(o_cu); CKL(); CK(cudaDeviceSynchronize());
    diff("inter current vs tall", i_cu, i_tt, ni / 2);
    diff("out   current vs tall", o_cu, o_tt, no);
    if (g_var_ok) {
        tv_gu(i_tv); CKL(); CK(cudaDeviceSynchronize()); printf("  variant gate_up ran\n"); fflush(stdout);
        tv_dn(o_tv); CKL(); CK(cudaDeviceSynchronize()); printf("  variant down ran\n"); fflush(stdout);
        diff("inter " TV_NAME " vs tall", i_tv, i_tt, ni / 2);
        diff("out   " TV_NAME " vs tall", o_tv, o_tt, no);
    }
    fflush(stdout);
    if (c.timeit) {
        cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
        auto timeit = [&](auto fn) {
            std::vector<float> v;
            for (int r = 0; r < 12; r++) {
                CK(cudaEventRecord(e0)); fn(); CKL(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); if (r >= 2) v.push_back(ms * 1000.f);
            }
            return median(v);
        };
        double g_cu = timeit([&] { cu_gu(i_cu); }), g_tv = g_var_ok ? timeit([&] { tv_gu(i_tv); }) : 0, g_tt = timeit([&] { tt_gu(i_tt); }), g_cu2 = timeit([&] { cu_gu(i_cu); });
        double d_cu = timeit([&] { cu_dn(o_cu); }), d_tv = g_var_ok ? timeit([&] { tv_dn(o_tv); }) : 0, d_tt = timeit([&] { tt_dn(o_tt); }), d_cu2 = timeit([&] { cu_dn(o_cu); });
        printf("  TIMING T=%d gate_up: current %.0f %s %.0f tall %.0f current-again %.0f | down: current %.0f %s %.0f tall %.0f current-again %.0f | total: current %.0f %s %.0f tall %.0f (us)\n",
               c.T, g_cu, TV_NAME, g_tv, g_tt, g_cu2, d_cu, TV_NAME, d_tv, d_tt, d_cu2, g_cu + d_cu, TV_NAME, g_tv + d_tv, g_tt + d_tt);
        CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    }
    for (void* p : {(void*)x, (void*)i_tt, (void*)i_cu, (void*)i_tv, (void*)o_tt, (void*)o_cu, (void*)o_tv, (void*)d_sorted, (void*)d_eids, (void*)d_total}) CK(cudaFree(p));
    fflush(stdout);
}

template <typename F>
static void attrs(const char* name, F* f, int smem, int threads, int pool) {
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, f));
    int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, f, threads, smem));
    printf("%-18s smem %d B, %d threads, occupancy %d CTA/SM, regs %d, local %zu B (setmaxnreg pool needs %d, launch gives %d)\n",
           name, smem, threads, occ, fa.numRegs, fa.localSizeBytes, pool, fa.numRegs * threads);
    if (occ < 1) printf("  cannot launch\n");
}

int main(int argc, char** argv) {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    g_sms = p.multiProcessorCount;
    printf("device %s cc %d.%d SMs %d smem/block optin %zu L2 %d\n", p.name, p.major, p.minor, g_sms, p.sharedMemPerBlockOptin, p.l2CacheSize);
    CK(cudaMalloc(&g_cnt, 16));
    attrs("current gate_up", moe_gate_up_wg_bf16_bf16, WG_SMEM_BYTES, WG_THREADS, 128 * WG_PRODUCER_REGS + (WG_THREADS - 128) * WG_CONSUMER_REGS);
    attrs("current down", moe_down_wg_bf16_bf16, WG_SMEM_BYTES, WG_THREADS, 128 * WG_PRODUCER_REGS + (WG_THREADS - 128) * WG_CONSUMER_REGS);
    attrs(TV_NAME " gate_up", tv_gate_up<TV_ARGS>, TvC::SMEM, TvC::THREADS, TV_POOL);
    attrs(TV_NAME " down", tv_down<TV_ARGS>, TvC::SMEM, TvC::THREADS, TV_POOL);
    {   // setmaxnreg.inc waits for registers the launch did not give: do not run such a variant (it would hang)
        cudaFuncAttributes a1, a2; CK(cudaFuncGetAttributes(&a1, tv_gate_up<TV_ARGS>)); CK(cudaFuncGetAttributes(&a2, tv_down<TV_ARGS>));
        int occ1, occ2;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ1, tv_gate_up<TV_ARGS>, TvC::THREADS, TvC::SMEM));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ2, tv_down<TV_ARGS>, TvC::THREADS, TvC::SMEM));
        if (a1.numRegs * TvC::THREADS < TV_POOL || a2.numRegs * TvC::THREADS < TV_POOL || occ1 < 1 || occ2 < 1) {
            printf("VARIANT " TV_NAME " NOT RUN: register pool or occupancy\n");
            g_var_ok = false;
        }
    }
    std::mt19937 rng(12345);
    bool big = argc < 2 || atoi(argv[1]) != 0;
    // small, odd shapes: K % 64 != 0, N tails, block size 32, one expert not on this rank, separate gate/up
    {
        Cfg c{"small", 300, 520, 200, 6, 3, 0, 32, 2, false, false};
        size_t ngu = 2ull * c.E * c.I * c.H, ndn = (size_t)c.E * c.H * c.I;
        bf16_t *wgu, *wdn; CK(cudaMalloc(&wgu, ngu * 2)); CK(cudaMalloc(&wdn, ndn * 2));
        fill_bf16<<<1024, 256>>>(wgu, ngu, 7, 0.08f); fill_bf16<<<1024, 256>>>(wdn, ndn, 9, 0.08f); CKL();
        run_cfg(c, wgu, wdn, rng);
        Cfg c2{"small-fused-shared", 1000, 1024, 384, 12, 5, 4, 16, -1, true, false};
        CK(cudaFree(wgu)); CK(cudaFree(wdn));
        ngu = 2ull * c2.E * c2.I * c2.H; ndn = (size_t)c2.E * c2.H * c2.I;
        CK(cudaMalloc(&wgu, ngu * 2)); CK(cudaMalloc(&wdn, ndn * 2));
        fill_bf16<<<1024, 256>>>(wgu, ngu, 17, 0.06f); fill_bf16<<<1024, 256>>>(wdn, ndn, 19, 0.06f); CKL();
        run_cfg(c2, wgu, wdn, rng);
        // 2000 tokens on 4 experts: runs of ~500-1000 rows, several row tiles of every shape
        Cfg c3{"small-long-runs", 2000, 640, 320, 4, 2, 0, 16, -1, true, false};
        CK(cudaFree(wgu)); CK(cudaFree(wdn));
        ngu = 2ull * c3.E * c3.I * c3.H; ndn = (size_t)c3.E * c3.H * c3.I;
        CK(cudaMalloc(&wgu, ngu * 2)); CK(cudaMalloc(&wdn, ndn * 2));
        fill_bf16<<<1024, 256>>>(wgu, ngu, 27, 0.06f); fill_bf16<<<1024, 256>>>(wdn, ndn, 29, 0.06f); CKL();
        run_cfg(c3, wgu, wdn, rng);
        CK(cudaFree(wgu)); CK(cudaFree(wdn));
    }
    if (!big) return 0;
    {
        int E = 264, H = 7168, I = 2048;
        size_t ngu = 2ull * E * I * H, ndn = (size_t)E * H * I;
        bf16_t *wgu, *wdn; CK(cudaMalloc(&wgu, ngu * 2)); CK(cudaMalloc(&wdn, ndn * 2));
        fill_bf16<<<4096, 256>>>(wgu, ngu, 11, 0.05f); fill_bf16<<<4096, 256>>>(wdn, ndn, 13, 0.05f); CKL();
        CK(cudaDeviceSynchronize());
        for (int T : {1024, 4096}) {
            Cfg c{"deepseek", T, H, I, E, 9, 8, 16, -1, true, true};
            run_cfg(c, wgu, wdn, rng);
        }
        CK(cudaFree(wgu)); CK(cudaFree(wdn));
    }
    printf("done\n");
    return 0;
}
