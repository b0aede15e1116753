// Routing math shared by the gate kernels (gate.cu, gate_reg.cu): the
// scoring codes, the per-expert score functions and the comparisons the CPU
// twin (moe.Route) makes, so both kernel families round and rank alike.
#pragma once

// The largest routed expert count the gate kernels take (kernels/gate.go,
// GateMaxExperts).
#define GATE_MAX_EXPERTS 512

// The gate kernels' scoring argument: moe.Scoring.Code of each scoring
// (moe/scoring.go). kernels' TestGateScoringCodes holds these to moe's
// codes and every comparison of the scoring in the gate sources to them.
constexpr int SCORING_SIGMOID = 0;
constexpr int SCORING_SOFTMAX = 1;
constexpr int SCORING_SQRTSOFTPLUS = 2;
constexpr int SCORING_SPARSEMIXER = 3;

// Whether the scoring scores each logit on its own (moe.Scoring.PerExpert):
// such a score plus the correction bias is what top-k ranks.
__device__ __forceinline__ bool scoring_per_expert(int scoring)
{
    return scoring == SCORING_SIGMOID || scoring == SCORING_SQRTSOFTPLUS;
}

// sig_score is a per-expert score in double, rounded once to f32 as the CPU
// twin (moe.scoreOf) does: DeepSeek-V4's sqrt(softplus(l)) with torch's
// softplus threshold (l > 20 gives l), otherwise the sigmoid. Callers take
// this branch for scoring_per_expert scorings only.
__device__ __forceinline__ float sig_score(int scoring, float l)
{
    double v = (double)l;
    if (scoring == SCORING_SQRTSOFTPLUS) {
        if (v <= 20.0) v = log1p(exp(v));
        return (float)sqrt(v);
    }
    return (float)(1.0 / (1.0 + exp(-v)));
}

// The larger of a and b, NaN if either is NaN (Go's math.Max, which the
// twin's softmax uses).
__device__ __forceinline__ float max_nan(float a, float b)
{
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}
