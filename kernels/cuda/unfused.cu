// Pieces of the unfused MoE path that the grouped GEMM does not cover. The
// per-expert SwiGLU of the unfused path runs through the grouped GEMM kernels
// (one expert per call, or a bank of one for a dense shared expert); its
// result is added here.
//
// moe_add_rows: y[t,:] += f_t * o[t,:], with f_t = sigmoid(gate_logit[t])
// (Qwen2-MoE's shared_expert_gate, sigmoid in float64 as the CPU twin) or 1
// when gate_logit is null. Separate multiply and add, as the CPU twin.

extern "C" __global__ void __launch_bounds__(256)
    moe_add_rows(float* __restrict__ y, const float* __restrict__ o, const float* __restrict__ gate_logit,
                 int T, int H)
{
    const int t = blockIdx.x;
    if (t >= T) return;
    float f = 1.f;
    if (gate_logit != nullptr) {
        double g = (double)gate_logit[t];
        f = (float)(1.0 / (1.0 + exp(-g)));
    }
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        long long i = (long long)t * H + j;
        y[i] = __fadd_rn(y[i], __fmul_rn(f, o[i]));
    }
}
