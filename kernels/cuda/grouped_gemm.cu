// Grouped GEMM over sorted blocks: the fused MoE expert computation, with the
// semantics of the Triton fused_moe kernel (vLLM/SGLang) and of the CPU twin
// moe.GroupedGEMM.
//
// Inputs come from moe_align_block_size: sorted_ids [max_padded] holds slot
// indices s = t*topk + k grouped by expert, each expert's range padded to a
// multiple of block_size with the sentinel numel; expert_ids [max_padded /
// block_size] the expert of each block; *total_padded the used length.
//
// Stage 1 (moe_gate_up_*): inter[s, n] = silu(x[s/topk] . Wgate[e,n]) *
// (x[s/topk] . Wup[e,n]) for n < N = I. Stage 2 (moe_down_*): out[s, n] =
// inter[s] . Wdown[e,n] for n < N = H. Both are one template: C = A B^T with
// rows of A gathered through sorted_ids, B the [N,K] matrix of the block's
// expert. Accumulation is float32. FP8 E4M3 weights are dequantised in the
// main loop with their f32 128x128 block scales (value * scale rounded once to
// f32, exactly as weightfmt.DequantE4M3), so an f32-mode run computes the same
// function on the same weights as the CPU twin.
//
// This is the SIMT tiled version (16 rows x 64 columns per CTA, K in steps of
// 32): correct for any shape, not on tensor cores.
//
// Weight layouts are handled by the caller through pointers and strides: the
// separate [E,I,H] gate/up tensors, or one [E,2I,H] gate_up tensor (b0 =
// base, b1 = base + I*H, expert stride 2*I*H; swap them for up-gate order);
// FP8 scales likewise ([E,2*ceil(I/128),ceil(H/128)] for gate_up: two stacked
// grids).
//
// Activations: "f32" mode reads x f32 and writes inter f32; "bf16" mode reads
// x bf16 and writes inter bf16 (rounded to nearest even), as serving engines
// keep their intermediate cache. Outputs of stage 2 are always f32 [numel, H],
// unweighted: finalize applies the slot weights.
//
// Padding rows (sentinel >= numel) are skipped: their outputs are not written.
// block_size must be a multiple of 16 so that a 16-row tile has one expert.
#include "numeric.cuh"
#include "mma_sync.cuh"

// torch.float8_e4m3fn (numfmt.E4M3ToF32): no infinities, S.1111.111 is NaN,
// bias 7; subnormals are m*2^-9.
__device__ __forceinline__ float e4m3_decode(unsigned b) {
    unsigned s = (b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
    if (e == 0xFu && m == 7u) return __uint_as_float(s | 0x7fc00000u);
    if (e == 0u) {
        float v = (float)m * 0.001953125f;
        return s ? -v : v;
    }
    return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}
__device__ __forceinline__ float ld_f32(const e4m3_t* p, long long i) { return e4m3_decode(p[i]); }

#define GG_BM 16
#define GG_BN 64
#define GG_BK 32
#define GG_THREADS 256
#define GG_SCALE_BLOCK 128

// Every tile below is a template <class AT, class WT, bool GATED, bool FP8>
// (activation and weight element types; gate_up or down; FP8 E4M3 weights
// with block scales) over one parameter list, GEMM_TILE_PARAMS: rows of A
// [., K] gathered through sorted_ids (slot s reads row s / a_div), weight
// matrices b0 (gate, or down) and b1 (up) [E, N, K] with expert stride
// b_estride, their fp8 block scales s0 and s1 (expert stride s_estride), and
// C [numel, N] in the activation type (gate_up) or f32 (down).
template <class AT, bool GATED> struct gemm_out {
    typedef float type;
};
template <class AT> struct gemm_out<AT, true> {
    typedef AT type;
};
#define GEMM_TILE_PARAMS                                                                                          \
    const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids, const int* __restrict__ total_padded, \
        const AT* __restrict__ a, int a_div, const WT* __restrict__ b0, const WT* __restrict__ b1,                \
        long long b_estride, const float* __restrict__ s0, const float* __restrict__ s1, long long s_estride,      \
        typename gemm_out<AT, GATED>::type* __restrict__ c, int numel, int N, int K, int block_size, int num_experts

// The kernels: one parameter list per stage for every variant (the Go side
// passes the same arguments to all), each instantiating tile TILE<AT, WT,
// GATED, FP8> under the launch bounds BOUNDS (in parentheses).
// Stage 1: A = x [T,H] (a_div = topk), B = gate and up [E,I,H], C = inter [numel,I].
#define GEMM_GATE_UP(NAME, BOUNDS, TILE, AT, WT, FP8)                                                     \
    extern "C" __global__ void __launch_bounds__ BOUNDS NAME(                                             \
        const int* sorted_ids, const int* expert_ids, const int* total_padded, const AT* x,                \
        const WT* w_gate, const WT* w_up, long long w_estride, const float* s_gate, const float* s_up,     \
        long long s_estride, AT* inter, int numel, int topk, int I, int H, int block_size, int num_experts) \
    {                                                                                                      \
        TILE<AT, WT, true, FP8>(sorted_ids, expert_ids, total_padded, x, topk, w_gate, w_up, w_estride,    \
                                s_gate, s_up, s_estride, inter, numel, I, H, block_size, num_experts);     \
    }
// Stage 2: A = inter [numel,I] (a_div = 1), B = down [E,H,I], C = out [numel,H] f32.
#define GEMM_DOWN(NAME, BOUNDS, TILE, AT, WT, FP8)                                                        \
    extern "C" __global__ void __launch_bounds__ BOUNDS NAME(                                             \
        const int* sorted_ids, const int* expert_ids, const int* total_padded, const AT* inter,            \
        const WT* w_down, long long w_estride, const float* s_down, long long s_estride, float* out,       \
        int numel, int H, int I, int block_size, int num_experts)                                          \
    {                                                                                                      \
        TILE<AT, WT, false, FP8>(sorted_ids, expert_ids, total_padded, inter, 1, w_down, w_down, w_estride, \
                                 s_down, s_down, s_estride, out, numel, H, I, block_size, num_experts);     \
    }

template <class AT, class WT, bool GATED, bool FP8>
__device__ __forceinline__ void grouped_gemm_tile(GEMM_TILE_PARAMS)
{
    __shared__ float As[GG_BM][GG_BK + 1];
    __shared__ float Bs[GATED ? 2 : 1][GG_BN][GG_BK + 1];
    __shared__ int slot[GG_BM];

    const int tid = threadIdx.x;
    const int row0 = blockIdx.x * GG_BM;
    const int n0 = blockIdx.y * GG_BN;
    // The block's expert and slots. Each tile writes these lines out: as a
    // shared helper they compiled to other SASS (the index loads off the
    // read-only path, the exits behind a branch).
    if (row0 >= *total_padded) return;  // uniform across the CTA
    const int e = expert_ids[row0 / block_size];
    if (e < 0 || e >= num_experts) return;  // not this rank's expert
    if (tid < GG_BM) {
        int s = sorted_ids[row0 + tid];
        slot[tid] = (s >= 0 && s < numel) ? s : -1;
    }
    __syncthreads();

    const WT* bm0 = b0 + (long long)e * b_estride;
    const WT* bm1 = GATED ? b1 + (long long)e * b_estride : b0;
    const int sc = (K + GG_SCALE_BLOCK - 1) / GG_SCALE_BLOCK;
    const int r = tid / 16, cl = tid % 16;
    float acc0[4] = {0.f, 0.f, 0.f, 0.f};
    float acc1[4] = {0.f, 0.f, 0.f, 0.f};

    for (int k0 = 0; k0 < K; k0 += GG_BK) {
        // A tile: 16 x 32, two elements a thread; a warp reads 32 consecutive k.
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int idx = tid + j * GG_THREADS;
            int rr = idx / GG_BK, kk = idx % GG_BK, k = k0 + kk;
            int s = slot[rr];
            As[rr][kk] = (s >= 0 && k < K) ? ld_f32(a, (long long)(s / a_div) * K + k) : 0.f;
        }
        // B tiles: 64 x 32 each. A chunk of 32 columns and 64 rows starting at
        // multiples of 32 and 64 lies inside one 128x128 scale block.
        float sc0 = 1.f, sc1 = 1.f;
        if (FP8) {
            long long si = (long long)e * s_estride + (long long)(n0 / GG_SCALE_BLOCK) * sc + k0 / GG_SCALE_BLOCK;
            sc0 = s0[si];
            if (GATED) sc1 = s1[si];
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int idx = tid + j * GG_THREADS;
            int nn = idx / GG_BK, kk = idx % GG_BK, n = n0 + nn, k = k0 + kk;
            bool in = n < N && k < K;
            long long off = (long long)n * K + k;
            float v0 = in ? ld_f32(bm0, off) : 0.f;
            if (FP8) v0 = __fmul_rn(v0, sc0);
            Bs[0][nn][kk] = v0;
            if (GATED) {
                float v1 = in ? ld_f32(bm1, off) : 0.f;
                if (FP8) v1 = __fmul_rn(v1, sc1);
                Bs[GATED ? 1 : 0][nn][kk] = v1;
            }
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GG_BK; kk++) {
            float av = As[r][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                acc0[j] = fmaf(av, Bs[0][cl + 16 * j][kk], acc0[j]);
                if (GATED) acc1[j] = fmaf(av, Bs[GATED ? 1 : 0][cl + 16 * j][kk], acc1[j]);
            }
        }
        __syncthreads();
    }

    const int s = slot[r];
    if (s < 0) return;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int n = n0 + cl + 16 * j;
        if (n >= N) continue;
        float v = acc0[j];
        if (GATED) v = swiglu(v, acc1[j]);
        st_val(c, (long long)s * N + n, v);
    }
}

