// Tile-shape variants of the wgmma grouped GEMM (kernels/cuda/grouped_gemm_wg.cu) for the
// harness only (issue 13 pass 5; not in the kernel build). Included after grouped_gemm_wg.cu,
// whose helpers, tensor maps and rounding it uses; scripts/wg/harness_tile.cu times them
// against that kernel and the tall kernels in one binary.
//
// Same loading as the current kernel: the weight tile B by the bulk tensor copy engine
// (thread 0 of the producer: arrive.expect_tx on the stage's full mbarrier, one box
// {64, BNB, 1} for down, two boxes {64, BNB / 2, 1} for gate_up), the gathered A rows by
// 16-byte cp.async of the 128 producer threads, completing on the same mbarrier
// (cp.async.mbarrier.arrive.noinc; init count 129), the consumers fence the async proxy
// after the wait. What changes is the tile: BM rows (BM / 16 sub-blocks of one expert's
// run) x BNB weight rows, NCW consumer warpgroups; consumer warpgroup c owns the 64-row
// groups c and c + NCW (when BM / 64 = 2 NCW) and issues, per k16, one m64nBNBk16 per
// group that holds a real row (so every output keeps the k16 summation order of tall);
// the producer copies no A rows of all-padding groups, and a warpgroup whose groups are
// all padding keeps the barrier protocol only. Instances in the harness:
//   256 x 128, 2 consumer warpgroups x two m64n128k16 (acc 2 x 64), 4 stages of 48 KB
//   192 x 192, 3 consumer warpgroups x one m64n192k16 (acc 96), 4 stages of 48 KB
// A routed DeepSeek-V3 expert at T = 4096 has ~128-160 rows: one row tile in both, so its
// weights cross HBM once (the current kernel's 128-row tiles take two passes).
//
// Schedule: as the current kernel's (runs of equal expert ids over 16-row sub-blocks, a
// run of a local expert cut into ceil(len / (BM / 16)) row tiles), but a run of n row
// tiles owns n x ncol work items in (column tile, row tile) order, so the row tiles of a
// large run (a shared expert's 512 rows at T = 4096) share each weight tile through L2 at
// the same time; items are handed out round-robin over a persistent grid.

template <int N>
__device__ __forceinline__ void tv_mma(float* d, unsigned long long da, unsigned long long db, int scale_d);

#ifdef WG_ENABLED

