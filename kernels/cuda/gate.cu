// Fused MoE gate: router logits f32 [T,E] -> top-k expert ids, slot weights
// and the contract's shared slots, one CTA per token, f32 throughout.
//
// CPU twin: moe.Route + moe.FusedSlots. It is matched bit for bit where the
// twin's arithmetic allows: the sigmoid is computed in double and rounded to
// f32 as the twin does, group scores and renormalisation add in the twin's
// order, ties go to the lower index and NaN ranks last. The only reordered
// sum is the softmax denominator (a double tree sum).
//
// Any expert count up to GATE_MAX_EXPERTS, powers of two or not (Kimi-K2 384,
// a 264-expert bank), and up to GATE_BLOCK_MAX_EXPERTS in moe_gate_f32 (Kimi
// K3's 896; one CTA a token holds its scores in 18 bytes an expert of
// shared memory, which four tokens a CTA could not at that size); any
// n_group dividing E; any topk_group. Scorings:
// sigmoid, softmax and sqrt(softplus) (kernels/gate.go, gateBlockScorings);
// any other code traps.
#include <stddef.h>
#include <stdint.h>
#include "gate_common.cuh"

#define GATE_THREADS 256
#define GATE_WARPS (GATE_THREADS / 32)
#define GATE_BLOCK_MAX_EXPERTS 1024

// better reports whether candidate (a, ai) ranks before (b, bi): higher
// score first, ties to the lower index, NaN below every number, index -1
// ("no candidate") below everything.
__device__ __forceinline__ bool better(float a, int ai, float b, int bi) {
    if (ai < 0) return false;
    if (bi < 0) return true;
    bool an = a != a, bn = b != b;
    if (an && bn) return ai < bi;
    if (an) return false;
    if (bn) return true;
    if (a != b) return a > b;
    return ai < bi;
}

// warp_best leaves the best of the warp's candidates (bv, bi) in every lane
// (a butterfly of better()).
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

// warp_argmax returns the best selectable index (ok[i] != 0) of v[i] for i =
// first, first + stride, ... < n over the warp's lanes (each lane its own
// first), or -1, in every lane; bv gets its value. Step is stride's type:
// blockDim.x steps in unsigned arithmetic and a warp's 32 in int, and that
// decides what the compiler may assume (and unroll) about the loop.
template <class Step>
__device__ __forceinline__ int warp_argmax(const float* v, const unsigned char* ok, int n, int first, Step stride, float& bv) {
    bv = 0.f;
    int bi = -1;
    for (int i = first; i < n; i += stride) {
        if (ok[i] && better(v[i], i, bv, bi)) {
            bv = v[i];
            bi = i;
        }
    }
    warp_best(bv, bi);
    return bi;
}

// The steps both kernels share, over a token's shared-memory state sh
// (GateShared or WarpShared) with the thread taking items first, first +
// stride, ... (stride: blockDim.x, or 32).

// Group scores over sh.choice (groups of gs): a group's best member
// (group_by_max, or no second member), else the sum of its best two; every
// group selectable.
template <class Sh, class Step>
__device__ __forceinline__ void gate_group_scores(Sh& sh, int n_group, int gs, int group_by_max, int first, Step stride) {
    for (int g = first; g < n_group; g += stride) {
        float b1 = 0.f, b2 = 0.f;
        int i1 = -1, i2 = -1;
        for (int j = 0; j < gs; j++) {
            int idx = g * gs + j;
            float v = sh.choice[idx];
            if (better(v, idx, b1, i1)) {
                b2 = b1; i2 = i1;
                b1 = v; i1 = idx;
            } else if (better(v, idx, b2, i2)) {
                b2 = v; i2 = idx;
            }
        }
        sh.gscore[g] = (group_by_max || i2 < 0) ? b1 : b1 + b2;
        sh.gok[g] = 1;
    }
}

// Token t's outputs, by one thread: the top-k ids in rank order with their
// scores as weights (divided by their f32 sum + 1e-20 when renorm), then the
// S shared slots E + (t mod R) S + s with shared_weight.
template <class Sh>
__device__ __forceinline__ void gate_write_token(const Sh& sh, int32_t* ids, float* weights, int t, int E, int topk,
                                                 int renorm, int S, int R, float shared_weight) {
    const int K = topk + S;
    int32_t* oid = ids + (size_t)t * K;
    float* ow = weights + (size_t)t * K;
    float sum = 0.f;
    for (int r = 0; r < topk; r++) {
        int id = sh.ids[r];
        float w = id >= 0 ? sh.score[id] : 0.f;
        oid[r] = id;
        ow[r] = w;
        sum += w;
    }
    if (renorm) {
        float den = sum + 1e-20f;
        for (int r = 0; r < topk; r++) ow[r] = ow[r] / den;
    }
    for (int s = 0; s < S; s++) {
        oid[topk + s] = E + (t % R) * S + s;
        ow[topk + s] = shared_weight;
    }
}