// Ungated stage 1, for experts whose activation the epilogue above does not
// run (gpt-oss's biases and clamped SwiGLU, DeepSeek-V4's clamp): out[s, n]
// = x[s/topk] . W[e,n] for n < N, f32 [numel, N], launched once for the
// gate and once for the up weights; act.cu's moe_act_* then adds the biases
// and applies the activation. Same tile and arithmetic as the fused kernels.
#define GG_PROJ(NAME, AT, WT, FP8)                                                                         \
    extern "C" __global__ void __launch_bounds__(GG_THREADS) NAME(                                         \
        const int* sorted_ids, const int* expert_ids, const int* total_padded, const AT* x, const WT* w,    \
        long long w_estride, const float* s_w, long long s_estride, float* out, int numel, int topk, int N, \
        int K, int block_size, int num_experts)                                                             \
    {                                                                                                       \
        grouped_gemm_tile<AT, WT, false, FP8>(sorted_ids, expert_ids, total_padded, x, topk, w, w,          \
                                              w_estride, s_w, s_w, s_estride, out, numel, N, K, block_size, \
                                              num_experts);                                                 \
    }

// The SIMT kernels of one activation and weight type: gate_up, down and the ungated projection.
#define GG_KERNELS(GATE_UP, DOWN, PROJ, AT, WT, FP8)                \
    GEMM_GATE_UP(GATE_UP, (GG_THREADS), grouped_gemm_tile, AT, WT, FP8) \
    GEMM_DOWN(DOWN, (GG_THREADS), grouped_gemm_tile, AT, WT, FP8)       \
    GG_PROJ(PROJ, AT, WT, FP8)

GG_KERNELS(moe_gate_up_f32_f32, moe_down_f32_f32, moe_proj_f32_f32, float, float, false)
GG_KERNELS(moe_gate_up_f32_bf16, moe_down_f32_bf16, moe_proj_f32_bf16, float, bf16_t, false)
GG_KERNELS(moe_gate_up_f32_fp8, moe_down_f32_fp8, moe_proj_f32_fp8, float, e4m3_t, true)
GG_KERNELS(moe_gate_up_bf16_f32, moe_down_bf16_f32, moe_proj_bf16_f32, bf16_t, float, false)
GG_KERNELS(moe_gate_up_bf16_bf16, moe_down_bf16_bf16, moe_proj_bf16_bf16, bf16_t, bf16_t, false)
GG_KERNELS(moe_gate_up_bf16_fp8, moe_down_bf16_fp8, moe_proj_bf16_fp8, bf16_t, e4m3_t, true)

