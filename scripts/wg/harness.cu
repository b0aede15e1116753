// Standalone check and timing of the wgmma grouped GEMM (grouped_gemm_wg.cu) against the tall
// kernels, on a GPU machine: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o h scripts/wg/harness.cu -lcuda && ./h [0 = small shapes only]
#include "../../kernels/cuda/grouped_gemm.cu"
#include "../../kernels/cuda/grouped_gemm_wg.cu"
#include "harness_common.cuh"

__global__ void fill_bf16(bf16_t* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = (hsh(i * 0x9E3779B97F4A7C15ull + seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
        p[i] = f32_to_bf16(u * scale);
    }
}
__device__ __forceinline__ double bfd(bf16_t v) { return (double)bf16_to_f32(v); }

// stats: [0] sum d^2, [1] sum ref^2, [2] max |d| (as ull bits of double), counts in u: [0] ulp>1, [1] ulp>2, [2] poison mismatch, [3] nan
struct Stats { double s[2]; unsigned long long maxd; unsigned long long cnt[4]; };
__device__ void stat_add(Stats* st, double d, double r) {
    atomicAdd(&st->s[0], d * d); atomicAdd(&st->s[1], r * r);
    atomicMax(&st->maxd, (unsigned long long)__double_as_longlong(fabs(d)));
}
__global__ void cmp_bf16(const bf16_t* a, const bf16_t* b, size_t n, Stats* st) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        bf16_t x = a[i], y = b[i];
        bool px = x == 0xFFFF, py = y == 0xFFFF;
        if (px || py) { if (px != py) atomicAdd(&st->cnt[2], 1ull); continue; }
        double dx = bfd(x), dy = bfd(y);
        if (dx != dx || dy != dy) { atomicAdd(&st->cnt[3], 1ull); continue; }
        int ox = (x & 0x8000) ? -(int)(x & 0x7fff) : (int)x, oy = (y & 0x8000) ? -(int)(y & 0x7fff) : (int)y;
        int u = abs(ox - oy);
        if (u > 1) atomicAdd(&st->cnt[0], 1ull);
        if (u > 2) atomicAdd(&st->cnt[1], 1ull);
        stat_add(st, dx - dy, dy);
    }
}
__global__ void cmp_f32(const float* a, const float* b, size_t n, Stats* st) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned ux = __float_as_uint(a[i]), uy = __float_as_uint(b[i]);
        bool px = ux == 0xFFFFFFFFu, py = uy == 0xFFFFFFFFu;
        if (px || py) { if (px != py) atomicAdd(&st->cnt[2], 1ull); continue; }
        double dx = a[i], dy = b[i];
        if (dx != dx || dy != dy) { atomicAdd(&st->cnt[3], 1ull); continue; }
        stat_add(st, dx - dy, dy);
    }
}
// Reference for sampled slots: f64 sums. gate_up: ref[i*N+n] = silu(g)*u; down: ref = inter_in . Wd.
__global__ void ref_gate_up(const int* slots, const int* experts, int ns, const bf16_t* x, int topk,
                            const bf16_t* wg, const bf16_t* wu, long long es, int N, int K, double* ref) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= ns * N) return;
    int i = idx / N, n = idx % N, s = slots[i], e = experts[i];
    const bf16_t* xr = x + (long long)(s / topk) * K;
    const bf16_t* g = wg + e * es + (long long)n * K; const bf16_t* u = wu + e * es + (long long)n * K;
    double sg = 0, su = 0;
    for (int k = 0; k < K; k++) { double xv = bfd(xr[k]); sg += xv * bfd(g[k]); su += xv * bfd(u[k]); }
    ref[idx] = sg / (1.0 + exp(-sg)) * su;
}
__global__ void ref_down(const int* slots, const int* experts, int ns, const bf16_t* inter,
                         const bf16_t* wd, long long es, int N, int K, double* ref) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= ns * N) return;
    int i = idx / N, n = idx % N, s = slots[i], e = experts[i];
    const bf16_t* ar = inter + (long long)s * K; const bf16_t* w = wd + e * es + (long long)n * K;
    double acc = 0;
    for (int k = 0; k < K; k++) acc += bfd(ar[k]) * bfd(w[k]);
    ref[idx] = acc;
}