// d[0..63] (+)= A(64x16) B(128x16)^T; scale_d 0 overwrites d.
template <>
__device__ __forceinline__ void tv_mma<128>(float* d, unsigned long long da, unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// d[0..95] (+)= A(64x16) B(192x16)^T; scale_d 0 overwrites d.
template <>
__device__ __forceinline__ void tv_mma<192>(float* d, unsigned long long da, unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// Work item w (see the header): run lo owns items [tp[lo] * ncol, tp[lo + 1] * ncol).
template <int BM>
__device__ __forceinline__ WgTile tv_tile(int w, int ncol, int bn, const int* runs, const int* tp, int nruns,
                                          const int* __restrict__ expert_ids, int block_size)
{
    const int rt = w / ncol;
    int lo = 0, hi = nruns - 1;
    while (lo < hi) {  // last run whose first tile is <= rt (runs of 0 tiles share it with the next)
        int mid = (lo + hi + 1) >> 1;
        if (tp[mid] <= rt) lo = mid;
        else hi = mid - 1;
    }
    const int nt = tp[lo + 1] - tp[lo], local = w - tp[lo] * ncol;
    const int ct = local / nt, r = local - ct * nt;
    WgTile t;
    t.sb0 = runs[lo] + (BM / 16) * r;
    t.rows = 16 * min(BM / 16, runs[lo + 1] - t.sb0);
    t.e = expert_ids[(runs[lo] * 16) / block_size];
    t.n0 = ct * bn;
    return t;
}

// The K loop of one tile for a consumer warpgroup with NA (1 or 2) active 64-row groups:
// the first at a0 in stage 0, the second a1off bytes after it.
template <int NB, int NA, int STAGES, int STAGE_BYTES>
__device__ __forceinline__ void tv_consume(float* acc0, float* acc1, unsigned a0, unsigned a1off, unsigned b0, int nk,
                                           int& it, unsigned full0, unsigned empty0)
{
    for (int kt = 0; kt < nk; kt++, it++) {
        const int s = it % STAGES;
        wg_bar_wait(full0 + 8 * s, (it / STAGES) & 1);
        // A was written by cp.async (generic proxy); wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const unsigned sa = a0 + s * STAGE_BYTES, sb = b0 + s * STAGE_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) {
            tv_mma<NB>(acc0, wg_desc(sa + kk * 32), wg_desc(sb + kk * 32), (kt | kk) != 0);
            if (NA == 2) tv_mma<NB>(acc1, wg_desc(sa + a1off + kk * 32), wg_desc(sb + kk * 32), (kt | kk) != 0);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kt > 0) wg_bar_arrive(empty0 + 8 * ((it - 1) % STAGES));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wg_bar_arrive(empty0 + 8 * ((it - 1) % STAGES));
}

// Epilogue of one 64-row group (rows rg .. rg + 63 of tile t), as the current kernel's:
// the thread holds rows g and g + 8 of its warp's 16, columns 8j + 2q + {0,1}
// (acc[4j + 2h + i]); gate_up's up columns are j + BN / 8.
template <bool GATED, int BN>
__device__ __forceinline__ void tv_epilogue(const float* acc, int rg, const WgTile& t, const int* __restrict__ sorted_ids,
                                            bf16_t* __restrict__ c_bf16, float* __restrict__ c_f32, int numel, int N)
{
    const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = rg + wq * 16 + g + 8 * h;
        int s = r < t.rows ? sorted_ids[t.sb0 * 16 + r] : -1;
        if (s < 0 || s >= numel) continue;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            int n = t.n0 + 8 * j + 2 * q;
            float v[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                v[i] = acc[4 * j + 2 * h + i];
                if (GATED) {
                    double gv = (double)v[i];
                    float sg = (float)(gv / (1.0 + exp(-gv)));
                    v[i] = __fmul_rn(sg, acc[4 * (j + BN / 8) + 2 * h + i]);
                }
            }
            if (GATED) {
                bf16_t* p = c_bf16 + (long long)s * N + n;
                if (n + 1 < N && (N & 1) == 0) {
                    *(unsigned*)p = (unsigned)wg_f32_to_bf16(v[0]) | ((unsigned)wg_f32_to_bf16(v[1]) << 16);
                } else {
                    if (n < N) p[0] = wg_f32_to_bf16(v[0]);
                    if (n + 1 < N) p[1] = wg_f32_to_bf16(v[1]);
                }
            } else {
                float* p = c_f32 + (long long)s * N + n;
                if (n + 1 < N && (N & 1) == 0) {
                    *(float2*)p = make_float2(v[0], v[1]);
                } else {
                    if (n < N) p[0] = v[0];
                    if (n + 1 < N) p[1] = v[1];
                }
            }
        }
    }
}
#endif  // WG_ENABLED

template <int BM, int BNB, int NCW, int STAGES>
struct TvCfg {
    static constexpr int THREADS = 128 * (1 + NCW);
    static constexpr int A_BYTES = BM * WG_BK * 2;
    static constexpr int B_BYTES = BNB * WG_BK * 2;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int GPW = BM / 64 / NCW;  // 64-row groups per consumer warpgroup
    // ring + run starts + tile prefix + warp counts + barriers + producer row table + 1024 for aligning the ring
    static constexpr int SMEM = STAGES * STAGE_BYTES + (2 * WG_MAX_RUNS + 32) * 4 + 2 * STAGES * 8 + BM * 8 + 1024;
    static_assert(BM % 64 == 0 && (GPW == 1 || GPW == 2) && GPW * NCW * 64 == BM, "BM = 64 NCW or 128 NCW");
    static_assert(BNB % 16 == 0 && BNB <= 256 && (BNB / 2) % 8 == 0, "wgmma N / tensor-map box");
    static_assert(THREADS / 32 <= 32, "warp counts");
    static_assert(SMEM <= 232448, "shared memory");
};