// ---------------------------------------------------------------------------
// The tensor-core variants below (mma, mma2, tall, mma3) take bf16
// activations (AT = bf16_t) and write a bf16 intermediate.
//
// Fragment layout shared by them (m16n8k16): lane l holds rows g and g + 8
// (g = l >> 2) and columns 2q, 2q + 1 (q = l & 3) of each n8 tile, as
// acc[j][2h + i] for row g + 8h, column 8j + 2q + i.
//
// mma_store_tile writes one 16-row tile's fragments for this lane: rows
// slot[g], slot[g + 8] (-1: padding, not written), columns nb + 8j + 2q + i
// of J n8 tiles (those < N). gate_up (GATED) writes bf16(swiglu(gate, up))
// from the gate and up accumulators, down the f32 value of acc0.
template <bool GATED, int J, class OT>
__device__ __forceinline__ void mma_store_tile(const float (&acc0)[J][4], const float (&acc1)[J][4], const int* slot,
                                               int nb, int g, int q, int N, OT* c)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {  // fragment rows g and g+8
        int s = slot[g + 8 * h];
        if (s < 0) continue;
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int n = nb + j * 8 + 2 * q + i;
                if (n >= N) continue;
                float v = acc0[j][2 * h + i];
                if (GATED) v = swiglu(v, acc1[j][2 * h + i]);
                st_val(c, (long long)s * N + n, v);
            }
    }
}

// FP8 weights: after the K step at k0 of width BK, once a 128-wide scale
// block of K is complete (or K ends), acc[m] += part[m] * the block scale of
// matrix m (block (n0 / 128, k0 / 128) of expert e's grid at sm[m]) and
// part[m] = 0, so every product is exact and each block's partial sum is
// scaled once (as the Triton kernel does).
template <int BK, int NB, class Frag>
__device__ __forceinline__ void promote_scale_block(Frag (&acc)[NB], Frag (&part)[NB], const float* const* sm,
                                                    long long s_estride, int e, int n0, int sc, int k0, int K)
{
    if ((k0 + BK) % GG_SCALE_BLOCK == 0 || k0 + BK >= K) {
        long long si = (long long)e * s_estride + (long long)(n0 / GG_SCALE_BLOCK) * sc + k0 / GG_SCALE_BLOCK;
#pragma unroll
        for (int m = 0; m < NB; m++) frag_promote(acc[m], part[m], sm[m][si]);
    }
}

// Four e4m3 bytes (w, byte 0 first) to four bf16 in two bf16x2 words (lo:
// bytes 0,1; hi: bytes 2,3), exactly: every e4m3 value, subnormals and NaN
// included, is a bf16 value. sm_89 and later convert in hardware to f16x2
// (exact) and widen through f32 (exact); sm_80 has no fp8 conversion and uses
// fp8_bits_to_bf16x4, a branch-free bit trick. Both replace the per-element
// branchy e4m3_decode in the main loop; gg_fp8_decode_check tests both
// against the CPU decoder on all 256 codes.
__device__ __forceinline__ void fp8_bits_to_bf16x4(unsigned w, unsigned& lo, unsigned& hi)
{
    // Put each byte in the high byte of a 16-bit half: sign lands on the
    // bf16 sign, and e (4 bits) m (3 bits) shifted right by 4 land on the low
    // exponent bits and top mantissa bits. That bf16 is the e4m3 value times
    // 2^-120 (bias 127 instead of 7; subnormals become bf16 subnormals with
    // the same scaling); one exact bf16x2 multiply by 2^120 restores it.
    // NaN (S.1111.111) would come out finite, so NaN bytes are detected with
    // a carry trick ((b & 0x7f) + 1 sets bit 7 only for 0x7f) and forced NaN.
    const unsigned nan = ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
    unsigned p[2] = {__byte_perm(w, 0u, 0x1404u), __byte_perm(w, 0u, 0x3424u)};
    unsigned n[2] = {__byte_perm(nan, 0u, 0x1404u), __byte_perm(nan, 0u, 0x3424u)};
    unsigned o[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        unsigned r = (p[i] & 0x80008000u) | ((p[i] >> 4) & 0x07f007f0u), d;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(r), "r"(0x7b807b80u), "r"(0x80008000u));
        o[i] = d | ((n[i] >> 15) * 0x7fc0u);
    }
    lo = o[0];
    hi = o[1];
}

__device__ __forceinline__ unsigned f16x2_to_bf16x2(unsigned h)
{
    unsigned d;
    asm("{\n\t.reg .f16 h_lo, h_hi;\n\t.reg .f32 f_lo, f_hi;\n\t"
        "mov.b32 {h_lo, h_hi}, %1;\n\tcvt.f32.f16 f_lo, h_lo;\n\tcvt.f32.f16 f_hi, h_hi;\n\t"
        "cvt.rn.bf16x2.f32 %0, f_hi, f_lo;\n\t}"
        : "=r"(d) : "r"(h));
    return d;
}

__device__ __forceinline__ void fp8_hw_to_bf16x4(unsigned w, unsigned& lo, unsigned& hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned h0, h1;
    asm("{\n\t.reg .b16 q_lo, q_hi;\n\tmov.b32 {q_lo, q_hi}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, q_lo;\n\tcvt.rn.f16x2.e4m3x2 %1, q_hi;\n\t}"
        : "=r"(h0), "=r"(h1) : "r"(w));
    lo = f16x2_to_bf16x2(h0);
    hi = f16x2_to_bf16x2(h1);
#else
    fp8_bits_to_bf16x4(w, lo, hi);
#endif
}

__device__ __forceinline__ void fp8x4_to_bf16x4(unsigned w, unsigned& lo, unsigned& hi) { fp8_hw_to_bf16x4(w, lo, hi); }

// Test hook: bf16 bits of every e4m3 code through both decoders.
extern "C" __global__ void gg_fp8_decode_check(bf16_t* hw, bf16_t* bits)
{
    unsigned t = threadIdx.x;  // 64 threads, four codes each
    unsigned w = (4 * t) | ((4 * t + 1) << 8) | ((4 * t + 2) << 16) | ((4 * t + 3) << 24);
    unsigned lo, hi;
    fp8_hw_to_bf16x4(w, lo, hi);
    hw[4 * t] = lo & 0xffff; hw[4 * t + 1] = lo >> 16; hw[4 * t + 2] = hi & 0xffff; hw[4 * t + 3] = hi >> 16;
    fp8_bits_to_bf16x4(w, lo, hi);
    bits[4 * t] = lo & 0xffff; bits[4 * t + 1] = lo >> 16; bits[4 * t + 2] = hi & 0xffff; bits[4 * t + 3] = hi >> 16;
}

