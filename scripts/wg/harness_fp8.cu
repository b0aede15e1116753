// Standalone check and timing of the w8a8 path, on a GPU machine, from the repository root:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --ptxas-options=-v -o hf scripts/wg/harness_fp8.cu -lcuda 2>&1 | grep -E "error|warning|registers|spill|Compiling" ; ./hf 0   (0: small shapes only; no argument: DeepSeek sizes and timing too; T > 1: DeepSeek at T tokens, default instance only)
// It passes on an H100 (kernels/GEMM_NOTES.md, "w8a8 on the H100").
//
// moe_act_quant_e4m3 (kernels/cuda/act_quant.cu) and moe_gate_up_wg_fp8_fp8 /
// moe_down_wg_fp8_fp8 (kernels/cuda/grouped_gemm_wg_fp8.cu), against
// references that mirror the CPU twin's w8a8 numerics (moe.GroupedGEMM with
// GEMMOptions{W8A8: true}):
//  1. encoder: the kernels' e4m3 encoder (hardware cvt on sm_89+) against its
//     software copy on all 2^32 f32 bit patterns (device), and the software
//     copy against a host copy of numfmt.F32ToE4M3 on the edge cases and
//     2^21 patterns (every f32 whose low 12 mantissa bits are 0). Bit-exact.
//  2. act_quant: codes and scale bits against a host QuantizeActGroups on
//     rows with NaN, inf, zeros, bf16 extremes and subnormals, whole and
//     short groups, cols % 4 == 0 and != 0. Bit-exact.
//  3. gate_up: every (sampled) slot's inter against a reference from the
//     dequantised operands (code * scale rounded to f32, as the twin; f64
//     sums, then the twin's silu/product/bf16 rounding). The only expected
//     differences are the summation order, the f32 scale products and the
//     fp8 tensor cores' accumulation inside a 128-K block, so bf16 results
//     differ by at most one ulp and rarely (counted: PASS if > 1 ulp is
//     < 1e-4 of the values and none > 2 ulp... see check_inter). Also the
//     codes of act_quant(GPU inter) against act_quant(reference inter):
//     flips are counted (each comes from a one-ulp bf16 difference).
//  4. down: out against a reference on the GPU's quantised intermediate
//     (so it tests the down kernel alone): relative L2 <= 1e-4 (a first
//     guess: f32 would give ~1e-6; the fp8 tensor-core accumulation within a
//     128-K block keeps ~14 bits+ per DeepSeek-V3; calibrate it here).
//  5. poison: every local slot written, slots of an expert not on this rank
//     not written.
//  6. timing (DeepSeek-V3 layer, T = 1024 and 4096): act_quant(x), gate_up,
//     act_quant(inter), down, each median of 10, and TFLOP/s; for the
//     default instance (BM 128 x BNB 192, 2 consumer warpgroups) and the
//     variant BM 192 x BNB 128 (3 consumer warpgroups) built here from the
//     same template.
#include "../../kernels/cuda/act_quant.cu"
#include "../../kernels/cuda/grouped_gemm_wg_fp8.cu"
#include "harness_common.cuh"

static int g_fail = 0;
#define EXPECT(cond, ...) do { if (!(cond)) { g_fail++; printf("  FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

// ---- the variant instance (BM 192, BNB 128, 3 consumer warpgroups, 152 registers) ----
#define HV_BM 192
#define HV_BNB 128
#define HV_NCW 3
#define HV_STAGES 5
#define HV_THREADS (128 * (1 + HV_NCW))
typedef WgW8A8<WgShape<true, HV_BM, HV_BNB, HV_NCW, HV_STAGES, 40, 152>> HvGateUp;
typedef WgW8A8<WgShape<false, HV_BM, HV_BNB, HV_NCW, HV_STAGES, 40, 152>> HvDown;
#define HV_SMEM (HvGateUp::L::SMEM)
extern "C" __global__ void __launch_bounds__(HV_THREADS, 1) hv_gate_up(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const e4m3_t* xq, const float* xs,
    const e4m3_t* w_gate, const e4m3_t* w_up, long long w_estride, const float* s_gate, const float* s_up,
    long long s_estride, bf16_t* inter, int numel, int topk, int I, int H, int block_size, int num_experts,
    const __grid_constant__ WgTmap tm_gate, const __grid_constant__ WgTmap tm_up)
{
    wg_grouped_gemm<HvGateUp>(sorted_ids, expert_ids, total_padded, xq, xs, topk, &tm_gate, &tm_up, s_gate, s_up, s_estride, inter,
                              nullptr, numel, I, H, block_size, num_experts);
}
extern "C" __global__ void __launch_bounds__(HV_THREADS, 1) hv_down(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const e4m3_t* iq, const float* is,
    const e4m3_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out, int numel, int H,
    int I, int block_size, int num_experts, const __grid_constant__ WgTmap tm_down)
{
    wg_grouped_gemm<HvDown>(sorted_ids, expert_ids, total_padded, iq, is, 1, &tm_down, &tm_down, s_down, s_down, s_estride, nullptr,
                            out, numel, H, I, block_size, num_experts);
}

