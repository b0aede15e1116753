// Fused MoE gate, register-resident variant (its own module: see gate.go).
// CPU twin: moe.Route + moe.FusedSlots, matched as gate.cu's kernels match
// it. Every moe scoring (gate_common.cuh); any other code traps.
#include <stddef.h>
#include <stdint.h>
#include "gate_common.cuh"

// ---------------------------------------------------------------------------
// moe_gate_f32_reg{4,8,16}: one warp per token, the token's scores held in
// registers (lane l owns experts l + 32j, j < NPL, so E <= 32*NPL). Each of
// the k serial selections is two warp reductions (redux.sync: the largest
// order-preserving key, then the lowest index holding it) instead of a
// shared-memory scan plus a shuffle tree. Keys order exactly as better():
// higher score first, NaN below every number, "no candidate" (key 0) below
// NaN, ties to the lower index. Same arithmetic as moe_gate_f32_warp (the
// sigmoid in double, the twin's sums in its order; the softmax denominator
// a butterfly sum), so ids, weights and scores are the same.

#define GR_WARPS 4
#define GR_FULL 0xffffffffu

// gate_key maps a score to an unsigned key whose order is better()'s:
// numbers by value (-0 as +0, so equal floats get equal keys), NaN = 1.
__device__ __forceinline__ unsigned gate_key(float v) {
    if (v != v) return 1u;
    unsigned u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// gate_key64 adds the index: a larger key64 is a better (score, index).
__device__ __forceinline__ unsigned long long gate_key64(float v, int idx) {
    return ((unsigned long long)gate_key(v) << 32) | (unsigned)(0x7fffffff - idx);
}

struct RegShared {
    float choice[GATE_MAX_EXPERTS];
    float gscore[GATE_MAX_EXPERTS];
    int ids[GATE_MAX_EXPERTS];
    float w[GATE_MAX_EXPERTS];
    unsigned char gsel[GATE_MAX_EXPERTS];
};

// warp_pick selects the best key of the warp (lane l's key[j] is item
// l + 32j), clears it in its owner and returns its item (-1 when every key
// is 0) and, in val_out, val[] of the winner (0 when none).
template <int N>
__device__ __forceinline__ int warp_pick(unsigned (&key)[N], const float (&val)[N], int lane, float& val_out) {
    unsigned best = 0u;
    int bj = 0;
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (key[j] > best) {
            best = key[j];
            bj = j;
        }
    }
    float mine = 0.f;
#pragma unroll
    for (int j = 0; j < N; j++) mine = j == bj ? val[j] : mine;
    const unsigned kmax = __reduce_max_sync(GR_FULL, best);
    if (kmax == 0u) {
        val_out = 0.f;
        return -1;
    }
    const int cand = best == kmax ? lane + 32 * bj : 0x7fffffff;
    const int win = __reduce_min_sync(GR_FULL, cand);
    if (lane == (win & 31)) {
#pragma unroll
        for (int j = 0; j < N; j++) key[j] = j == bj ? 0u : key[j];
    }
    val_out = __shfl_sync(GR_FULL, mine, win & 31);
    return win;
}