// 16 bytes of one global load or shared-memory store.
struct __align__(16) vec16 { unsigned x, y, z, w; };

// Elements of weight type WT in one 16-byte load.
template <class WT> struct vec16_elems;
template <> struct vec16_elems<bf16_t> {
    static constexpr int N = 8;
};
template <> struct vec16_elems<e4m3_t> {
    static constexpr int N = 16;
};

// The 16-byte-load kernels (mma2, tall) keep one K step of BK in registers
// while the tensor cores multiply the previous one: each of THREADS threads
// holds AV vectors of the gathered A rows and BV of each of the NB weight
// matrices. A row chunk of BK is BK / 8 vectors of bf16; a B row chunk
// VPR = BK / PV vectors of PV weights (PV = vec16_elems<WT>::N).
//
// vec_load queues the loads of the K step at k0: A vector v is chunk
// (tid + v THREADS) % (BK / 8) of the row of slot as[v] (-1: padding; token
// as[v] / a_div), B vector j of matrix m chunk idx % VPR of weight row
// n0 + idx / VPR (idx = tid + j THREADS); anything past K or N reads as zeros.
template <int THREADS, int BK, int PV, int AV, int NB, int BV, class WT>
__device__ __forceinline__ void vec_load(vec16 (&ra)[AV], vec16 (&rb)[NB][BV], const int (&as)[AV], const bf16_t* a, int a_div,
                                         const WT* const* bm, int tid, int k0, int n0, int N, int K)
{
    constexpr int VPA = BK / 8, VPR = BK / PV;
#pragma unroll
    for (int v = 0; v < AV; v++) {
        int k = k0 + ((tid + v * THREADS) % VPA) * 8;
        int s = as[v];
        ra[v] = (s >= 0 && k < K) ? *(const vec16*)(a + (long long)(s / a_div) * K + k) : vec16{0, 0, 0, 0};
    }
#pragma unroll
    for (int m = 0; m < NB; m++)
#pragma unroll
        for (int j = 0; j < BV; j++) {
            int idx = tid + j * THREADS;
            int nn = idx / VPR, kk = k0 + (idx % VPR) * PV, n = n0 + nn;
            rb[m][j] = (n < N && kk < K) ? *(const vec16*)(bm[m] + (long long)n * K + kk) : vec16{0, 0, 0, 0};
        }
}

// vec_store puts the K step held by vec_load into the shared-memory tiles As
// [rows][LD] and Bs [NB][BN][LD] (bf16), at the places vec_load read them
// from; fp8 weights are widened to bf16 on the way (16 e4m3 -> 2 x 8 bf16).
template <int THREADS, int BK, int PV, bool FP8, int AV, int NB, int BV, int ROWS, int BN, int LD>
__device__ __forceinline__ void vec_store(bf16_t (&As)[ROWS][LD], bf16_t (&Bs)[NB][BN][LD], const vec16 (&ra)[AV],
                                          const vec16 (&rb)[NB][BV], int tid)
{
    constexpr int VPA = BK / 8, VPR = BK / PV;
#pragma unroll
    for (int v = 0; v < AV; v++) {
        int idx = tid + v * THREADS;
        *(vec16*)&As[idx / VPA][(idx % VPA) * 8] = ra[v];
    }
#pragma unroll
    for (int m = 0; m < NB; m++)
#pragma unroll
        for (int j = 0; j < BV; j++) {
            int idx = tid + j * THREADS;
            int nn = idx / VPR, kk = (idx % VPR) * PV;
            if (FP8) {
                vec16 lo, hi;
                fp8x4_to_bf16x4(rb[m][j].x, lo.x, lo.y);
                fp8x4_to_bf16x4(rb[m][j].y, lo.z, lo.w);
                fp8x4_to_bf16x4(rb[m][j].z, hi.x, hi.y);
                fp8x4_to_bf16x4(rb[m][j].w, hi.z, hi.w);
                *(vec16*)&Bs[m][nn][kk] = lo;
                *(vec16*)&Bs[m][nn][kk + 8] = hi;
            } else {
                *(vec16*)&Bs[m][nn][kk] = rb[m][j];
            }
        }
}

// ---------------------------------------------------------------------------
// Tensor-core tiles of 16 rows x 64 columns, 128 threads, mma.sync m16n8k16
// (bf16 in, f32 accumulate), the launch grid of the SIMT kernels: each warp
// owns 16 output columns (two n8 tiles) of each B matrix. bf16 weights feed
// the tensor cores as they are; FP8 E4M3 weights convert exactly to bf16
// and their 128x128 block scale multiplies the partial sum of each 128-wide
// K block (promote_scale_block), so every product is exact and the only
// rounding beyond f32 accumulation is the bf16 intermediate. Two ways to
// stage a K step, the same arithmetic (bit-identical outputs):
//   MmaTile<false> ("mma"): K steps of 32, element loads; any shape.
//   MmaTile<true> ("mma2"): K steps of 64 (128 for fp8 weights, one scale
//     block, so each thread keeps as many bytes of weights in flight, 4 x 16
//     B per matrix, as bf16 does with 64), every global load 16 bytes wide
//     (8 bf16 or 16 fp8 values), the next K step's loads issued into
//     registers before the current step's mma.sync, so each thread keeps
//     64-128 bytes in flight. The caller picks it only when every row start
//     is 16-byte aligned: K % 8 == 0 for bf16 weights and activations, K % 16
//     == 0 for fp8 weights (and the gate_up half offset likewise).

#define MM_THREADS 128
#define MM_LD (GG_BK + 8)  // mma's row pitch in bf16: 80 bytes, conflict-free fragment loads
#define M2_BK 64
#define M2_LD (M2_BK + 8)  // 144-byte pitch: 16-byte aligned rows, conflict-free fragments