// ---- shared host/device helpers ----
// torch.float8_e4m3fn decode (numfmt.E4M3ToF32): bias 7, subnormals m * 2^-9, S.1111.111 NaN.
__host__ __device__ inline float hv_e4m3(unsigned b)
{
    unsigned s = (b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
    uint32_t u;
    float f;
    if (e == 0xFu && m == 7u) { u = s | 0x7fc00000u; memcpy(&f, &u, 4); return f; }
    if (e == 0u) { f = (float)m * 0.001953125f; return s ? -f : f; }
    u = s | ((e + 120u) << 23) | (m << 20);
    memcpy(&f, &u, 4);
    return f;
}
// numfmt.F32ToBF16: RNE, NaN kept quiet.
__host__ __device__ inline bf16_t hv_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
// numfmt.F32ToE4M3, transcribed from internal/numfmt/fp8.go (host reference).
static uint8_t h_f32_to_e4m3(float f)
{
    uint32_t b = f2u(f);
    uint8_t sign = (uint8_t)(b >> 24) & 0x80;
    uint32_t abs = b & 0x7fffffffu;
    if (abs > 0x7f800000u) return 0x7f;
    if (u2f(abs) >= 448.0f) return sign | 0x7e;
    int exp = (int)(abs >> 23) - 127;
    if (exp >= -6) {
        abs += 0x7ffffu + ((abs >> 20) & 1u);
        exp = (int)(abs >> 23) - 127;
        return sign | (uint8_t)((exp + 7) << 3) | (uint8_t)((abs >> 20) & 7u);
    }
    if (exp < -11) return sign;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u, shift = (uint32_t)(-exp - 9 + 23);
    uint32_t half = 1u << (shift - 1), q = mant >> shift, rem = mant & (half * 2 - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint8_t)q;
}
// moe.QuantizeActGroups on one row of bf16 values.
static void h_quant_row(const bf16_t* x, int cols, uint8_t* q, float* s)
{
    int ng = (cols + 127) / 128;
    for (int g = 0; g < ng; g++) {
        int lo = g * 128, hi = std::min(cols, lo + 128);
        float amax = 1e-10f;
        bool nan = false;
        for (int c = lo; c < hi; c++) {
            float a = fabsf(h_bf16_to_f32(x[c]));
            if (a != a) nan = true;
            else if (a > amax) amax = a;
        }
        float sc = amax / 448.0f;
        if (nan) sc = u2f(0x7fc00000u);
        s[g] = sc;
        for (int c = lo; c < hi; c++) q[c] = h_f32_to_e4m3(h_bf16_to_f32(x[c]) / sc);
    }
}

__device__ __forceinline__ float unif(size_t i, uint64_t seed) { return (hsh(i * 0x9E3779B97F4A7C15ull + seed) >> 8) * (1.0f / 16777216.0f); }
// x rows: uniform(-1, 1) times a per-row factor (some rows x64, some /64) so per-token scales differ.
__global__ void fill_x(bf16_t* p, int rows, int cols, uint64_t seed)
{
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / cols);
        float f = r % 17 == 3 ? 64.f : (r % 13 == 5 ? 1.f / 64 : 1.f);
        p[i] = hv_f32_to_bf16((2.f * unif(i, seed) - 1.f) * f);
    }
}
__global__ void fill_codes(uint8_t* p, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint8_t c = (uint8_t)(hsh(i * 0x9E3779B97F4A7C15ull + seed) & 0xffu);
        if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
        p[i] = c;
    }
}
// Codes of the small integers -3 .. 3 (0x00, +-1 0x38, +-2 0x40, +-3 0x44): every k32 partial of these is an
// integer of magnitude <= 9 * 128 < 2^11, exact in any accumulator of >= 11 bits, so the "exact" configs see only
// the f32 scale products and the f32 promotion order, and any plumbing error (wrong row, scale, block) stands out.
__global__ void fill_codes_int(uint8_t* p, size_t n, uint64_t seed)
{
    const uint8_t tab[7] = {0xc4, 0xc0, 0xb8, 0x00, 0x38, 0x40, 0x44};
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = tab[hsh(i * 0x9E3779B97F4A7C15ull + seed) % 7u];
}
__global__ void fill_scales(float* p, size_t n, uint64_t seed, float base)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = base * (0.5f + unif(i, seed));
}