template <int NPL>
__device__ __forceinline__ void gate_reg(const float* __restrict__ logits, const float* __restrict__ bias,
                                         int32_t* __restrict__ ids, float* __restrict__ weights,
                                         float* __restrict__ choice_out, int E, int topk, int n_group,
                                         int topk_group, int scoring, int group_by_max, int renorm, int S,
                                         int R, float shared_weight, const int32_t* __restrict__ hash_ids,
                                         float* __restrict__ shared_out, int SL, float wscale, float eps,
                                         RegShared& sh, int t, int lane) {
    // Inkling's router has SL more rows after the E routed ones (SL = 0:
    // none), so a token's logits are E + SL apart.
    const float* row = logits + (size_t)t * (E + SL);
    float sc[NPL], ch[NPL];
    {
        float lg[NPL];
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            const int i = lane + 32 * j;
            lg[j] = i < E ? __ldg(row + i) : 0.f;
        }
        if (scoring == SCORING_SPARSEMIXER) {
            // Phi-3.5-MoE's sparsemixer ranks the raw logits (the twin's
            // choice is the logits row); the weights come after the picks.
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                sc[j] = lg[j];
                ch[j] = lg[j];
            }
        } else if (scoring_per_expert(scoring)) {
            float bs[NPL];
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                const int i = lane + 32 * j;
                bs[j] = (bias != nullptr && i < E) ? __ldg(bias + i) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                const float s = sig_score(scoring, lg[j]);
                sc[j] = s;
                ch[j] = bias != nullptr ? s + bs[j] : s;
            }
        } else if (scoring == SCORING_SOFTMAX) {
            float m = -__int_as_float(0x7f800000);
#pragma unroll
            for (int j = 0; j < NPL; j++)
                if (lane + 32 * j < E) m = max_nan(m, lg[j]);
            for (int off = 16; off > 0; off >>= 1) m = max_nan(m, __shfl_xor_sync(GR_FULL, m, off));
            const double md = (double)m;
            double ex[NPL];
            double sum = 0.0;
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                ex[j] = lane + 32 * j < E ? exp((double)lg[j] - md) : 0.0;
                if (lane + 32 * j < E) sum += ex[j];
            }
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(GR_FULL, sum, off);
            // ERNIE 4.5 ranks softmax + correction bias; weights stay unbiased.
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                const int i = lane + 32 * j;
                const float p = (float)(ex[j] / sum);
                sc[j] = p;
                ch[j] = (bias != nullptr && i < E) ? p + __ldg(bias + i) : p;
            }
        } else {
            __trap();  // not a moe scoring (GateSpec.Check refuses it)
        }
    }
    if (choice_out != nullptr) {
        float* c = choice_out + (size_t)t * E;
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (lane + 32 * j < E) c[lane + 32 * j] = ch[j];
    }

    unsigned key[NPL];
    const bool grouped = n_group > 1 && topk_group < n_group;
    if (grouped) {
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (lane + 32 * j < E) sh.choice[lane + 32 * j] = ch[j];
        for (int g = lane; g < n_group; g += 32) sh.gsel[g] = 0;
        __syncwarp();
        // Group scores: L lanes per group each take the top two of a
        // contiguous run of the group, then merge with xor shuffles.
        const int gs = E / n_group;
        int L = 1;
        while (L * 2 * n_group <= 32) L *= 2;
        const int sub = lane & (L - 1), chunk = (gs + L - 1) / L;
        for (int g0 = 0; g0 < n_group; g0 += 32 / L) {
            const int g = g0 + lane / L;
            unsigned long long k1 = 0ull, k2 = 0ull;
            float v1 = 0.f, v2 = 0.f;
            if (g < n_group) {
                const int lo = g * gs + sub * chunk, hi = min(lo + chunk, (g + 1) * gs);
                for (int m = lo; m < hi; m++) {
                    const float v = sh.choice[m];
                    const unsigned long long k = gate_key64(v, m);
                    if (k > k1) {
                        k2 = k1; v2 = v1;
                        k1 = k; v1 = v;
                    } else if (k > k2) {
                        k2 = k; v2 = v;
                    }
                }
            }
            for (int off = L >> 1; off > 0; off >>= 1) {
                const unsigned long long o1 = __shfl_xor_sync(GR_FULL, k1, off), o2 = __shfl_xor_sync(GR_FULL, k2, off);
                const float w1 = __shfl_xor_sync(GR_FULL, v1, off), w2 = __shfl_xor_sync(GR_FULL, v2, off);
                if (o1 > k1) {
                    if (k1 > o2) {
                        k2 = k1; v2 = v1;
                    } else {
                        k2 = o2; v2 = w2;
                    }
                    k1 = o1; v1 = w1;
                } else if (o1 > k2) {
                    k2 = o1; v2 = w1;
                }
            }
            if (g < n_group && sub == 0) sh.gscore[g] = (group_by_max || k2 == 0ull) ? v1 : v1 + v2;
        }
        __syncwarp();
        // The topk_group best groups (n_group <= E <= 32*NPL).
        unsigned gk[NPL];
        float gz[NPL];
#pragma unroll
        for (int m = 0; m < NPL; m++) {
            const int g = lane + 32 * m;
            gk[m] = g < n_group ? gate_key(sh.gscore[g]) : 0u;
            gz[m] = 0.f;
        }
        for (int r = 0; r < topk_group; r++) {
            float unused;
            const int win = warp_pick<NPL>(gk, gz, lane, unused);
            if (win < 0) break;
            if (lane == 0) sh.gsel[win] = 1;
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            const int i = lane + 32 * j;
            key[j] = (i < E && sh.gsel[i / gs]) ? gate_key(ch[j]) : 0u;
        }
    } else {
#pragma unroll
        for (int j = 0; j < NPL; j++) key[j] = lane + 32 * j < E ? gate_key(ch[j]) : 0u;
    }

    // Top-k; every lane keeps the twin's running f32 sum in rank order.
    // A hash-routed layer (DeepSeek-V4: hash_ids [T,topk] from the
    // token-id table) takes its experts as given, weighted by their scores
    // (moe.RouteHashed); an id out of range gets a NaN weight.
    float sum = 0.f;
    if (hash_ids != nullptr) {
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (lane + 32 * j < E) sh.gscore[lane + 32 * j] = sc[j];
        __syncwarp();
        for (int r = 0; r < topk; r++) {
            const int id = __ldg(hash_ids + (size_t)t * topk + r);
            const float w = (id >= 0 && id < E) ? sh.gscore[id] : __int_as_float(0x7fc00000);
            if (lane == 0) {
                sh.ids[r] = id;
                sh.w[r] = w;
            }
            sum += w;
        }
    } else if (scoring == SCORING_SPARSEMIXER) {
        // sparsemixer (moe.sparseMixer): each of the 2 rounds takes the
        // largest remaining logit m and weights it by the softmax over the
        // logits v (earlier winners left out) with (m - v) / max(|v|, m) <=
        // 2 eps, the mask in f32, the exponentials summed in double.
        int prev = -1;
        for (int r = 0; r < topk; r++) {
            float m;
            const int id = warp_pick<NPL>(key, sc, lane, m);
            double part = 0.0;
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                const int i = lane + 32 * j;
                if (i >= E || i == prev) continue;
                const float v = sc[j];
                const float factor = (v != v || m != m) ? __int_as_float(0x7fc00000) : fmaxf(fabsf(v), m);
                if ((m - v) / factor > 2.f * eps) continue;
                part += exp((double)v - (double)m);
            }
            for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(GR_FULL, part, off);
            if (lane == 0) {
                sh.ids[r] = id;
                sh.w[r] = (float)(1.0 / part);
            }
            prev = id;
        }
        renorm = 0;
    } else {
        for (int r = 0; r < topk; r++) {
            float w;
            const int id = warp_pick<NPL>(key, sc, lane, w);
            if (lane == 0) {
                sh.ids[r] = id;
                sh.w[r] = w;
            }
            sum += w;
        }
    }
    __syncwarp();
    if (SL > 0) {
        // Inkling: the k chosen scores and the sigmoids of the SL shared
        // logits divided by their one sum, in double as the twin
        // (moe.sharedSink), each rounded once, then times wscale.
        if (lane == 0) {
            double dsum = 0.0;
            for (int r = 0; r < topk; r++) dsum += (double)sh.w[r];
            for (int s = 0; s < SL; s++) dsum += 1.0 / (1.0 + exp(-(double)__ldg(row + E + s)));
            for (int r = 0; r < topk; r++) sh.w[r] = (float)((double)sh.w[r] / dsum);
            for (int s = 0; s < SL; s++)
                shared_out[(size_t)t * SL + s] = (float)((1.0 / (1.0 + exp(-(double)__ldg(row + E + s)))) / dsum) * wscale;
        }
        renorm = 0;
        __syncwarp();
    }
    const int K = topk + S;
    int32_t* oid = ids + (size_t)t * K;
    float* ow = weights + (size_t)t * K;
    const float den = sum + 1e-20f;
    for (int r = lane; r < topk; r += 32) {
        const float w = sh.w[r];
        oid[r] = sh.ids[r];
        ow[r] = (renorm ? w / den : w) * wscale;
    }
    for (int s = lane; s < S; s += 32) {
        oid[topk + s] = E + (t % R) * S + s;
        ow[topk + s] = shared_weight;
    }
}