__device__ __forceinline__ unsigned short raw_bf16(const bf16_t* p, long long i) { return p[i]; }
__device__ __forceinline__ unsigned short raw_bf16(const e4m3_t* p, long long i) { return f32_to_bf16(ld_f32(p, i)); }

// The multiplies of one K step of BK staged in shared memory (A [16][LD], B
// [NB][64][LD] bf16): warp w takes columns 16w .. 16w + 15 of each B
// matrix, k16 by k16 in increasing k, into acc (bf16 weights) or part (fp8:
// the current scale block's partial sum).
template <int NB, int BK, int LD, bool FP8>
__device__ __forceinline__ void mma_tile_k_step(const bf16_t (&As)[GG_BM][LD], const bf16_t (&Bs)[NB][GG_BN][LD],
                                                float (&acc)[NB][2][4], float (&part)[NB][2][4], int warp, int g, int q)
{
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
        unsigned a0 = *(const unsigned*)&As[g][ks + 2 * q];
        unsigned a1 = *(const unsigned*)&As[g + 8][ks + 2 * q];
        unsigned a2 = *(const unsigned*)&As[g][ks + 2 * q + 8];
        unsigned a3 = *(const unsigned*)&As[g + 8][ks + 2 * q + 8];
#pragma unroll
        for (int m = 0; m < NB; m++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int nn = warp * 16 + j * 8 + g;
                unsigned bb0 = *(const unsigned*)&Bs[m][nn][ks + 2 * q];
                unsigned bb1 = *(const unsigned*)&Bs[m][nn][ks + 2 * q + 8];
                mma_bf16_16816(FP8 ? part[m][j] : acc[m][j], a0, a1, a2, a3, bb0, bb1);
            }
    }
}

template <bool VEC>
struct MmaTile {
    template <class AT, class WT, bool GATED, bool FP8>
    static __device__ __forceinline__ void run(GEMM_TILE_PARAMS)
    {
        constexpr int NB = GATED ? 2 : 1;
        constexpr int PV = vec16_elems<WT>::N;
        constexpr int BK = VEC ? (FP8 ? 2 * M2_BK : M2_BK) : GG_BK;
        constexpr int LD = BK + 8;                                    // 16-byte aligned, conflict-free pitch
        constexpr int VPR = BK / PV;                                  // vectors per B row chunk (VEC)
        constexpr int AV = VEC ? (GG_BM * BK / 8) / MM_THREADS : 1;   // A vectors per thread (VEC)
        constexpr int BV = VEC ? (GG_BN * VPR) / MM_THREADS : 1;      // B vectors per thread per matrix (VEC)
        static_assert(VEC || LD == MM_LD, "mma's pitch");
        static_assert(!VEC || (AV * MM_THREADS == GG_BM * BK / 8 && BV * MM_THREADS == GG_BN * VPR), "vectors split evenly");
        __shared__ __align__(16) bf16_t As[GG_BM][LD];
        __shared__ __align__(16) bf16_t Bs[NB][GG_BN][LD];
        __shared__ int slot[GG_BM];

        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
        const int g = lane >> 2, q = lane & 3;
        const int row0 = blockIdx.x * GG_BM;
        const int n0 = blockIdx.y * GG_BN;
        if (row0 >= *total_padded) return;
        const int e = expert_ids[row0 / block_size];
        if (e < 0 || e >= num_experts) return;
        if (tid < GG_BM) {
            int s = sorted_ids[row0 + tid];
            slot[tid] = (s >= 0 && s < numel) ? s : -1;
        }
        __syncthreads();

        const WT* bm[2] = {b0 + (long long)e * b_estride, (GATED ? b1 : b0) + (long long)e * b_estride};
        const float* sm[2] = {s0, GATED ? s1 : s0};
        const int sc = (K + GG_SCALE_BLOCK - 1) / GG_SCALE_BLOCK;
        float acc[NB][2][4], part[NB][2][4];
        frag_zero(acc);
        frag_zero(part);

        // VEC: A is 16 rows x BK k in vectors of 8 bf16, AV a thread.
        constexpr int VPA = BK / 8;  // A vectors per row
        int as[AV];
        vec16 ra[AV], rb[NB][BV];
        if constexpr (VEC) {
#pragma unroll
            for (int v = 0; v < AV; v++) as[v] = slot[(tid + v * MM_THREADS) / VPA];
            vec_load<MM_THREADS, BK, PV>(ra, rb, as, a, a_div, bm, tid, 0, n0, N, K);
        }
        for (int k0 = 0; k0 < K; k0 += BK) {
            if constexpr (VEC) {
                vec_store<MM_THREADS, BK, PV, FP8>(As, Bs, ra, rb, tid);
                __syncthreads();
                if (k0 + BK < K) vec_load<MM_THREADS, BK, PV>(ra, rb, as, a, a_div, bm, tid, k0 + BK, n0, N, K);  // in flight during the mma below
            } else {
#pragma unroll
                for (int j = 0; j < (GG_BM * GG_BK) / MM_THREADS; j++) {
                    int idx = tid + j * MM_THREADS;
                    int rr = idx / GG_BK, kk = idx % GG_BK, k = k0 + kk;
                    int s = slot[rr];
                    As[rr][kk] = (s >= 0 && k < K) ? a[(long long)(s / a_div) * K + k] : (bf16_t)0;
                }
#pragma unroll
                for (int m = 0; m < NB; m++)
#pragma unroll 4
                    for (int j = 0; j < (GG_BN * GG_BK) / MM_THREADS; j++) {
                        int idx = tid + j * MM_THREADS;
                        int nn = idx / GG_BK, kk = idx % GG_BK, n = n0 + nn, k = k0 + kk;
                        Bs[m][nn][kk] = (n < N && k < K) ? raw_bf16(bm[m], (long long)n * K + k) : (bf16_t)0;
                    }
                __syncthreads();
            }
            mma_tile_k_step<NB, BK, LD, FP8>(As, Bs, acc, part, warp, g, q);
            __syncthreads();
            if (FP8) promote_scale_block<BK>(acc, part, sm, s_estride, e, n0, sc, k0, K);
        }

        mma_store_tile<GATED, 2>(acc[0], acc[NB - 1], slot, n0 + warp * 16, g, q, N, c);
    }
};