template <bool GATED, int BM, int BNB, int NCW, int STAGES, int PREG, int CREG>
__device__ __forceinline__ void tv_body(const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
                                        const int* __restrict__ total_padded, const bf16_t* __restrict__ a, int a_div,
                                        const WgTmap* tm0, const WgTmap* tm1, bf16_t* __restrict__ c_bf16,
                                        float* __restrict__ c_f32, int numel, int N, int K, int block_size, int num_experts)
{
#ifdef WG_ENABLED
    typedef TvCfg<BM, BNB, NCW, STAGES> C;
    constexpr int BN = GATED ? BNB / 2 : BNB;  // output columns per tile
    extern __shared__ unsigned char wg_smem_raw[];
    unsigned char* ring = wg_smem_raw + ((1024u - (wg_smem_addr(wg_smem_raw) & 1023u)) & 1023u);
    int* runs = (int*)(ring + STAGES * C::STAGE_BYTES);  // [WG_MAX_RUNS]: run starts, then the end
    int* tp = runs + WG_MAX_RUNS;                        // [WG_MAX_RUNS]: first tile of each run
    int* wcnt = tp + WG_MAX_RUNS;                        // [32]
    unsigned long long* bars = (unsigned long long*)(wcnt + 32);
    const bf16_t** rowp = (const bf16_t**)(bars + 2 * STAGES);  // [BM], producer only
    const unsigned ring_s = wg_smem_addr(ring);
    const unsigned full0 = wg_smem_addr(bars), empty0 = full0 + STAGES * 8;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            wg_bar_init(full0 + 8 * s, 129);          // every producer thread arrives for A, thread 0 once more with B's bytes
            wg_bar_init(empty0 + 8 * s, 128 * NCW);   // every consumer thread arrives
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    // Runs of equal expert ids over the 16-row sub-blocks, compacted in order.
    const int nsb = *total_padded / 16;
    int nruns = 0;
    for (int base = 0; base < nsb; base += C::THREADS) {
        int i = base + tid;
        bool f = false;
        if (i < nsb) f = i == 0 || expert_ids[(i * 16) / block_size] != expert_ids[((i - 1) * 16) / block_size];
        unsigned m = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wcnt[warp] = __popc(m);
        __syncthreads();
        int off = nruns, tot = 0;
#pragma unroll
        for (int w = 0; w < C::THREADS / 32; w++) {
            int c = wcnt[w];
            off += w < warp ? c : 0;
            tot += c;
        }
        if (f) {
            int pos = off + __popc(m & ((1u << lane) - 1u));
            if (pos < WG_MAX_RUNS - 1) runs[pos] = i;
        }
        nruns += tot;
        __syncthreads();
    }
    if (nruns > WG_MAX_RUNS - 1) __trap();
    // Row tiles of each run (0 for experts not on this rank), prefix-summed by warp 0.
    if (warp == 0) {
        if (lane == 0) runs[nruns] = nsb;
        __syncwarp();
        int acc = 0;
        for (int r0 = 0; r0 < nruns; r0 += 32) {
            int r = r0 + lane, t = 0;
            if (r < nruns) {
                int e = expert_ids[(runs[r] * 16) / block_size];
                if (e >= 0 && e < num_experts) t = (runs[r + 1] - runs[r] + BM / 16 - 1) / (BM / 16);
            }
            int v = t;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, v, d);
                if (lane >= d) v += u;
            }
            if (r < nruns) tp[r] = acc + v - t;
            acc += __shfl_sync(0xffffffffu, v, 31);
        }
        if (lane == 0) tp[nruns] = acc;
    }
    __syncthreads();
    const int ncol = (N + BN - 1) / BN;
    const int items = __shfl_sync(0xffffffffu, tp[nruns] * ncol, 0);
    const int role = __shfl_sync(0xffffffffu, warp >> 2, 0);  // warpgroup
    const int nk = (K + WG_BK - 1) / WG_BK;

    if (role == 0) {
        // ---- producer warpgroup ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREG));
        const int c = tid & 7, r0 = tid >> 3;  // 16-byte chunk of the K step; first row
        int it = 0;
        for (int w = blockIdx.x; w < items; w += gridDim.x) {
            WgTile t = tv_tile<BM>(w, ncol, BN, runs, tp, nruns, expert_ids, block_size);
            asm volatile("bar.sync 1, 128;\n" ::: "memory");  // the last tile's table is no longer read
            for (int i = tid; i < BM; i += 128) {
                const bf16_t* p = nullptr;
                int s = i < t.rows ? sorted_ids[t.sb0 * 16 + i] : -1;
                if (s >= 0 && s < numel) p = a + (long long)(s / a_div) * K;
                rowp[i] = p;
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
            const int ngrp = (t.rows + 63) >> 6;  // 64-row groups of A that hold real rows
            for (int kt = 0; kt < nk; kt++, it++) {
                const int s = it % STAGES, round = it / STAGES;
                if (round > 0) wg_bar_wait(empty0 + 8 * s, (round - 1) & 1);
                const int k = kt * WG_BK + c * 8;
                const bool kin = k < K;
                const unsigned sa = ring_s + s * C::STAGE_BYTES, fb = full0 + 8 * s;
                if (tid == 0) {
                    // B by the bulk tensor copy engine: rows past N and the K tail read as zeros.
                    wg_bar_arrive_tx(fb, C::B_BYTES);
                    if (GATED) {
                        wg_tma3(sa + C::A_BYTES, tm0, kt * WG_BK, t.n0, t.e, fb);
                        wg_tma3(sa + C::A_BYTES + C::B_BYTES / 2, tm1, kt * WG_BK, t.n0, t.e, fb);
                    } else {
                        wg_tma3(sa + C::A_BYTES, tm0, kt * WG_BK, t.n0, t.e, fb);
                    }
                }
#pragma unroll
                for (int j = 0; j < BM / 16; j++) {
                    if ((j >> 2) >= ngrp) continue;  // all-padding 64-row group: not read
                    int r = r0 + 16 * j;
                    const bf16_t* p = rowp[r];
                    bool ok = kin && p != nullptr;
                    wg_cp16(sa + r * 128 + ((c ^ (r & 7)) << 4), ok ? p + k : a, ok ? 16u : 0u);
                }
                // A completes on the same barrier, as one of its 128 arrivals.
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fb) : "memory");
            }
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");  // no thread exits with copies in flight
    } else {
        // ---- consumer warpgroups ----
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CREG));
        const int cw = role - 1;  // 64-row groups cw (and cw + NCW) of the tile
        float acc0[BNB / 2], acc1[C::GPW == 2 ? BNB / 2 : 1];
        int it = 0;
        for (int w = blockIdx.x; w < items; w += gridDim.x) {
            WgTile t = tv_tile<BM>(w, ncol, BN, runs, tp, nruns, expert_ids, block_size);
            // Groups of this warpgroup with a real row, warpgroup-uniform.
            const int na = __shfl_sync(0xffffffffu, (cw * 64 < t.rows) + (C::GPW == 2 && (cw + NCW) * 64 < t.rows), 0);
            const unsigned sa0 = ring_s + cw * 64 * 128, sb0 = ring_s + C::A_BYTES;  // stage 0
            if (na == 0) {
                // All its rows padding: keep the barrier protocol, no multiplies.
                for (int kt = 0; kt < nk; kt++, it++) {
                    wg_bar_wait(full0 + 8 * (it % STAGES), (it / STAGES) & 1);
                    wg_bar_arrive(empty0 + 8 * (it % STAGES));
                }
                continue;
            }
            if constexpr (C::GPW == 2) {
                if (na == 2) tv_consume<BNB, 2, STAGES, C::STAGE_BYTES>(acc0, acc1, sa0, NCW * 64 * 128, sb0, nk, it, full0, empty0);
                else tv_consume<BNB, 1, STAGES, C::STAGE_BYTES>(acc0, acc1, sa0, 0, sb0, nk, it, full0, empty0);
            } else {
                tv_consume<BNB, 1, STAGES, C::STAGE_BYTES>(acc0, acc1, sa0, 0, sb0, nk, it, full0, empty0);
            }
            tv_epilogue<GATED, BN>(acc0, cw * 64, t, sorted_ids, c_bf16, c_f32, numel, N);
            if constexpr (C::GPW == 2) {
                if (na == 2) tv_epilogue<GATED, BN>(acc1, (cw + NCW) * 64, t, sorted_ids, c_bf16, c_f32, numel, N);
            }
        }
    }
