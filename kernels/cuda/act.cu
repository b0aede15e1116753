// Elementwise companions of the grouped GEMM for experts its fused SwiGLU
// epilogue does not cover: per-expert biases and gated activations other
// than silu(g) * u (gpt-oss's clamped SwiGLU with alpha and an up offset,
// DeepSeek-V4's clamp), and a router's own logit bias (gpt-oss).
//
// The rows they touch are walked the way the GEMM walks them: padded row p
// of moe_align_block_size's output holds slot s = sorted_ids[p] (the
// sentinel numel for padding) of expert expert_ids[p / block_size].
//
// CPU twins: moe.Activate (biases added in f32, the activation in double
// as layout.Activation.Apply, rounded once) and moe.AddRowBias.
#include "numeric.cuh"

// sorted_slot returns the slot and expert of padded row p, or -1 for a
// padding row, a row past the used length or another rank's expert.
__device__ __forceinline__ int sorted_slot(const int* sorted_ids, const int* expert_ids, const int* total_padded,
                                           int p, int numel, int block_size, int num_experts, int* e) {
    if (p >= *total_padded) return -1;
    const int s = sorted_ids[p];
    if (s < 0 || s >= numel) return -1;
    *e = expert_ids[p / block_size];
    if (*e < 0 || *e >= num_experts) return -1;
    return s;
}

// Activation modes (layout.Activation; kernels.ActMode):
//   ACT_CLAMP_BEFORE: act(g, u) = g' * sigmoid(alpha g') * (u' + up_offset),
//     g' = min(g, limit), u' = clamp(u, -limit, limit) when limit > 0
//     (SwiGLU, gpt-oss, DeepSeek-V4);
//   ACT_CLAMP_AFTER: act(g, u) = min(g * sigmoid(alpha g), limit) * (u' + up_offset)
//     (Step-3.7: the limit caps the activated gate);
//   ACT_GELU_TANH: act(g, u) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u
//     (Gemma 4's GeGLU; alpha, limit and up_offset are 1, 0, 0);
//   ACT_RELU2: act(u) = max(u, 0)^2, ungated experts (Nemotron-H): gate is
//     not read (the launch layer runs no gate GEMM) and may be garbage;
//   ACT_SITU: act(g, u) = beta tanh(g / beta) sigmoid(g) * u', u' =
//     linear_beta tanh(u / linear_beta), or u where linear_beta is 0 (Kimi
//     K3's SiTU; alpha, limit and up_offset are 1, 0, 0). In double, like
//     the others, as moe.SiTU computes it.
#define ACT_CLAMP_BEFORE 0
#define ACT_CLAMP_AFTER 1
#define ACT_GELU_TANH 2
#define ACT_RELU2 3
#define ACT_SITU 4
template <class OT>
__device__ __forceinline__ void act_rows(const int* sorted_ids, const int* expert_ids, const int* total_padded,
                                         const float* gate, const float* up, const float* gate_bias,
                                         const float* up_bias, OT* inter, int numel, int I, int block_size,
                                         int num_experts, double alpha, double limit, double up_offset, int mode,
                                         double beta, double linear_beta) {
    int e = 0;
    const int s = sorted_slot(sorted_ids, expert_ids, total_padded, blockIdx.x, numel, block_size, num_experts, &e);
    if (s < 0) return;
    for (int n = threadIdx.x; n < I; n += blockDim.x) {
        const long long i = (long long)s * I + n;
        float u = up[i];
        if (up_bias != nullptr) u = __fadd_rn(u, up_bias[(long long)e * I + n]);
        if (mode == ACT_RELU2) {
            // torch's square(relu(u)) in float32: one correctly rounded
            // product (a NaN stays NaN, as relu keeps it)
            const float r = u < 0.0f ? 0.0f : u;
            st_val(inter, i, __fmul_rn(r, r));
            continue;
        }
        float g = gate[i];
        if (gate_bias != nullptr) g = __fadd_rn(g, gate_bias[(long long)e * I + n]);
        double gd = (double)g, ud = (double)u, a;
        if (mode == ACT_SITU) {
            if (linear_beta != 0.0) ud = linear_beta * tanh(ud / linear_beta);
            a = beta * tanh(gd / beta) / (1.0 + exp(-gd));
        } else if (mode == ACT_GELU_TANH) {
            a = 0.5 * gd * (1.0 + tanh(0.7978845608028654 * (gd + 0.044715 * gd * gd * gd)));
        } else if (mode == ACT_CLAMP_AFTER) {
            a = gd / (1.0 + exp(-alpha * gd));
            if (limit > 0.0) {
                a = fmin(a, limit);
                ud = fmax(-limit, fmin(ud, limit));
            }
        } else {
            if (limit > 0.0) {
                gd = fmin(gd, limit);
                ud = fmax(-limit, fmin(ud, limit));
            }
            a = gd / (1.0 + exp(-alpha * gd));
        }
        st_val(inter, i, (float)(a * (ud + up_offset)));
    }
}