GEMM_GATE_UP(moe_gate_up_mma_bf16_bf16, (MM_THREADS), MmaTile<false>::run, bf16_t, bf16_t, false)
GEMM_GATE_UP(moe_gate_up_mma_bf16_fp8, (MM_THREADS), MmaTile<false>::run, bf16_t, e4m3_t, true)
GEMM_DOWN(moe_down_mma_bf16_bf16, (MM_THREADS), MmaTile<false>::run, bf16_t, bf16_t, false)
GEMM_DOWN(moe_down_mma_bf16_fp8, (MM_THREADS), MmaTile<false>::run, bf16_t, e4m3_t, true)

GEMM_GATE_UP(moe_gate_up_mma2_bf16_bf16, (MM_THREADS), MmaTile<true>::run, bf16_t, bf16_t, false)
GEMM_GATE_UP(moe_gate_up_mma2_bf16_fp8, (MM_THREADS), MmaTile<true>::run, bf16_t, e4m3_t, true)
GEMM_DOWN(moe_down_mma2_bf16_bf16, (MM_THREADS), MmaTile<true>::run, bf16_t, bf16_t, false)
GEMM_DOWN(moe_down_mma2_bf16_fp8, (MM_THREADS), MmaTile<true>::run, bf16_t, e4m3_t, true)

// ---------------------------------------------------------------------------
// Tall-tile tensor-core variant ("tall") for many rows per expert: up to 64
// rows (four 16-row sub-blocks of one expert) x 64 columns (gate_up) or 128
// (down) per CTA, 256 threads as 2 x 4 warps of 32 rows x 16 (32) columns,
// K steps of 64 with 16-byte loads prefetched into registers (as mma2),
// fragments through ldmatrix. A staged weight tile feeds 64 rows instead of
// 16, so the weights cross L2 and shared memory a quarter as often as in mma2.
//
// Tiles follow the alignment at 16-row granularity, whatever its block size:
// the grid has one CTA per 16-row sub-block; a CTA works only if its
// sub-block starts a tile, i.e. lies a multiple of 4 sub-blocks after the
// start of its expert's run, and takes up to 3 more sub-blocks of the same
// expert. The others exit at once. Sub-blocks of a tile past its run are
// neither loaded nor multiplied nor written. Grid: x = column tiles, y =
// 16-row sub-blocks (the transpose of the other variants' grid).

#define TT_BM 64
#define TT_THREADS 256

// Expert of 16-row sub-block i (block_size is a multiple of 16).
__device__ __forceinline__ int sub_expert(const int* expert_ids, int i, int block_size)
{
    return expert_ids[(i * 16) / block_size];
}

