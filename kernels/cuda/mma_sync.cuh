// Tensor-core and async-copy helpers of the sm_80+ kernels (grouped_gemm.cu's
// mma.sync variants, router_gemm.cu): the bf16 mma.sync, ldmatrix, 16-byte
// cp.async into 128-byte-swizzled stage rows, and fragment accumulators.
#pragma once

// d (+)= A (16x16 bf16, row) B (16x8 bf16, col), f32 accumulators: the
// fragments of one m16n8k16 mma.sync.
__device__ __forceinline__ void mma_bf16_16816(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory; lane l names row l & 7 of matrix l >> 3.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p)
{
    ldmatrix_x4(r, (unsigned)__cvta_generic_to_shared(p));
}

// 16-byte copy global -> shared through L2 only (cp.async.cg); in == false
// writes 16 zero bytes and reads nothing (src-size 0). L2_PREFETCH (0, 64,
// 128 or 256 bytes) asks L2 to fetch that much around each miss: with 128
// bytes of a row a stage, 256 also brings the row's next K step into L2.
template <int L2_PREFETCH>
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool in)
{
    static_assert(L2_PREFETCH == 0 || L2_PREFETCH == 64 || L2_PREFETCH == 128 || L2_PREFETCH == 256, "L2 prefetch size");
    if (L2_PREFETCH == 256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0)
                     : "memory");
    else if (L2_PREFETCH == 128)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0)
                     : "memory");
    else if (L2_PREFETCH == 64)
        asm volatile("cp.async.cg.shared.global.L2::64B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0)
                     : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's commit groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Byte offset of 16-byte chunk c of row r in a stage matrix of ROW_BYTES-byte
// rows whose chunk c sits at chunk c ^ (r & 7): the copies and ldmatrix's
// eight row addresses per phase hit distinct banks without padding.
template <int ROW_BYTES>
__device__ __forceinline__ unsigned swizzled_chunk(int r, int c) { return (unsigned)(r * ROW_BYTES + ((c ^ (r & 7)) << 4)); }

// Fragment accumulators (nested arrays of float): all zero, or acc += part *
// scale then part = 0 element by element (a block-scaled partial sum promoted
// into the accumulator), both in index order.
__device__ __forceinline__ void frag_zero(float& v) { v = 0.f; }
template <class T, int N>
__device__ __forceinline__ void frag_zero(T (&a)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) frag_zero(a[i]);
}
__device__ __forceinline__ void frag_promote(float& acc, float& part, float scale)
{
    acc = fmaf(part, scale, acc);
    part = 0.f;
}
template <class T, int N>
__device__ __forceinline__ void frag_promote(T (&acc)[N], T (&part)[N], float scale)
{
#pragma unroll
    for (int i = 0; i < N; i++) frag_promote(acc[i], part[i], scale);
}

// Calls f(mt, nt, i) for every element of MT x NT fragment accumulators
// float [MT][NT][4], in index order, unrolled.
template <int MT, int NT, class F>
__device__ __forceinline__ void frag_each(F f)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) f(mt, nt, i);
}