// ---- 1. encoder ----
__global__ void enc_all(unsigned long long* mism, unsigned* first)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < (1ull << 32);
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float f = __uint_as_float((unsigned)i);
        unsigned a = aq_f32_to_e4m3(f), b = aq_f32_to_e4m3_sw(f);
        if (a != b) {
            unsigned long long k = atomicAdd(mism, 1ull);
            if (k < 8) first[k] = (unsigned)i;
        }
    }
}
static void test_encoder()
{
    printf("== encoder\n");
    unsigned long long* dm; unsigned* df;
    CK(cudaMalloc(&dm, 8)); CK(cudaMalloc(&df, 32)); CK(cudaMemset(dm, 0, 8));
    enc_all<<<4096, 256>>>(dm, df); CKL(); CK(cudaDeviceSynchronize());
    unsigned long long m; unsigned first[8];
    CK(cudaMemcpy(&m, dm, 8, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(first, df, 32, cudaMemcpyDeviceToHost));
    printf("  all 2^32 f32: hardware-path vs software encoder mismatches %llu\n", m);
    for (unsigned i = 0; i < std::min<unsigned long long>(m, 8); i++)
        printf("    0x%08x (%g): host F32ToE4M3 %02x\n", first[i], u2f(first[i]), h_f32_to_e4m3(u2f(first[i])));
    EXPECT(m == 0, "encoder: %llu of 2^32 differ between cvt.rn.satfinite and the software copy", m);
    // software (and hw) vs the host copy of numfmt.F32ToE4M3
    std::vector<uint32_t> in = {0x00000000u, 0x80000000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu,
                                0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000001u, 0x007fffffu};
    float edges[] = {448.f, -448.f, 464.f, -464.f, 465.f, 447.f, 449.f, 480.f, 240.f, 232.f, 248.f, 1.f, 1.0625f, 1.1875f,
                     0.001953125f /*2^-9*/, 0.0009765625f /*2^-10, tie -> 0*/, 0.0029296875f /*1.5 * 2^-9 -> 2*/,
                     0.0048828125f /*2.5 * 2^-9 -> 2*/, 0.015625f /*2^-6*/, 0.0146484375f /*7.5 * 2^-9 -> 8 = 0x08*/,
                     0.00048828125f /*2^-11*/, 0.000244140625f /*2^-12*/};
    for (float e : edges) {
        in.push_back(f2u(e)); in.push_back(f2u(e) + 1); in.push_back(f2u(e) - 1);
        in.push_back(f2u(-e)); in.push_back(f2u(-e) + 1); in.push_back(f2u(-e) - 1);
    }
    for (uint32_t u = 0; u < (1u << 20); u++) { in.push_back(u << 12); in.push_back((u << 12) | 0x80000000u); }
    int n = (int)in.size();
    unsigned* din; uint8_t *dhw, *dsw;
    CK(cudaMalloc(&din, n * 4)); CK(cudaMalloc(&dhw, n)); CK(cudaMalloc(&dsw, n));
    CK(cudaMemcpy(din, in.data(), n * 4, cudaMemcpyHostToDevice));
    act_quant_encode_check<<<(n + 255) / 256, 256>>>(din, n, dhw, dsw); CKL();
    std::vector<uint8_t> hw(n), sw(n);
    CK(cudaMemcpy(hw.data(), dhw, n, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(sw.data(), dsw, n, cudaMemcpyDeviceToHost));
    int bad_sw = 0, bad_hw = 0;
    for (int i = 0; i < n; i++) {
        uint8_t r = h_f32_to_e4m3(u2f(in[i]));
        if (sw[i] != r && bad_sw++ < 8) printf("    sw 0x%08x (%g): %02x want %02x\n", in[i], u2f(in[i]), sw[i], r);
        if (hw[i] != r && bad_hw++ < 8) printf("    hw 0x%08x (%g): %02x want %02x\n", in[i], u2f(in[i]), hw[i], r);
    }
    printf("  %d patterns vs host F32ToE4M3: software mismatches %d, kernel encoder mismatches %d\n", n, bad_sw, bad_hw);
    EXPECT(bad_sw == 0 && bad_hw == 0, "encoder vs host F32ToE4M3");
    CK(cudaFree(dm)); CK(cudaFree(df)); CK(cudaFree(din)); CK(cudaFree(dhw)); CK(cudaFree(dsw));
}

// ---- 2. act_quant ----
static void test_act_quant(int rows, int cols, std::mt19937& rng)
{
    printf("== act_quant rows %d cols %d\n", rows, cols);
    std::vector<bf16_t> x((size_t)rows * cols);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int r = 0; r < rows; r++) {
        float f = std::pow(2.f, (float)((r * 7) % 60) - 30.f);
        for (int c = 0; c < cols; c++) x[(size_t)r * cols + c] = hv_f32_to_bf16(u(rng) * f);
    }
    auto row = [&](int r) { return &x[(size_t)r * cols]; };
    if (rows > 8) {
        std::fill(row(0), row(0) + cols, (bf16_t)0);                 // all zero: scale 1e-10/448, codes 0
        row(1)[5] = 0x7fc0; row(1)[cols - 1] = 0xffc1;               // NaN in group 0 and the last group
        row(2)[3] = 0x7f80; row(2)[130 % cols] = 0xff80;             // +-inf
        for (int c = 0; c < cols; c++) row(3)[c] = (c & 1) ? 0x7f7f : 0xff7f;  // bf16 +-max
        for (int c = 0; c < cols; c++) row(4)[c] = (bf16_t)(c % 128);          // bf16 subnormals
        for (int c = 0; c < cols; c++) row(5)[c] = (c % 3) ? 0x8000 : 0x0000;  // +-0
        row(6)[7] = hv_f32_to_bf16(1e30f);                              // one huge value: the rest underflow to 0
    }
    int ng = (cols + 127) / 128;
    bf16_t* dx; uint8_t* dq; float* ds;
    CK(cudaMalloc(&dx, x.size() * 2)); CK(cudaMalloc(&dq, x.size())); CK(cudaMalloc(&ds, (size_t)rows * ng * 4));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    long long warps = (long long)rows * ng;
    moe_act_quant_e4m3<<<(unsigned)((warps + 7) / 8), AQ_THREADS>>>(dx, rows, cols, dq, ds); CKL();
    std::vector<uint8_t> q(x.size()), rq(cols);
    std::vector<float> s((size_t)rows * ng), rs(ng);
    CK(cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost)); CK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    long long badq = 0, bads = 0;
    for (int r = 0; r < rows; r++) {
        h_quant_row(row(r), cols, rq.data(), rs.data());
        for (int c = 0; c < cols; c++)
            if (q[(size_t)r * cols + c] != rq[c] && badq++ < 8) printf("    q[%d,%d] (x %04x) %02x want %02x\n", r, c, row(r)[c], q[(size_t)r * cols + c], rq[c]);
        for (int g = 0; g < ng; g++) {
            uint32_t a = f2u(s[(size_t)r * ng + g]), b = f2u(rs[g]);
            if (a != b && bads++ < 8) printf("    scale[%d,%d] %08x want %08x\n", r, g, a, b);
        }
    }
    printf("  code mismatches %lld, scale mismatches %lld\n", badq, bads);
    EXPECT(badq == 0 && bads == 0, "act_quant %dx%d not bit-exact", rows, cols);
    CK(cudaFree(dx)); CK(cudaFree(dq)); CK(cudaFree(ds));
}