struct Cfg { const char* name; int T, H, I, E, topk, shared, bs, local_skip; bool fused; bool timeit; };

// 3D view {K, N, E} of a bf16 weight matrix [E][N][K] (expert stride es elements), box {64, rows, 1}.
static WgTmap make_tmap(const bf16_t* base, int K, int N, int E, long long es, int rows)
{
    return weight_tmap(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, K, N, E, es, rows);
}

static void print_stats(const char* what, Stats* dst) {
    Stats h; CK(cudaMemcpy(&h, dst, sizeof h, cudaMemcpyDeviceToHost));
    double md; memcpy(&md, &h.maxd, 8);
    printf("  %-28s relL2 %.3e maxabs %.3e ulp>1 %llu ulp>2 %llu poison-mismatch %llu nan %llu\n", what,
           sqrt(h.s[0] / (h.s[1] > 0 ? h.s[1] : 1)), md, h.cnt[0], h.cnt[1], h.cnt[2], h.cnt[3]);
}

static void run_cfg(const Cfg& c, bf16_t* wgu, bf16_t* wdn, std::mt19937& rng) {
    int numel = c.T * c.topk;
    Align al = make_align(c, rng);
    printf("== %s: T=%d H=%d I=%d E=%d topk=%d bs=%d total_padded=%d numel=%d\n", c.name, c.T, c.H, c.I, c.E, c.topk, c.bs, al.total, numel);
    DevAlign da(al);
    int *d_sorted = da.sorted, *d_eids = da.eids, *d_total = da.total;
    bf16_t *x, *i_wg, *i_tt; float *o_wg, *o_tt;
    size_t nx = (size_t)c.T * c.H, ni = (size_t)numel * c.I, no = (size_t)numel * c.H;
    CK(cudaMalloc(&x, nx * 2)); CK(cudaMalloc(&i_wg, ni * 2)); CK(cudaMalloc(&i_tt, ni * 2));
    CK(cudaMalloc(&o_wg, no * 4)); CK(cudaMalloc(&o_tt, no * 4));
    fill_bf16<<<1024, 256>>>(x, nx, rng(), 1.0f); CKL();
    // weights: fused [E,2I,H] (gate rows first) or separate halves of the same buffer
    long long gu_es = c.fused ? 2LL * c.I * c.H : (long long)c.I * c.H;
    const bf16_t* wg_g = wgu; const bf16_t* wg_u = c.fused ? wgu + (size_t)c.I * c.H : wgu + (size_t)c.E * c.I * c.H;
    long long dn_es = (long long)c.H * c.I;
    int sb = (int)(al.sorted.size() / 16);
    dim3 g_tall_gu(c.I / 64 + (c.I % 64 != 0), sb), g_tall_dn((c.H + 127) / 128, sb);
    auto poison = [&]() {
        fill_u32<<<1024, 256>>>((uint32_t*)i_wg, ni / 2, 0xFFFFFFFFu); fill_u32<<<1024, 256>>>((uint32_t*)i_tt, ni / 2, 0xFFFFFFFFu);
        fill_u32<<<1024, 256>>>((uint32_t*)o_wg, no, 0xFFFFFFFFu); fill_u32<<<1024, 256>>>((uint32_t*)o_tt, no, 0xFFFFFFFFu); CKL();
    };
    WgTmap tm_g = make_tmap(wg_g, c.H, c.I, c.E, gu_es, WG_BNB / 2), tm_u = make_tmap(wg_u, c.H, c.I, c.E, gu_es, WG_BNB / 2);
    WgTmap tm_d = make_tmap(wdn, c.I, c.H, c.E, (long long)c.H * c.I, WG_BNB);
    auto wg_gu = [&](bf16_t* out) { moe_gate_up_wg_bf16_bf16<<<g_sms, WG_THREADS, WG_SMEM_BYTES>>>(d_sorted, d_eids, d_total, x, wg_g, wg_u, gu_es, nullptr, nullptr, 0, out, numel, c.topk, c.I, c.H, c.bs, c.E, tm_g, tm_u); };
    auto tt_gu = [&](bf16_t* out) { moe_gate_up_tall_bf16_bf16<<<g_tall_gu, TT_THREADS>>>(d_sorted, d_eids, d_total, x, wg_g, wg_u, gu_es, nullptr, nullptr, 0, out, numel, c.topk, c.I, c.H, c.bs, c.E); };
    auto wg_dn = [&](const bf16_t* in, float* out) { moe_down_wg_bf16_bf16<<<g_sms, WG_THREADS, WG_SMEM_BYTES>>>(d_sorted, d_eids, d_total, in, wdn, dn_es, nullptr, 0, out, numel, c.H, c.I, c.bs, c.E, tm_d); };
    auto tt_dn = [&](const bf16_t* in, float* out) { moe_down_tall_bf16_bf16<<<g_tall_dn, TT_THREADS>>>(d_sorted, d_eids, d_total, in, wdn, dn_es, nullptr, 0, out, numel, c.H, c.I, c.bs, c.E); };

    poison(); CK(cudaDeviceSynchronize());
    wg_gu(i_wg); CKL(); CK(cudaDeviceSynchronize()); printf("  wg gate_up ran\n"); fflush(stdout);
    tt_gu(i_tt); CKL(); CK(cudaDeviceSynchronize());
    wg_dn(i_wg, o_wg); CKL(); CK(cudaDeviceSynchronize()); printf("  wg down ran\n"); fflush(stdout);
    tt_dn(i_wg, o_tt); CKL(); CK(cudaDeviceSynchronize());
    Stats* st; CK(cudaMalloc(&st, sizeof(Stats) * 6)); CK(cudaMemset(st, 0, sizeof(Stats) * 6));
    cmp_bf16<<<2048, 256>>>(i_wg, i_tt, ni, st + 0); CKL();
    cmp_f32<<<2048, 256>>>(o_wg, o_tt, no, st + 1); CKL();
    CK(cudaDeviceSynchronize());
    print_stats("inter wg vs tall (bf16)", st + 0);
    print_stats("out   wg vs tall (f32)", st + 1);
    // unwritten check: count poison among slots of local experts
    {
        std::vector<bf16_t> hi(ni); CK(cudaMemcpy(hi.data(), i_wg, ni * 2, cudaMemcpyDeviceToHost));
        std::vector<float> ho(no); CK(cudaMemcpy(ho.data(), o_wg, no * 4, cudaMemcpyDeviceToHost));
        Unwritten uw = count_unwritten(al, c.local_skip, numel, c.I, c.H, hi, ho);
        printf("  wg unwritten: inter %lld out %lld; written for skipped expert: %lld\n", uw.bad_i, uw.bad_o, uw.written_skip);
        // sampled reference
        int ns = 0; std::vector<int> hs, he;
        for (int s = 0; s < numel && ns < 48; s += std::max(1, numel / 48)) { if (al.slot_expert[s] == c.local_skip) continue; hs.push_back(s); he.push_back(al.slot_expert[s]); ns++; }
        int *ds, *de; double *rg, *rd;
        CK(cudaMalloc(&ds, ns * 4)); CK(cudaMalloc(&de, ns * 4)); CK(cudaMalloc(&rg, (size_t)ns * c.I * 8)); CK(cudaMalloc(&rd, (size_t)ns * c.H * 8));
        CK(cudaMemcpy(ds, hs.data(), ns * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(de, he.data(), ns * 4, cudaMemcpyHostToDevice));
        ref_gate_up<<<(ns * c.I + 255) / 256, 256>>>(ds, de, ns, x, c.topk, wg_g, wg_u, gu_es, c.I, c.H, rg); CKL();
        ref_down<<<(ns * c.H + 255) / 256, 256>>>(ds, de, ns, i_wg, wdn, dn_es, c.H, c.I, rd); CKL();
        std::vector<double> hrg((size_t)ns * c.I), hrd((size_t)ns * c.H);
        std::vector<bf16_t> hit(ni); CK(cudaMemcpy(hit.data(), i_tt, ni * 2, cudaMemcpyDeviceToHost));
        std::vector<float> hot(no); CK(cudaMemcpy(hot.data(), o_tt, no * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hrg.data(), rg, hrg.size() * 8, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hrd.data(), rd, hrd.size() * 8, cudaMemcpyDeviceToHost));
        double e2[4] = {0, 0, 0, 0}, r2[2] = {0, 0}, mx[4] = {0, 0, 0, 0};
        for (int i = 0; i < ns; i++) {
            int s = hs[i];
            for (int n = 0; n < c.I; n++) {
                double r = hrg[(size_t)i * c.I + n], a = h_bf16_to_f32(hi[(size_t)s * c.I + n]), b = h_bf16_to_f32(hit[(size_t)s * c.I + n]);
                e2[0] += (a - r) * (a - r); e2[1] += (b - r) * (b - r); r2[0] += r * r;
                mx[0] = std::max(mx[0], fabs(a - r)); mx[1] = std::max(mx[1], fabs(b - r));
                if (i == 0 && n < 4) printf("    sample s=%d n=%d ref %.6f wg %.6f tall %.6f\n", s, n, r, a, b);
            }
            for (int n = 0; n < c.H; n++) {
                double r = hrd[(size_t)i * c.H + n], a = ho[(size_t)s * c.H + n], b = hot[(size_t)s * c.H + n];
                e2[2] += (a - r) * (a - r); e2[3] += (b - r) * (b - r); r2[1] += r * r;
                mx[2] = std::max(mx[2], fabs(a - r)); mx[3] = std::max(mx[3], fabs(b - r));
                if (i == 0 && n < 4) printf("    sample s=%d n=%d ref %.6f wg %.6f tall %.6f\n", s, n, r, a, b);
            }
        }
        printf("  ref (%d slots, f64): gate_up wg relL2 %.3e max %.3e | tall relL2 %.3e max %.3e\n", ns, sqrt(e2[0] / r2[0]), mx[0], sqrt(e2[1] / r2[0]), mx[1]);
        printf("  ref (%d slots, f64): down    wg relL2 %.3e max %.3e | tall relL2 %.3e max %.3e\n", ns, sqrt(e2[2] / r2[1]), mx[2], sqrt(e2[3] / r2[1]), mx[3]);
        CK(cudaFree(ds)); CK(cudaFree(de)); CK(cudaFree(rg)); CK(cudaFree(rd));
    }
    if (c.timeit) {
        double t_wg_gu = time_us([&] { wg_gu(i_wg); }), t_tt_gu = time_us([&] { tt_gu(i_tt); });
        double t_wg_dn = time_us([&] { wg_dn(i_wg, o_wg); }), t_tt_dn = time_us([&] { tt_dn(i_wg, o_tt); });
        double f_gu = 2.0 * numel * 2.0 * c.I * c.H, f_dn = 2.0 * numel * (double)c.H * c.I;
        printf("  TIMING T=%d  gate_up: wg %.0f us (%.0f TFLOP/s) tall %.0f us (%.0f) x%.2f | down: wg %.0f us (%.0f) tall %.0f us (%.0f) x%.2f | total wg %.0f tall %.0f x%.2f\n",
               c.T, t_wg_gu, f_gu / t_wg_gu * 1e-6, t_tt_gu, f_gu / t_tt_gu * 1e-6, t_tt_gu / t_wg_gu,
               t_wg_dn, f_dn / t_wg_dn * 1e-6, t_tt_dn, f_dn / t_tt_dn * 1e-6, t_tt_dn / t_wg_dn,
               t_wg_gu + t_wg_dn, t_tt_gu + t_tt_dn, (t_tt_gu + t_tt_dn) / (t_wg_gu + t_wg_dn));
    }
    CK(cudaFree(st)); CK(cudaFree(x)); CK(cudaFree(i_wg)); CK(cudaFree(i_tt)); CK(cudaFree(o_wg)); CK(cudaFree(o_tt));
    fflush(stdout);
}

int main(int argc, char** argv) {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    g_sms = p.multiProcessorCount;
    printf("device %s cc %d.%d SMs %d smem/block optin %zu L2 %d\n", p.name, p.major, p.minor, g_sms, p.sharedMemPerBlockOptin, p.l2CacheSize);
    CK(cudaFuncSetAttribute(moe_gate_up_wg_bf16_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_BYTES));
    CK(cudaFuncSetAttribute(moe_down_wg_bf16_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_BYTES));
    int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_gate_up_wg_bf16_bf16, WG_THREADS, WG_SMEM_BYTES));
    cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, moe_gate_up_wg_bf16_bf16));
    printf("wg smem %d B, occupancy %d CTA/SM, regs %d, local %zu\n", WG_SMEM_BYTES, occ, fa.numRegs, fa.localSizeBytes);
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
