// Finalize (unpermute and reduce): y[t,:] = scale * sum_k w[t,k] * out[t*K+k,:]
// in f32, summed over the slots in order, with separate multiply and add
// (no fused multiply-add) so the result matches the CPU twin
// moe.Finalize bit for bit on amd64. scale is the routed scaling factor
// where it is a runtime multiply, 1 where folded.
//
// moe_finalize_v4 (H % 4 == 0, 16-byte aligned rows): grid (H/4 / 128
// column blocks, tokens), 4 columns a thread with 16-byte loads, the slot
// loop unrolled so the K loads are in flight together. A token's row is
// spread over many CTAs, so a handful of tokens still fills the GPU.
// moe_finalize: the general fallback, one CTA per token.

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

#define FIN_THREADS 128

extern "C" __global__ void __launch_bounds__(FIN_THREADS)
    moe_finalize_v4(const float4* __restrict__ out, const float* __restrict__ w, float4* __restrict__ y,
                    int T, int K, int H4, float scale)
{
    const int j = blockIdx.x * FIN_THREADS + threadIdx.x;
    if (j >= H4) return;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        const float* wt = w + (long long)t * K;
        const float4* o = out + (long long)t * K * H4 + j;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int k = 0; k < K; k++) {
            const float wk = __ldg(wt + k);
            const float4 v = __ldg(o + (long long)k * H4);
            acc.x = __fadd_rn(acc.x, __fmul_rn(wk, v.x));
            acc.y = __fadd_rn(acc.y, __fmul_rn(wk, v.y));
            acc.z = __fadd_rn(acc.z, __fmul_rn(wk, v.z));
            acc.w = __fadd_rn(acc.w, __fmul_rn(wk, v.w));
        }
        if (scale != 1.f) {
            acc.x = __fmul_rn(acc.x, scale);
            acc.y = __fmul_rn(acc.y, scale);
            acc.z = __fmul_rn(acc.z, scale);
            acc.w = __fmul_rn(acc.w, scale);
        }
        y[(long long)t * H4 + j] = acc;
    }
}