template <class AT, class WT, bool GATED, bool FP8>
__device__ __forceinline__ void grouped_gemm_tall_tile(GEMM_TILE_PARAMS)
{
    constexpr int NB = GATED ? 2 : 1;
    // Columns per warp: 16 for gate_up (two B matrices), 32 for down, so both
    // run 16 mma per warp per k16 and down reads fewer A fragments per mma
    // (it was bound by shared-memory traffic with 16).
    constexpr int WN = GATED ? 16 : 32;
    constexpr int J = WN / 8;        // n8 tiles per warp
    constexpr int BN = 4 * WN;       // CTA columns (inside one 128-wide scale block)
    constexpr int PV = vec16_elems<WT>::N;
    constexpr int VPR = M2_BK / PV;                    // vectors per B row chunk
    constexpr int BV = (BN * VPR) / TT_THREADS;     // B vectors per thread per matrix
    constexpr int AV = (TT_BM * M2_BK / 8) / TT_THREADS;  // A vectors per thread
    static_assert(BV >= 1 && AV >= 1, "tile too small for the thread count");
    __shared__ __align__(16) bf16_t As[TT_BM][M2_LD];
    __shared__ __align__(16) bf16_t Bs[NB][BN][M2_LD];
    __shared__ int slot[TT_BM];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    // Column tiles vary fastest in the grid (blockIdx.x), so the CTAs of one
    // row tile run together and its gathered A rows (x or inter, too large
    // for L2 at large T) are read from HBM about once, not once per sweep of
    // the rows; the row tiles of one expert are adjacent in y, so its weight
    // tiles are still shared through L2.
    const int sb = blockIdx.y;  // 16-row sub-block
    const int total = *total_padded;
    if (sb * 16 >= total) return;
    const int e = sub_expert(expert_ids, sb, block_size);
    if (e < 0 || e >= num_experts) return;
    // Start of this expert's run: each warp scans back 32 sub-blocks at a time.
    int start = 0;
    for (int base = sb;; base -= 32) {
        int j = base - 1 - lane;
        bool diff = j < 0 || sub_expert(expert_ids, j, block_size) != e;
        unsigned m = __ballot_sync(0xffffffffu, diff);
        if (m) {
            start = base - (__ffs(m) - 1);
            break;
        }
    }
    if ((sb - start) % 4 != 0) return;  // uniform across the CTA
    int nsub = 1;
    while (nsub < 4 && (sb + nsub) * 16 < total && sub_expert(expert_ids, sb + nsub, block_size) == e) nsub++;
    const int row0 = sb * 16;
    const int n0 = blockIdx.x * BN;
    if (tid < TT_BM) {
        int s = tid / 16 < nsub ? sorted_ids[row0 + tid] : -1;
        slot[tid] = (s >= 0 && s < numel) ? s : -1;
    }
    __syncthreads();

    const WT* bm[2] = {b0 + (long long)e * b_estride, (GATED ? b1 : b0) + (long long)e * b_estride};
    const float* sm[2] = {s0, GATED ? s1 : s0};
    const int sc = (K + GG_SCALE_BLOCK - 1) / GG_SCALE_BLOCK;
    float acc[NB][2][J][4], part[NB][2][J][4];
    frag_zero(acc);
    frag_zero(part);
    const bool mt_on[2] = {2 * wm < nsub, 2 * wm + 1 < nsub};  // warp-uniform

    int aslot[AV];
#pragma unroll
    for (int v = 0; v < AV; v++) aslot[v] = slot[(tid + v * TT_THREADS) / 8];
    vec16 ra[AV], rb[NB][BV];
    vec_load<TT_THREADS, M2_BK, PV>(ra, rb, aslot, a, a_div, bm, tid, 0, n0, N, K);
    for (int k0 = 0; k0 < K; k0 += M2_BK) {
        vec_store<TT_THREADS, M2_BK, PV, FP8>(As, Bs, ra, rb, tid);
        __syncthreads();
        if (k0 + M2_BK < K) vec_load<TT_THREADS, M2_BK, PV>(ra, rb, aslot, a, a_div, bm, tid, k0 + M2_BK, n0, N, K);  // in flight during the mma below
#pragma unroll
        for (int ks = 0; ks < M2_BK; ks += 16) {
            unsigned bf[NB][2 * J];
#pragma unroll
            for (int m = 0; m < NB; m++)
#pragma unroll
                for (int h = 0; h < J / 2; h++)
                    ldmatrix_x4(&bf[m][4 * h],
                                &Bs[m][wn * WN + 16 * h + (lane & 7) + ((lane >> 4) << 3)][ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
            for (int t = 0; t < 2; t++) {
                if (!mt_on[t]) continue;
                unsigned af[4];
                ldmatrix_x4(af, &As[wm * 32 + t * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
                for (int m = 0; m < NB; m++)
#pragma unroll
                    for (int j = 0; j < J; j++)
                        mma_bf16_16816(FP8 ? part[m][t][j] : acc[m][t][j], af[0], af[1], af[2], af[3],
                                       bf[m][2 * j], bf[m][2 * j + 1]);
            }
        }
        __syncthreads();
        if (FP8) promote_scale_block<M2_BK>(acc, part, sm, s_estride, e, n0, sc, k0, K);
    }

    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int t = 0; t < 2; t++)
        mma_store_tile<GATED, J>(acc[0][t], acc[NB - 1][t], slot + wm * 32 + t * 16, n0 + wn * WN, g, q, N, c);
}

GEMM_GATE_UP(moe_gate_up_tall_bf16_bf16, (TT_THREADS, 2), grouped_gemm_tall_tile, bf16_t, bf16_t, false)
GEMM_GATE_UP(moe_gate_up_tall_bf16_fp8, (TT_THREADS, 2), grouped_gemm_tall_tile, bf16_t, e4m3_t, true)
GEMM_DOWN(moe_down_tall_bf16_bf16, (TT_THREADS, 2), grouped_gemm_tall_tile, bf16_t, bf16_t, false)
GEMM_DOWN(moe_down_tall_bf16_fp8, (TT_THREADS, 2), grouped_gemm_tall_tile, bf16_t, e4m3_t, true)

// ---------------------------------------------------------------------------
// Pipelined variant of mma2 for bf16 weights ("mma3"), for few rows per
// expert (T <= ~128 at DeepSeek-V3 shapes), where the grouped GEMM only has
// to stream the touched experts' weights from HBM. Nsight Compute had mma2 at
// ~85% of DRAM bandwidth with ~70% of warp stalls waiting on global loads:
// each thread holds one K step (64) of loads in registers, issued only after
// the previous step reached shared memory, so an SM keeps too few weight
// bytes in flight. Here every 16-byte copy goes global -> shared with
// cp.async.cg (L2 only: the weights are read once) into a ring of STAGES
// stages of one K step each, and up to STAGES - 1 steps are in flight while
// the warps multiply the oldest one; each copy asks L2 to fetch 256 bytes
// (M3_L2_PREFETCH), which is what brought HBM to the Triton peer's rate.
//
// The arithmetic is mma2's: 16 rows a CTA, 128 threads, warp w owns columns
// w BN/4 .. (w+1) BN/4 - 1 of each B matrix (BN = 64 for gate_up, each of gate
// and up; M3_BN_DOWN for down), and every accumulator takes its k16 products
// in increasing k over zero-padded K steps (K % 8 == 0). The fragments hold
// the same values (ldmatrix instead of 32-bit loads) and the padding adds
// exact zeros, so the outputs are bit-identical to mma2's whatever the tile
// width or K step; the kernels take mma2's parameter list (the fp8 scale
// arguments are unused: bf16 weights only). Stage layout in dynamic shared
// memory: A [16][M3_BK] then B [NB][BN][M3_BK] bf16, rows of 2 M3_BK bytes
// whose 16-byte chunk c sits at chunk c ^ (row & 7) (swizzled_chunk).
// Shared memory a CTA: STAGES x (16 + NB BN) x 2 M3_BK bytes
// (kernels/grouped_gemm.go, mma3SmemBytes).
//
// Grid: x = column tiles, y = 16-row blocks (the transpose of mma2's), so
// the CTAs that run together cover all column tiles of a few row blocks,
// i.e. stream a few experts' weight matrices end to end, as the Triton
// peer's program order does; mma2's order (every expert's same column tile
// at once) ran 3% slower at T = 128 (kernels/GEMM_NOTES.md).

// Ring depths, K steps of M3_BK. 5 x 18 KiB for gate_up and 8 x 10 KiB for
// down: 2 CTAs an SM for each on sm_90, 8 and 14 K steps in flight an SM.
// H100, T = 128, with the grid order above: 0.3% faster than 4 / 4 (3 and 5
// CTAs an SM; kernels/GEMM_NOTES.md).
#ifndef M3_STAGES_GATE_UP
#define M3_STAGES_GATE_UP 5
#endif
#ifndef M3_STAGES_DOWN
#define M3_STAGES_DOWN 8
#endif
// Output columns a down CTA (64 or 128; gate_up: 64 of gate and 64 of up).
// 128 measured no faster.
#ifndef M3_BN_DOWN
#define M3_BN_DOWN 64
#endif
// K a stage (64 or 128). 128 (256-byte copies a row) measured no faster
// than 64 with the 256-byte L2 prefetch below.
#ifndef M3_BK
#define M3_BK 64
#endif
// L2 prefetch of the copies, bytes (cp_async16). A stage holds 128 bytes of
// each row; with 256 each miss also brings the row's next 128 bytes (the
// next K step) into L2, so HBM serves 256-byte runs of each weight row, as a
// K step of 128 would. H100, T = 128: grouped GEMM 7754 -> 7329 us
// (kernels/GEMM_NOTES.md); deeper rings without it gained 1-2% at most.
#ifndef M3_L2_PREFETCH
#define M3_L2_PREFETCH 256
#endif

template <class AT, class WT, bool GATED, bool FP8>
__device__ __forceinline__ void grouped_gemm_mma3_tile(GEMM_TILE_PARAMS)
{
    static_assert(!FP8, "bf16 weights only (the scale arguments are unused)");
    // Ring depth and output columns: gate_up tiles of GG_BN gate and up columns, down tiles of M3_BN_DOWN.
    constexpr int STAGES = GATED ? M3_STAGES_GATE_UP : M3_STAGES_DOWN;
    constexpr int BN = GATED ? GG_BN : M3_BN_DOWN;
    constexpr int NB = GATED ? 2 : 1;
    constexpr int CPR = M3_BK / 8;              // 16-byte chunks a row
    constexpr int A_BYTES = GG_BM * M3_BK * 2;
    constexpr int B_BYTES = BN * M3_BK * 2;     // a matrix
    constexpr int STAGE_BYTES = A_BYTES + NB * B_BYTES;
    constexpr int AV = GG_BM * CPR / MM_THREADS;  // A chunks a thread
    constexpr int BV = BN * CPR / MM_THREADS;     // B chunks a thread a matrix
    constexpr int WN = BN / 4;                    // columns a warp
    constexpr int J = WN / 8;                     // n8 tiles a warp
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert(M3_BK == 64 || M3_BK == 128, "K step of 64 or 128");
    static_assert(AV >= 1 && AV * MM_THREADS == GG_BM * CPR, "A chunks split evenly");
    static_assert(BV >= 1 && BV * MM_THREADS == BN * CPR, "B chunks split evenly");
    static_assert(J >= 2 && J % 2 == 0, "pairs of n8 tiles a warp");
    extern __shared__ __align__(128) unsigned char m3_smem[];
    __shared__ int slot[GG_BM];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.y * GG_BM;
    const int n0 = blockIdx.x * BN;
    if (row0 >= *total_padded) return;
    const int e = expert_ids[row0 / block_size];
    if (e < 0 || e >= num_experts) return;
    if (tid < GG_BM) {
        int s = sorted_ids[row0 + tid];
        slot[tid] = (s >= 0 && s < numel) ? s : -1;
    }
    __syncthreads();

    const WT* bm[2] = {b0 + (long long)e * b_estride, (GATED ? b1 : b0) + (long long)e * b_estride};
    float acc[NB][J][4];
    frag_zero(acc);

    // This thread copies chunk (tid + v 128) % CPR of A row (tid + v 128) / CPR,
    // and likewise of B rows.
    int as[AV];
    const AT* arow[AV];
#pragma unroll
    for (int v = 0; v < AV; v++) {
        as[v] = slot[(tid + v * MM_THREADS) / CPR];
        arow[v] = a + (long long)(as[v] >= 0 ? as[v] / a_div : 0) * K;
    }
    const unsigned sbase = (unsigned)__cvta_generic_to_shared(m3_smem);
    const int nk = (K + M3_BK - 1) / M3_BK;
    // Queue K step kt into its stage; one commit group per step, empty past
    // the end, so the wait below always counts the same number of groups.
    auto load = [&](int kt) {
        if (kt < nk) {
            const unsigned st = sbase + (unsigned)((kt % STAGES) * STAGE_BYTES);
#pragma unroll
            for (int v = 0; v < AV; v++) {
                const int idx = tid + v * MM_THREADS, r = idx / CPR, c = idx % CPR;
                const int k = kt * M3_BK + c * 8;
                const bool in = k < K && as[v] >= 0;
                cp_async16<M3_L2_PREFETCH>(st + swizzled_chunk<2 * M3_BK>(r, c), in ? (const void*)(arow[v] + k) : (const void*)a, in);
            }
#pragma unroll
            for (int m = 0; m < NB; m++)
#pragma unroll
                for (int j = 0; j < BV; j++) {
                    const int idx = tid + j * MM_THREADS, nn = idx / CPR, c = idx % CPR;
                    const int k = kt * M3_BK + c * 8, n = n0 + nn;
                    const bool in = k < K && n < N;
                    cp_async16<M3_L2_PREFETCH>(st + A_BYTES + m * B_BYTES + swizzled_chunk<2 * M3_BK>(nn, c),
                                               in ? (const void*)(bm[m] + (long long)n * K + k) : (const void*)bm[m], in);
                }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) load(s);

    for (int kt = 0; kt < nk; kt++) {
        // Step kt has landed (at most STAGES - 2 younger groups pending), and
        // after the barrier every warp is done with step kt - 1, whose stage
        // the next copies overwrite.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        load(kt + STAGES - 1);
        const unsigned st = sbase + (unsigned)((kt % STAGES) * STAGE_BYTES);
#pragma unroll
        for (int ks = 0; ks < M3_BK / 16; ks++) {
            unsigned af[4];
            ldmatrix_x4(af, st + swizzled_chunk<2 * M3_BK>(lane & 15, 2 * ks + (lane >> 4)));
#pragma unroll
            for (int m = 0; m < NB; m++)
#pragma unroll
                for (int h = 0; h < J / 2; h++) {
                    // bf: (n8 tile 2h: k 0-7, 8-15), (n8 tile 2h+1: k 0-7, 8-15).
                    unsigned bf[4];
                    ldmatrix_x4(bf, st + A_BYTES + m * B_BYTES +
                                        swizzled_chunk<2 * M3_BK>(warp * WN + 16 * h + (lane & 7) + ((lane >> 4) << 3),
                                                                  2 * ks + ((lane >> 3) & 1)));
                    mma_bf16_16816(acc[m][2 * h], af[0], af[1], af[2], af[3], bf[0], bf[1]);
                    mma_bf16_16816(acc[m][2 * h + 1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
                }
        }
    }
    cp_async_wait<0>();  // only empty groups remain; leave none behind

    mma_store_tile<GATED, J>(acc[0], acc[NB - 1], slot, n0 + warp * WN, g, q, N, c);
}

GEMM_GATE_UP(moe_gate_up_mma3_bf16_bf16, (MM_THREADS), grouped_gemm_mma3_tile, bf16_t, bf16_t, false)
GEMM_DOWN(moe_down_mma3_bf16_bf16, (MM_THREADS), grouped_gemm_mma3_tile, bf16_t, bf16_t, false)
