"""A fused-MoE grouped GEMM in Triton, issue 13's third peer (bench/torch_ref.py).

Written here from the published algorithm that vLLM's and SGLang's fused_moe
kernels follow (no code taken from them): the slots (token, k) are sorted by
expert and padded per expert to BLOCK_M rows (moe_align_block_size); each
program computes a BLOCK_M x BLOCK_N tile of one expert's GEMM, the expert
read from expert_ids[block], its A rows gathered through the sorted slot ids.
Two such GEMMs make the expert computation: gate_up (A = the token's row),
silu(gate) * up, then down (A = the slot's row of that), the slot weight
multiplied in the second GEMM's epilogue, and a sum over each token's slots.

bf16 weights and activations, or block-FP8 w8a8 as DeepSeek-V3 serving runs
it: weights e4m3 with a float32 scale per 128x128 block, activations
quantised per token per 128-wide group; each 128-deep K step multiplies the
fp8 tile product by the two scales (BLOCK_K is 128 there).
"""
import torch
import triton
import triton.language as tl

FP8_MAX = 448.0
QB = 128  # FP8 block


@triton.jit
def moe_gemm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, w_ptr, sorted_ptr, expert_ptr, total_ptr,
                    N, K, numel, a_rows_per_slot,
                    stride_am, stride_be, stride_bn, stride_bk, stride_cm,
                    stride_asm, stride_bse, stride_bsn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    FP8: tl.constexpr, MUL_W: tl.constexpr, QBLK: tl.constexpr):
    pid = tl.program_id(0)
    total = tl.load(total_ptr)
    num_m = tl.cdiv(total, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped order: GROUP_M row blocks share their B tiles in L2
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    if size_m <= 0:
        return
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    if pid_m * BLOCK_M >= total:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + offs_m)
    valid = slot < numel
    row = slot // a_rows_per_slot  # the token for gate_up (rows per slot = top-k), the slot for down (1)
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + row[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + e * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & (offs_n[None, :] < N), other=0.0)
        if FP8:
            sa = tl.load(as_ptr + row.to(tl.int64) * stride_asm + k0, mask=valid, other=0.0)
            sb = tl.load(bs_ptr + e * stride_bse + (pid_n * BLOCK_N // QBLK) * stride_bsn + k0)
            acc += tl.dot(a, b) * sa[:, None] * sb
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    if MUL_W:
        w = tl.load(w_ptr + slot, mask=valid, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + slot[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


def moe_gemm(a, b, out, sorted_ids, expert_ids, total, numel, rows_per_slot, cfg, w=None, a_scale=None, b_scale=None):
    """out[slot] = A[slot // rows_per_slot] @ B[expert]^T (x w[slot]); b is [G, N, K]."""
    n, k = b.shape[1], b.shape[2]
    fp8 = a_scale is not None
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], (QB if fp8 else cfg["BLOCK_K"])
    max_m = sorted_ids.numel()
    grid = (triton.cdiv(max_m, bm) * triton.cdiv(n, bn),)
    dummy = out
    moe_gemm_kernel[grid](
        a, b, out, a_scale if fp8 else dummy, b_scale if fp8 else dummy, w if w is not None else dummy,
        sorted_ids, expert_ids, total, n, k, numel, rows_per_slot,
        a.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        a_scale.stride(0) if fp8 else 0, b_scale.stride(0) if fp8 else 0, b_scale.stride(1) if fp8 else 0,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.get("GROUP_M", 8), FP8=fp8, MUL_W=w is not None, QBLK=QB,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))
    return out


def quant_groups(x):
    """Per-token, per-128-column e4m3 quantisation: values [M, K] and scales [M, K/128]."""
    m, k = x.shape
    g = x.float().view(m, k // QB, QB)
    s = g.abs().amax(dim=-1).clamp_(min=1e-12) / FP8_MAX
    return (g / s.unsqueeze(-1)).to(torch.float8_e4m3fn).view(m, k), s.contiguous()


def quant_blocks(w):
    """[G, N, K] -> e4m3 with a float32 scale per 128x128 block [G, N/128, K/128], one expert at a time."""
    g, n, k = w.shape
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty(g, n // QB, k // QB, dtype=torch.float32, device=w.device)
    for i in range(g):
        b = w[i].float().view(n // QB, QB, k // QB, QB)
        sc = b.abs().amax(dim=(1, 3)).clamp_(min=1e-12) / FP8_MAX
        q[i] = (b / sc[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
        s[i] = sc
    return q, s


def experts_triton(x, ids, w, gu, dn, align, cfg, fp8=None):
    """The whole expert computation: ids [T, K] over the bank, w the slot
    weights, gu [G, 2I, H] and dn [G, H, I]; align(ids) gives (sorted_ids,
    expert_ids, total) padded to cfg BLOCK_M. fp8 = (gu_s, dn_s) block scales
    of e4m3 gu and dn."""
    t, k = ids.shape
    numel = t * k
    sorted_ids, expert_ids, total = align(ids)
    two_i, h = gu.shape[1], gu.shape[2]
    mid = torch.empty(numel, two_i, dtype=torch.bfloat16, device=x.device)
    wf = w.reshape(-1).float()
    if fp8 is None:
        moe_gemm(x, gu, mid, sorted_ids, expert_ids, total, numel, k, cfg)
        g, u = mid.chunk(2, dim=-1)
        act = torch.nn.functional.silu(g) * u
        out = torch.empty(numel, h, dtype=torch.bfloat16, device=x.device)
        moe_gemm(act, dn, out, sorted_ids, expert_ids, total, numel, 1, cfg, w=wf)
    else:
        gu_s, dn_s = fp8
        x8, xs = quant_groups(x)
        moe_gemm(x8, gu, mid, sorted_ids, expert_ids, total, numel, k, cfg, a_scale=xs, b_scale=gu_s)
        g, u = mid.chunk(2, dim=-1)
        a8, a_s = quant_groups(torch.nn.functional.silu(g) * u)
        out = torch.empty(numel, h, dtype=torch.bfloat16, device=x.device)
        moe_gemm(a8, dn, out, sorted_ids, expert_ids, total, numel, 1, cfg, w=wf, a_scale=a_s, b_scale=dn_s)
    return out.view(t, k, h).sum(dim=1)


# A small sweep, as issue 13's peer took the best of one: BLOCK_M 16 suits a
# few tokens per expert, 64 many.
CONFIGS = [
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3),
    dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
]