#define GATE_REG_KERNEL(NAME, NPL)                                                                      \
    extern "C" __global__ void __launch_bounds__(GR_WARPS * 32)                                         \
        NAME(const float* __restrict__ logits, const float* __restrict__ bias, int32_t* __restrict__ ids, \
             float* __restrict__ weights, float* __restrict__ choice_out, int T, int E, int topk,        \
             int n_group, int topk_group, int scoring, int group_by_max, int renorm, int S, int R,       \
             float shared_weight, const int32_t* __restrict__ hash_ids, float* __restrict__ shared_out, \
             int SL, float wscale, float eps) {                                                         \
        __shared__ RegShared shs[GR_WARPS];                                                             \
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;                                     \
        const int t = blockIdx.x * GR_WARPS + warp;                                                     \
        if (t >= T) return;                                                                             \
        gate_reg<NPL>(logits, bias, ids, weights, choice_out, E, topk, n_group, topk_group, scoring,    \
                      group_by_max, renorm, S, R, shared_weight, hash_ids, shared_out, SL, wscale, eps,\
                      shs[warp], t, lane);                                                              \
    }

GATE_REG_KERNEL(moe_gate_f32_reg4, 4)
GATE_REG_KERNEL(moe_gate_f32_reg8, 8)
GATE_REG_KERNEL(moe_gate_f32_reg16, 16)