struct GateShared {
    float score[GATE_BLOCK_MAX_EXPERTS];   // sigmoid or softmax probability
    float choice[GATE_BLOCK_MAX_EXPERTS];  // score + correction bias: what top-k ranks
    unsigned char ok[GATE_BLOCK_MAX_EXPERTS];
    float gscore[GATE_BLOCK_MAX_EXPERTS];
    unsigned char gok[GATE_BLOCK_MAX_EXPERTS];
    int ids[GATE_BLOCK_MAX_EXPERTS];
    float red_v[GATE_WARPS];
    int red_i[GATE_WARPS + 1];
    double red_d[GATE_WARPS + 1];
};

// block_argmax returns the best selectable index of v[0,n) (ok[i] != 0), or
// -1; every thread gets the result. Ends with a barrier.
__device__ int block_argmax(const float* v, const unsigned char* ok, int n, GateShared& sh) {
    float bv;
    int bi = warp_argmax(v, ok, n, threadIdx.x, blockDim.x, bv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sh.red_v[warp] = bv;
        sh.red_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        bv = lane < nw ? sh.red_v[lane] : 0.f;
        bi = lane < nw ? sh.red_i[lane] : -1;
        warp_best(bv, bi);
        if (lane == 0) sh.red_i[GATE_WARPS] = bi;
    }
    __syncthreads();
    int r = sh.red_i[GATE_WARPS];
    __syncthreads();
    return r;
}

// block_max_nan is the max of v over the block, NaN if any v is NaN (max_nan).
__device__ float block_max_nan(float v, GateShared& sh) {
    for (int off = 16; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh.red_v[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        v = lane < nw ? sh.red_v[lane] : -__int_as_float(0x7f800000);
        for (int off = 16; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) sh.red_v[0] = v;
    }
    __syncthreads();
    float r = sh.red_v[0];
    __syncthreads();
    return r;
}

__device__ double block_sum_d(double v, GateShared& sh) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh.red_d[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        v = lane < nw ? sh.red_d[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) sh.red_d[GATE_WARPS] = v;
    }
    __syncthreads();
    double r = sh.red_d[GATE_WARPS];
    __syncthreads();
    return r;
}

// The scores of token t's logits row (E of them) into sh.score and
// sh.choice (what top-k ranks): per-expert scorings score each logit
// (sig_score) and add the correction bias to choice; softmax divides by the
// sum of exp(l - max) over the row, reduced over the CTA (BLOCK: sh is a
// GateShared) or the warp; any other code traps.
template <bool BLOCK, class Sh, class Step>
__device__ __forceinline__ void gate_scores(Sh& sh, const float* row, const float* bias, int scoring, int E, int first,
                                            Step stride) {
    if (scoring_per_expert(scoring)) {
        for (int i = first; i < E; i += stride) {
            float s = sig_score(scoring, row[i]);
            sh.score[i] = s;
            sh.choice[i] = bias ? s + bias[i] : s;
        }
    } else if (scoring == SCORING_SOFTMAX) {
        float m = -__int_as_float(0x7f800000);
        for (int i = first; i < E; i += stride) m = max_nan(m, row[i]);
        double md, sum = 0.0;
        if constexpr (BLOCK) {
            md = (double)block_max_nan(m, sh);
            double part = 0.0;
            for (int i = first; i < E; i += stride) part += exp((double)row[i] - md);
            sum = block_sum_d(part, sh);
        } else {
            for (int off = 16; off > 0; off >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, off));
            md = (double)m;
            for (int i = first; i < E; i += stride) sum += exp((double)row[i] - md);
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        }
        for (int i = first; i < E; i += stride) {
            float p = (float)(exp((double)row[i] - md) / sum);
            sh.score[i] = p;
            sh.choice[i] = p;
        }
    } else {
        __trap();  // not a scoring of these kernels (GateSpec.Check refuses it)
    }
}