// ---- 3-6. the grouped GEMMs ----
struct Cfg { const char* name; int T, H, I, E, topk, shared, bs, local_skip; bool fused; bool timeit; bool exact; };

// 3D UINT8 view {K, N, E} of an e4m3 weight matrix (expert stride es bytes), box {128, rows, 1}.
static WgTmap make_tmap(const uint8_t* base, int K, int N, int E, long long es, int rows)
{
    return weight_tmap(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, K, N, E, es, rows);
}

// Weights: w[e*es + n*K + k] codes, scales sc[e*ses + (n/128)*ceil(K/128) + k/128]; dequantised as the twin: f32(code * scale).
struct WMat { const uint8_t* w; const float* s; long long es, ses; };
// Activation row r of q [rows, K] with scales [rows, ceil(K/128)], dequantised as RoundTripActGroups: f32(code * scale).
__device__ __forceinline__ double adeq(const uint8_t* q, const float* s, long long r, int K, int k)
{
    int nkb = (K + 127) / 128;
    return (double)(hv_e4m3(q[r * K + k]) * s[r * nkb + k / 128]);
}
__device__ __forceinline__ double bdeq(const WMat& m, int e, int n, int K, int k)
{
    int nkb = (K + 127) / 128;
    return (double)(hv_e4m3(m.w[e * m.es + (long long)n * K + k]) * m.s[e * m.ses + (long long)(n / 128) * nkb + k / 128]);
}
// gate_up reference for sampled slots: G, U as f64 sums of dequantised products, then the twin's epilogue.
// refv: silu(G) U in f64 (no rounding); refb: the twin's bf16 (G, U rounded to f32 as its Sgemm result,
// silu in f64 rounded to f32, product in f32, bf16 nearest-even).
__global__ void ref_gate_up(const int* slots, const int* experts, int ns, const uint8_t* xq, const float* xs, int topk,
                            WMat g, WMat u, int N, int K, double* refv, bf16_t* refb)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= ns * N) return;
    int i = idx / N, n = idx % N, s = slots[i], e = experts[i];
    double sg = 0, su = 0;
    for (int k = 0; k < K; k++) {
        double a = adeq(xq, xs, s / topk, K, k);
        sg += a * bdeq(g, e, n, K, k);
        su += a * bdeq(u, e, n, K, k);
    }
    refv[idx] = sg / (1.0 + exp(-sg)) * su;
    float gf = (float)sg, uf = (float)su;
    float sl = (float)((double)gf / (1.0 + exp(-(double)gf)));
    refb[idx] = hv_f32_to_bf16(__fmul_rn(sl, uf));
}
__global__ void ref_down(const int* slots, const int* experts, int ns, const uint8_t* iq, const float* is, WMat d, int N, int K,
                         double* ref, double* refabs)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= ns * N) return;
    int i = idx / N, n = idx % N, s = slots[i], e = experts[i];
    double acc = 0, aa = 0;
    for (int k = 0; k < K; k++) {
        double t = adeq(iq, is, s, K, k) * bdeq(d, e, n, K, k);
        acc += t;
        aa += fabs(t);
    }
    ref[idx] = acc;
    refabs[idx] = aa;  // sum |a_k b_k|: the scale of any accumulation error
}


// id 0: the default instance (the file's extern "C" kernels); 1: the variant built above.
struct Variant {
    const char* name;
    int id, threads, smem, bnb;
};