// moe_act_{f32,bf16}: grid = padded rows, block 128. gate and up [numel, I]
// f32 (moe_proj_* outputs), biases [E, I] or null, inter [numel, I]; beta
// and linear_beta are ACT_SITU's (read in that mode alone).
#define MOE_ACT(NAME, OT)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                        \
        const int* sorted_ids, const int* expert_ids, const int* total_padded, const float* gate,  \
        const float* up, const float* gate_bias, const float* up_bias, OT* inter, int numel, int I, \
        int block_size, int num_experts, double alpha, double limit, double up_offset, int mode,   \
        double beta, double linear_beta)                                                           \
    {                                                                                              \
        act_rows<OT>(sorted_ids, expert_ids, total_padded, gate, up, gate_bias, up_bias, inter,    \
                     numel, I, block_size, num_experts, alpha, limit, up_offset, mode, beta,       \
                     linear_beta);                                                                 \
    }
MOE_ACT(moe_act_f32, float)
MOE_ACT(moe_act_bf16, bf16_t)

// moe_down_bias: grid = padded rows, block 128: out[s, n] += bias[e, n],
// out [numel, H] f32 (moe_down_* output), bias [E, H].
extern "C" __global__ void __launch_bounds__(128)
moe_down_bias(const int* sorted_ids, const int* expert_ids, const int* total_padded, float* out,
              const float* bias, int numel, int H, int block_size, int num_experts) {
    int e = 0;
    const int s = sorted_slot(sorted_ids, expert_ids, total_padded, blockIdx.x, numel, block_size, num_experts, &e);
    if (s < 0) return;
    for (int n = threadIdx.x; n < H; n += blockDim.x)
        out[(long long)s * H + n] = __fadd_rn(out[(long long)s * H + n], bias[(long long)e * H + n]);
}

// add_bias_rows: grid = rows, block 128: m[r, c] += bias[c] (a router's
// logits plus its own bias, gpt-oss's F.linear(x, W, b)).
extern "C" __global__ void __launch_bounds__(128)
add_bias_rows(float* m, const float* bias, int rows, int cols) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        m[(long long)r * cols + c] = __fadd_rn(m[(long long)r * cols + c], bias[c]);
}

// scale_by_expert: grid = ceil(n / 128), block 128: w[i] *= scale[ids[i]]
// for the n slots whose id is a routed expert (0 <= id < num_experts; a
// fused shared slot's id is past them and keeps its weight): Gemma 4's
// per_expert_scale, applied to the gate's renormalised top-k weights.
// CPU twin: moe.ScaleByExpert.
extern "C" __global__ void __launch_bounds__(128)
scale_by_expert(float* w, const int* ids, const float* scale, int n, int num_experts) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int e = ids[i];
    if (e >= 0 && e < num_experts) w[i] = __fmul_rn(w[i], scale[e]);
}

// moe_identity_rows: grid = padded rows, block 128: out[s, :] = x[s / topk, :]
// for every slot s of the experts lo..hi-1 (LongCat-Flash's zero-compute
// identity experts, past the bank, whose blocks the grouped GEMM leaves
// alone as another rank's), x f32 [T, H], out f32 [numel, H]; Finalize
// then weights them like any slot. CPU twin: moe.IdentityRows.
extern "C" __global__ void __launch_bounds__(128)
moe_identity_rows(const int* sorted_ids, const int* expert_ids, const int* total_padded, const float* x, float* out,
                  int numel, int topk, int H, int block_size, int lo, int hi) {
    const int p = blockIdx.x;
    if (p >= *total_padded) return;
    const int s = sorted_ids[p];
    if (s < 0 || s >= numel) return;
    const int e = expert_ids[p / block_size];
    if (e < lo || e >= hi) return;
    const long long tok = s / topk;
    for (int n = threadIdx.x; n < H; n += blockDim.x) out[(long long)s * H + n] = x[tok * H + n];
}