#else
    __trap();
#endif
}

// Same parameter lists as moe_gate_up_wg_bf16_bf16 / moe_down_wg_bf16_bf16; the tensor maps'
// boxes are {64, BNB / 2, 1} (gate, up) and {64, BNB, 1} (down).
template <int BM, int BNB, int NCW, int STAGES, int PREG, int CREG>
__global__ void __launch_bounds__(128 * (1 + NCW), 1) tv_gate_up(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* x,
    const bf16_t* w_gate, const bf16_t* w_up, long long w_estride, const float* s_gate,
    const float* s_up, long long s_estride, bf16_t* inter, int numel, int topk, int I, int H,
    int block_size, int num_experts, const __grid_constant__ WgTmap tm_gate, const __grid_constant__ WgTmap tm_up)
{
    tv_body<true, BM, BNB, NCW, STAGES, PREG, CREG>(sorted_ids, expert_ids, total_padded, x, topk, &tm_gate, &tm_up, inter,
                                                   nullptr, numel, I, H, block_size, num_experts);
}

template <int BM, int BNB, int NCW, int STAGES, int PREG, int CREG>
__global__ void __launch_bounds__(128 * (1 + NCW), 1) tv_down(
    const int* sorted_ids, const int* expert_ids, const int* total_padded, const bf16_t* inter,
    const bf16_t* w_down, long long w_estride, const float* s_down, long long s_estride, float* out,
    int numel, int H, int I, int block_size, int num_experts, const __grid_constant__ WgTmap tm_down)
{
    tv_body<false, BM, BNB, NCW, STAGES, PREG, CREG>(sorted_ids, expert_ids, total_padded, inter, 1, &tm_down, &tm_down,
                                                    nullptr, out, numel, H, I, block_size, num_experts);
}