// moe_gate_f32: grid T, block GATE_THREADS.
//   logits [T,E]; bias [E] or null; ids/weights [T, topk+S]; choice [T,E] or
//   null (the ranked scores, for tie-robust comparisons).
//   scoring: SCORING_SIGMOID (+ bias), SCORING_SOFTMAX, SCORING_SQRTSOFTPLUS
//   (+ bias). Groups are used when n_group > 1 and topk_group < n_group;
//   group_by_max scores a group by its best member, otherwise by the sum of
//   its best two.
//   Shared slot s of token t is expert E + (t mod R)*S + s with weight
//   shared_weight. Routed weights carry no routed scaling factor.
extern "C" __global__ void __launch_bounds__(GATE_THREADS)
moe_gate_f32(const float* __restrict__ logits, const float* __restrict__ bias,
             int32_t* __restrict__ ids, float* __restrict__ weights, float* __restrict__ choice_out,
             int T, int E, int topk, int n_group, int topk_group, int scoring, int group_by_max,
             int renorm, int S, int R, float shared_weight) {
    __shared__ GateShared sh;
    const int t = blockIdx.x;
    if (t >= T) return;
    const float* row = logits + (size_t)t * E;

    gate_scores<true>(sh, row, bias, scoring, E, threadIdx.x, blockDim.x);

    const bool grouped = n_group > 1 && topk_group < n_group;
    for (int i = threadIdx.x; i < E; i += blockDim.x) sh.ok[i] = grouped ? 0 : 1;
    __syncthreads();

    if (grouped) {
        const int gs = E / n_group;
        gate_group_scores(sh, n_group, gs, group_by_max, threadIdx.x, blockDim.x);
        __syncthreads();
        for (int r = 0; r < topk_group; r++) {
            int g = block_argmax(sh.gscore, sh.gok, n_group, sh);
            if (g >= 0) {
                if (threadIdx.x == 0) sh.gok[g] = 0;
                for (int j = threadIdx.x; j < gs; j += blockDim.x) sh.ok[g * gs + j] = 1;
            }
            __syncthreads();
        }
    }

    for (int r = 0; r < topk; r++) {
        int id = block_argmax(sh.choice, sh.ok, E, sh);
        if (threadIdx.x == 0) {
            sh.ids[r] = id;
            if (id >= 0) sh.ok[id] = 0;
        }
        __syncthreads();
    }

    if (choice_out) {
        float* c = choice_out + (size_t)t * E;
        for (int i = threadIdx.x; i < E; i += blockDim.x) c[i] = sh.choice[i];
    }
    if (threadIdx.x == 0) gate_write_token(sh, ids, weights, t, E, topk, renorm, S, R, shared_weight);
}

// ---------------------------------------------------------------------------
// moe_gate_f32_warp: the same gate with one warp per token and
// GATE_WARP_TOKENS tokens per CTA. Each selection is a warp shuffle
// reduction with no CTA barrier, which cuts the per-token latency of the k
// serial selections (the CTA version pays four barriers per selection).
// Same comparisons and sums as moe_gate_f32, except the softmax denominator's
// order (a warp butterfly sum, identical in every lane).

#define GATE_WARP_TOKENS 4

struct WarpShared {
    float score[GATE_MAX_EXPERTS];
    float choice[GATE_MAX_EXPERTS];
    float gscore[GATE_MAX_EXPERTS];
    int ids[GATE_MAX_EXPERTS];
    unsigned char ok[GATE_MAX_EXPERTS];
    unsigned char gok[GATE_MAX_EXPERTS];
};

extern "C" __global__ void __launch_bounds__(GATE_WARP_TOKENS * 32)
moe_gate_f32_warp(const float* __restrict__ logits, const float* __restrict__ bias,
                  int32_t* __restrict__ ids, float* __restrict__ weights, float* __restrict__ choice_out,
                  int T, int E, int topk, int n_group, int topk_group, int scoring, int group_by_max,
                  int renorm, int S, int R, float shared_weight) {
    __shared__ WarpShared shs[GATE_WARP_TOKENS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * GATE_WARP_TOKENS + warp;
    if (t >= T) return;
    WarpShared& sh = shs[warp];
    const float* row = logits + (size_t)t * E;

    gate_scores<false>(sh, row, bias, scoring, E, lane, 32);

    const bool grouped = n_group > 1 && topk_group < n_group;
    for (int i = lane; i < E; i += 32) sh.ok[i] = grouped ? 0 : 1;
    __syncwarp();

    float unused;
    if (grouped) {
        const int gs = E / n_group;
        gate_group_scores(sh, n_group, gs, group_by_max, lane, 32);
        __syncwarp();
        for (int r = 0; r < topk_group; r++) {
            int g = warp_argmax(sh.gscore, sh.gok, n_group, lane, 32, unused);
            __syncwarp();
            if (g >= 0) {
                if (lane == 0) sh.gok[g] = 0;
                for (int j = lane; j < gs; j += 32) sh.ok[g * gs + j] = 1;
            }
            __syncwarp();
        }
    }

    for (int r = 0; r < topk; r++) {
        int id = warp_argmax(sh.choice, sh.ok, E, lane, 32, unused);
        __syncwarp();
        if (lane == 0) {
            sh.ids[r] = id;
            if (id >= 0) sh.ok[id] = 0;
        }
        __syncwarp();
    }

    if (choice_out) {
        float* c = choice_out + (size_t)t * E;
        for (int i = lane; i < E; i += 32) c[i] = sh.choice[i];
    }
    if (lane == 0) gate_write_token(sh, ids, weights, t, E, topk, renorm, S, R, shared_weight);
}