static void run_cfg(const Cfg& c, const Variant& v, const uint8_t* wgu, const float* sgu, const uint8_t* wdn, const float* sdn,
                    std::mt19937& rng)
{
    const int numel = c.T * c.topk, nkh = (c.H + 127) / 128, nki = (c.I + 127) / 128, nbi = nki, nbh = nkh;
    Align al = make_align(c, rng);
    printf("== %s [%s]: T=%d H=%d I=%d E=%d topk=%d bs=%d total_padded=%d numel=%d\n", c.name, v.name, c.T, c.H, c.I, c.E, c.topk, c.bs,
           al.total, numel);
    DevAlign da(al);
    int *d_sorted = da.sorted, *d_eids = da.eids, *d_total = da.total;
    bf16_t *x, *inter; uint8_t *xq, *iq; float *xs, *is, *out;
    size_t nx = (size_t)c.T * c.H, ni = (size_t)numel * c.I, no = (size_t)numel * c.H;
    CK(cudaMalloc(&x, nx * 2)); CK(cudaMalloc(&xq, nx)); CK(cudaMalloc(&xs, (size_t)c.T * nkh * 4));
    CK(cudaMalloc(&inter, ni * 2)); CK(cudaMalloc(&iq, ni)); CK(cudaMalloc(&is, (size_t)numel * nki * 4));
    CK(cudaMalloc(&out, no * 4));
    fill_x<<<1024, 256>>>(x, c.T, c.H, rng()); CKL();
    // weights: fused [E, 2I, H] (gate rows first; scales [E, 2 nbi, nkh]) or separate [E, I, H] halves of the buffers
    long long gu_es = c.fused ? 2LL * c.I * c.H : (long long)c.I * c.H, gu_ses = c.fused ? 2LL * nbi * nkh : (long long)nbi * nkh;
    const uint8_t* w_g = wgu; const uint8_t* w_u = c.fused ? wgu + (size_t)c.I * c.H : wgu + (size_t)c.E * c.I * c.H;
    const float* s_g = sgu; const float* s_u = c.fused ? sgu + (size_t)nbi * nkh : sgu + (size_t)c.E * nbi * nkh;
    long long dn_es = (long long)c.H * c.I, dn_ses = (long long)nbh * nki;
    WgTmap tm_g = make_tmap(w_g, c.H, c.I, c.E, gu_es, v.bnb / 2), tm_u = make_tmap(w_u, c.H, c.I, c.E, gu_es, v.bnb / 2);
    WgTmap tm_d = make_tmap(wdn, c.I, c.H, c.E, dn_es, v.bnb);
    const long long wx = ((long long)c.T * nkh + 7) / 8, wi = ((long long)numel * nki + 7) / 8;
    auto q_x = [&]() { moe_act_quant_e4m3<<<(unsigned)wx, AQ_THREADS>>>(x, c.T, c.H, xq, xs); };
    auto q_i = [&]() { moe_act_quant_e4m3<<<(unsigned)wi, AQ_THREADS>>>(inter, numel, c.I, iq, is); };
    auto gu = [&]() {
        if (v.id == 0) moe_gate_up_wg_fp8_fp8<<<g_sms, v.threads, v.smem>>>(d_sorted, d_eids, d_total, xq, xs, w_g, w_u, gu_es, s_g, s_u, gu_ses, inter, numel, c.topk, c.I, c.H, c.bs, c.E, tm_g, tm_u);
        else hv_gate_up<<<g_sms, v.threads, v.smem>>>(d_sorted, d_eids, d_total, xq, xs, w_g, w_u, gu_es, s_g, s_u, gu_ses, inter, numel, c.topk, c.I, c.H, c.bs, c.E, tm_g, tm_u);
    };
    auto dn = [&]() {
        if (v.id == 0) moe_down_wg_fp8_fp8<<<g_sms, v.threads, v.smem>>>(d_sorted, d_eids, d_total, iq, is, wdn, dn_es, sdn, dn_ses, out, numel, c.H, c.I, c.bs, c.E, tm_d);
        else hv_down<<<g_sms, v.threads, v.smem>>>(d_sorted, d_eids, d_total, iq, is, wdn, dn_es, sdn, dn_ses, out, numel, c.H, c.I, c.bs, c.E, tm_d);
    };

    fill_u32<<<1024, 256>>>((uint32_t*)inter, ni / 2, 0xFFFFFFFFu); fill_u32<<<1024, 256>>>((uint32_t*)out, no, 0xFFFFFFFFu); CKL();
    q_x(); CKL(); CK(cudaDeviceSynchronize());
    if (c.exact) { fill_codes_int<<<1024, 256>>>(xq, nx, rng()); CKL(); }
    gu(); CKL(); CK(cudaDeviceSynchronize()); printf("  gate_up ran\n"); fflush(stdout);
    q_i(); CKL(); CK(cudaDeviceSynchronize());
    if (c.exact) { fill_codes_int<<<1024, 256>>>(iq, ni, rng()); CKL(); }
    dn(); CKL(); CK(cudaDeviceSynchronize()); printf("  down ran\n"); fflush(stdout);

    std::vector<bf16_t> hi(ni); CK(cudaMemcpy(hi.data(), inter, ni * 2, cudaMemcpyDeviceToHost));
    std::vector<float> ho(no); CK(cudaMemcpy(ho.data(), out, no * 4, cudaMemcpyDeviceToHost));
    std::vector<uint8_t> hiq(ni); CK(cudaMemcpy(hiq.data(), iq, ni, cudaMemcpyDeviceToHost));
    // 5. poison: written exactly where a local expert has the slot
    Unwritten uw = count_unwritten(al, c.local_skip, numel, c.I, c.H, hi, ho);
    printf("  unwritten: inter %lld out %lld; written for the skipped expert: %lld\n", uw.bad_i, uw.bad_o, uw.written_skip);
    EXPECT(uw.bad_i == 0 && uw.bad_o == 0 && uw.written_skip == 0, "%s: unwritten or stray outputs", c.name);

    // sampled slots (all of them for the small shapes)
    std::vector<int> hs, he;
    int step = c.timeit ? std::max(1, numel / 48) : 1;
    for (int s = 0; s < numel; s += step) { if (al.slot_expert[s] == c.local_skip) continue; hs.push_back(s); he.push_back(al.slot_expert[s]); }
    int ns = (int)hs.size();
    int *ds, *de; double *rgv, *rd, *rda; bf16_t* rgb;
    CK(cudaMalloc(&ds, ns * 4)); CK(cudaMalloc(&de, ns * 4));
    CK(cudaMalloc(&rgv, (size_t)ns * c.I * 8)); CK(cudaMalloc(&rgb, (size_t)ns * c.I * 2)); CK(cudaMalloc(&rd, (size_t)ns * c.H * 8)); CK(cudaMalloc(&rda, (size_t)ns * c.H * 8));
    CK(cudaMemcpy(ds, hs.data(), ns * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(de, he.data(), ns * 4, cudaMemcpyHostToDevice));
    WMat mg{w_g, s_g, gu_es, gu_ses}, mu{w_u, s_u, gu_es, gu_ses}, md{wdn, sdn, dn_es, dn_ses};
    ref_gate_up<<<(unsigned)(((size_t)ns * c.I + 255) / 256), 256>>>(ds, de, ns, xq, xs, c.topk, mg, mu, c.I, c.H, rgv, rgb); CKL();
    ref_down<<<(unsigned)(((size_t)ns * c.H + 255) / 256), 256>>>(ds, de, ns, iq, is, md, c.H, c.I, rd, rda); CKL();
    std::vector<double> hrgv((size_t)ns * c.I), hrd((size_t)ns * c.H), hrda((size_t)ns * c.H);
    std::vector<bf16_t> hrgb((size_t)ns * c.I);
    CK(cudaMemcpy(hrgv.data(), rgv, hrgv.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hrgb.data(), rgb, hrgb.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hrd.data(), rd, hrd.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hrda.data(), rda, hrda.size() * 8, cudaMemcpyDeviceToHost));
    // 3. gate_up: bf16 ulps against the twin-rounded reference, relative L2 against the f64 one;
    //    act_quant codes of the GPU inter against those of the reference inter.
    long long ulp1 = 0, ulp2 = 0, nval = 0, flips = 0, flip2 = 0, qexact = 0;
    double e2 = 0, r2 = 0, t2 = 0, gt2 = 0, tr2 = 0;
    std::vector<uint8_t> qa(c.I), qb(c.I); std::vector<float> sa(nki), sb(nki);
    std::vector<bf16_t> rrow(c.I);
    for (int i = 0; i < ns; i++) {
        int s = hs[i];
        for (int n = 0; n < c.I; n++) {
            bf16_t a = hi[(size_t)s * c.I + n], b = hrgb[(size_t)i * c.I + n];
            int d = bf16_ulps(a, b);
            ulp1 += d >= 1; ulp2 += d >= 2; nval++;
            double r = hrgv[(size_t)i * c.I + n], g = h_bf16_to_f32(a);
            e2 += (g - r) * (g - r); r2 += r * r;
            double tw = h_bf16_to_f32(b);
            t2 += (tw - r) * (tw - r); gt2 += (g - tw) * (g - tw); tr2 += tw * tw;
            if (i == 0 && n < 3) printf("    sample s=%d n=%d ref %.6f twin-bf16 %.6f gpu %.6f\n", s, n, r, h_bf16_to_f32(b), g);
            rrow[n] = b;
        }
        h_quant_row(&hi[(size_t)s * c.I], c.I, qa.data(), sa.data());   // act_quant of the GPU inter, host
        h_quant_row(rrow.data(), c.I, qb.data(), sb.data());            // act_quant of the reference inter
        for (int n = 0; n < c.I; n++) {
            qexact += qa[n] != hiq[(size_t)s * c.I + n];                // GPU act_quant bit-exact on real data
            int d = abs((int)(qa[n] & 0x7f) * ((qa[n] & 0x80) ? -1 : 1) - (int)(qb[n] & 0x7f) * ((qb[n] & 0x80) ? -1 : 1));
            flips += d >= 1; flip2 += d >= 2;
        }
    }
    const double gu_gpu = sqrt(e2 / r2), gu_twin = sqrt(t2 / r2), gu_gt = sqrt(gt2 / tr2);
    printf("  gate_up (%d slots): relL2 vs f64: gpu %.3e, twin-rounded %.3e (the bf16 floor); gpu vs twin %.3e; bf16 vs twin: >=1 ulp %lld (%.2e), >=2 ulp %lld (%.2e) of %lld\n",
           ns, gu_gpu, gu_twin, gu_gt, ulp1, (double)ulp1 / nval, ulp2, (double)ulp2 / nval, nval);
    printf("  inter e4m3 codes: GPU act_quant vs host on GPU inter mismatches %lld; vs reference inter: flips %lld (%.2e), >=2 codes %lld\n",
           qexact, flips, (double)flips / nval, flip2);
    if (!c.exact) EXPECT(qexact == 0, "%s: act_quant(inter) not bit-exact", c.name);
    if (c.exact) {
        // Integer codes: G and U differ from the twin by f32 scale products and order only (~1e-7 of sum|terms|), so a
        // bf16 value flips by one ulp only within ~1e-7 of a rounding boundary (measured 1.2e-4 .. 1.4e-4 of values),
        // by two only where G or U cancels to ~1e-5 of sum|terms| (measured <= 8e-6). A wrong row, column or scale
        // flips nearly all of them.
        EXPECT((double)ulp2 / nval < 1e-4 && (double)ulp1 / nval < 1e-3, "%s: exact gate_up differs from the twin: >=2 ulp %lld, >=1 ulp %lld", c.name, ulp2, ulp1);
    } else {
        // Random codes: the fp8 tensor cores accumulate each k32 chain with a truncated (~13-14 bit) mantissa, so G and U
        // carry ~2e-4 relative error (measured on down below). Added in quadrature to the bf16 floor (~1.6e-3) that
        // moves relL2 by < 1e-4; a wrong row, column or scale moves it by O(1).
        EXPECT(gu_gpu < gu_twin + 2e-4, "%s: gate_up relL2 vs f64 %.3e, twin's bf16 floor %.3e", c.name, gu_gpu, gu_twin);
        EXPECT(gu_gt < 4e-3, "%s: gate_up relL2 gpu vs twin %.3e", c.name, gu_gt);
    }
    // 4. down
    double d2 = 0, dr2 = 0, dmax = 0, dnorm = 0;
    for (int i = 0; i < ns; i++) {
        int s = hs[i];
        for (int n = 0; n < c.H; n++) {
            double r = hrd[(size_t)i * c.H + n], g = ho[(size_t)s * c.H + n];
            d2 += (g - r) * (g - r); dr2 += r * r; dmax = std::max(dmax, fabs(g - r));
            if (hrda[(size_t)i * c.H + n] > 0) dnorm = std::max(dnorm, fabs(g - r) / hrda[(size_t)i * c.H + n]);
            if (i == 0 && n < 3) printf("    sample s=%d n=%d ref %.6f gpu %.6f\n", s, n, r, g);
        }
    }
    const double dn_rel = sqrt(d2 / dr2);
    printf("  down (%d slots): relL2 vs f64 %.3e, max |d| %.3e, max |d| / sum|a b| %.3e\n", ns, dn_rel, dmax, dnorm);
    if (c.exact) {
        // Integer codes: f32 scale products and f32 promotion order only.
        EXPECT(dn_rel < 1e-6 && dnorm < 1e-6, "%s: exact down relL2 %.3e, max normalised %.3e", c.name, dn_rel, dnorm);
    } else {
        // Random codes: the tensor cores' truncated fp8 accumulation (measured ~1.7e-4 relL2, ~2^-13 of the
        // partials); a wrong scale or row is O(1e-1) of sum|a b|.
        EXPECT(dn_rel < 1e-3 && dnorm < 2e-3, "%s: down relL2 %.3e, max normalised %.3e", c.name, dn_rel, dnorm);
    }
    CK(cudaFree(ds)); CK(cudaFree(de)); CK(cudaFree(rgv)); CK(cudaFree(rgb)); CK(cudaFree(rd)); CK(cudaFree(rda));

    if (c.timeit) {
        double tqx = time_us(q_x), tgu = time_us(gu), tqi = time_us(q_i), tdn = time_us(dn);
        double fgu = 2.0 * numel * 2.0 * c.I * c.H, fdn = 2.0 * numel * (double)c.H * c.I;
        printf("  TIMING [%s] T=%d act_quant(x) %.1f us | gate_up %.0f us (%.0f TFLOP/s) | act_quant(inter) %.1f us | down %.0f us (%.0f TFLOP/s) | total %.0f us\n",
               v.name, c.T, tqx, tgu, fgu / tgu * 1e-6, tqi, tdn, fdn / tdn * 1e-6, tqx + tgu + tqi + tdn);
    }
    CK(cudaFree(x)); CK(cudaFree(xq)); CK(cudaFree(xs)); CK(cudaFree(inter)); CK(cudaFree(iq)); CK(cudaFree(is)); CK(cudaFree(out));
    fflush(stdout);
}

// Weights for a config: codes and scales (base 2^-10: values up to ~0.66).
struct WBufs { uint8_t *gu, *dn; float *sgu, *sdn; };
static WBufs make_weights(const Cfg& c, uint64_t seed)
{
    const int nkh = (c.H + 127) / 128, nki = (c.I + 127) / 128;
    size_t ngu = 2ull * c.E * c.I * c.H, ndn = (size_t)c.E * c.H * c.I;
    size_t nsgu = 2ull * c.E * nki * nkh, nsdn = (size_t)c.E * nkh * nki;
    WBufs w;
    CK(cudaMalloc(&w.gu, ngu)); CK(cudaMalloc(&w.dn, ndn)); CK(cudaMalloc(&w.sgu, nsgu * 4)); CK(cudaMalloc(&w.sdn, nsdn * 4));
    if (c.exact) { fill_codes_int<<<4096, 256>>>(w.gu, ngu, seed); fill_codes_int<<<4096, 256>>>(w.dn, ndn, seed + 1); }
    else { fill_codes<<<4096, 256>>>(w.gu, ngu, seed); fill_codes<<<4096, 256>>>(w.dn, ndn, seed + 1); }
    fill_scales<<<256, 256>>>(w.sgu, nsgu, seed + 2, 1.f / 1024); fill_scales<<<256, 256>>>(w.sdn, nsdn, seed + 3, 1.f / 1024); CKL();
    CK(cudaDeviceSynchronize());
    return w;
}
static void free_weights(WBufs& w) { CK(cudaFree(w.gu)); CK(cudaFree(w.dn)); CK(cudaFree(w.sgu)); CK(cudaFree(w.sdn)); }

int main(int argc, char** argv)
{
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    g_sms = p.multiProcessorCount;
    printf("device %s cc %d.%d SMs %d smem/block optin %zu\n", p.name, p.major, p.minor, g_sms, p.sharedMemPerBlockOptin);
    Variant vs[2] = {
        {"bm128xbn192", 0, WF_THREADS, WF_SMEM_BYTES, WF_BNB},
        {"bm192xbn128", 1, HV_THREADS, HV_SMEM, HV_BNB},
    };
    for (auto& v : vs) {
        const void* kgu = v.id == 0 ? (const void*)moe_gate_up_wg_fp8_fp8 : (const void*)hv_gate_up;
        const void* kdn = v.id == 0 ? (const void*)moe_down_wg_fp8_fp8 : (const void*)hv_down;
        CK(cudaFuncSetAttribute(kgu, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
        CK(cudaFuncSetAttribute(kdn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
        cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, kgu));
        cudaFuncAttributes fd; CK(cudaFuncGetAttributes(&fd, kdn));
        int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kgu, v.threads, v.smem));
        printf("%s: %d threads, smem %d B, occupancy %d CTA/SM, regs gate_up %d down %d (want %d), local %zu/%zu\n", v.name, v.threads,
               v.smem, occ, fa.numRegs, fd.numRegs, 65536 / v.threads / 8 * 8, fa.localSizeBytes, fd.localSizeBytes);
    }
    std::mt19937 rng(12345);
    bool big = argc < 2 || atoi(argv[1]) != 0;
    if (argc >= 2 && atoi(argv[1]) > 1) {
        // ./hf T: DeepSeek shapes at T tokens, default instance only (for ncu: its first gate_up /
        // down launch is the checked one, then the 12 timed ones).
        Cfg c{"deepseek", atoi(argv[1]), 7168, 2048, 264, 9, 8, 16, -1, true, true, false};
        WBufs w = make_weights(c, 11);
        run_cfg(c, vs[0], w.gu, w.sgu, w.dn, w.sdn, rng);
        free_weights(w);
        printf(g_fail ? "FAILED (%d checks)\n" : "PASS\n", g_fail);
        return g_fail ? 1 : 0;
    }
    test_encoder();
    test_act_quant(40, 1000, rng);  // short last group (104), cols % 4 == 0
    test_act_quant(40, 1002, rng);  // cols % 4 != 0: element path
    test_act_quant(9, 7168, rng);
    // small, odd shapes: K % 128 != 0 (K tails inside a scale block), N tails, block size 32,
    // one expert not on this rank, separate gate/up; then fused gate_up with shared experts.
    {
        Cfg c{"small", 300, 528, 208, 6, 3, 0, 32, 2, false, false, false};
        WBufs w = make_weights(c, 7);
        for (auto& v : vs) run_cfg(c, v, w.gu, w.sgu, w.dn, w.sdn, rng);
        free_weights(w);
        Cfg c2{"small-fused-shared", 1000, 1024, 384, 12, 5, 4, 16, -1, true, false, false};
        w = make_weights(c2, 17);
        for (auto& v : vs) run_cfg(c2, v, w.gu, w.sgu, w.dn, w.sdn, rng);
        free_weights(w);
        // the same shapes with integer codes (fill_codes_int): exactness of the scale and row plumbing
        c.name = "small-exact"; c.exact = true;
        w = make_weights(c, 27);
        for (auto& v : vs) run_cfg(c, v, w.gu, w.sgu, w.dn, w.sdn, rng);
        free_weights(w);
        c2.name = "small-fused-shared-exact"; c2.exact = true;
        w = make_weights(c2, 37);
        for (auto& v : vs) run_cfg(c2, v, w.gu, w.sgu, w.dn, w.sdn, rng);
        free_weights(w);
    }
    if (big) {
        Cfg c{"deepseek", 1024, 7168, 2048, 264, 9, 8, 16, -1, true, true, false};
        WBufs w = make_weights(c, 11);
        for (int T : {1024, 4096}) {
            c.T = T;
            for (auto& v : vs) run_cfg(c, v, w.gu, w.sgu, w.dn, w.sdn, rng);
        }
        free_weights(w);
    }
    printf(g_fail ? "FAILED (%d checks)\n" : "PASS\n", g_fail);
    return g_fail ? 1 : 0;
}
