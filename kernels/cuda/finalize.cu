// Finalize (unpermute and reduce): y[t,:] = scale * sum_k w[t,k] * out[t*K+k,:]
// in f32, summed over the slots in order, with separate multiply and add
// (no fused multiply-add) so the result matches the CPU twin
// validate.Finalize bit for bit on amd64. scale is the routed scaling factor
// where it is a runtime multiply, 1 where folded. One CTA per token.

extern "C" __global__ void __launch_bounds__(256)
    moe_finalize(const float* __restrict__ out, const float* __restrict__ w, float* __restrict__ y,
                 int T, int K, int H, float scale)
{
    const int t = blockIdx.x;
    if (t >= T) return;
    const float* wt = w + (long long)t * K;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < K; k++)
            acc = __fadd_rn(acc, __fmul_rn(wt[k], out[((long long)t * K + k) * H + j]));
        if (scale != 1.f) acc = __fmul_rn(acc, scale);
        y[(long long)t * H + j] = acc;
    }
}
