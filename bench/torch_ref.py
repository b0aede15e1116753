#!/usr/bin/env python3
"""PyTorch reference timings beside `moeprep bench kernels` (issue 6).

Runs on the GPU machine (torch 2.11). At DeepSeek-V3 shapes (H 7168, I 2048,
256 routed experts + one shared expert, top-8, 8 groups keep 4, sigmoid +
correction bias, rsf 2.5) it times, in PyTorch eager and torch.compile:

  router_gemm  F.linear(x.float(), W.float()) as transformers' DeepseekV3TopkRouter
  gate         biased grouped top-k as transformers writes it (sigmoid, + bias,
               group score = sum of the best two, keep 4 groups, mask, top-8,
               gather, normalise, x rsf)
  align        moe_align_block_size as sort/bincount (ids with the fused shared
               slot 256 + t mod 8, 264 experts, block 16), no host sync
  experts      transformers' per-expert loop (DeepseekV3NaiveMoe: one-hot mask,
               hit experts, gather, gate_up, silu*up, down, x weight,
               index_add_) plus the shared expert MLP; eager only by default
               (torch.compile of a data-dependent loop recompiles per shape)
  layer        router_gemm + gate + experts
  grouped      the whole expert computation as a grouped-GEMM engine runs it
               (issue 13's peers), given the routed ids + the fused shared slot
               over the 264-expert bank: sort the slots by expert, pad each
               expert to 16 rows, gather, torch._grouped_mm (gate_up), silu*up,
               torch._grouped_mm (down), x weight, index_add_. bf16, eager
               and CUDA graph.
  scaled_grouped  the same with torch._scaled_grouped_mm, fp8 e4m3 x e4m3
               (w8a8): activations quantised per row before each GEMM, weights
               per output channel ("fp8 rowwise"). Eager and CUDA graph.
  triton       bench/triton_moe.py: a fused-MoE grouped GEMM in Triton written
               here from the published algorithm (BLOCK_M rows of sorted slot
               ids per program, the expert from expert_ids), bf16 and block-FP8
               w8a8 (triton_fp8), the best of a small config sweep per T,
               eager and CUDA graph.

Method as moeprep's: CUDA events around each run, one warm-up run, a 256 MiB
buffer overwritten before each run (outside the events), 4 rotating input sets,
median (p10/p90) of up to --iters runs within --budget seconds per measurement.
The expert bank (bf16, 23 GB) is one copy; each run reads >= 8 experts = 700 MB,
far past L2, and the flush clears the rest. Writes JSON (--json) and prints a table.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

H, I, E, TOPK, NGROUP, TOPKGROUP, REPLICAS, RSF = 7168, 2048, 256, 8, 8, 4, 8, 2.5
BLOCK = 16
XSETS = 4
FLUSH_BYTES = 256 << 20


# --- moeprep bench's inputs -------------------------------------------------
# The peers run on the very inputs `moeprep bench kernels` draws (bench/random.go:
# splitmix64; bench/run.go and layer.go: router weight seed 11, bias seed 12, x
# seed 1000 T + i), so every engine routes the same tokens to the same experts
# and streams the same weight bytes. With torch's own draws the peers touched
# 244.75 experts at T=128 against moeprep's 248.75 (1.6% fewer bytes;
# kernels/GEMM_NOTES.md, issue 13 pass 7).
GAMMA = 0x9E3779B97F4A7C15


def splitmix_uniform(seed, n, amp):
    """bench/random.go's rng.uniform(amp): n float32 draws from seed, on the CPU."""
    import numpy as np
    s = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GAMMA) + np.uint64(seed)
    z = (s ^ (s >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) / np.float32(1 << 24)
    return (np.float32(2) * u - np.float32(1)) * np.float32(amp)


def bf16_tensor(f32, shape):
    """numfmt.F32ToBF16 (round to nearest even) of finite float32 values, on the GPU."""
    import numpy as np
    u = f32.view(np.uint32).astype(np.uint64)
    u = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return torch.from_numpy(u.astype(np.uint16).view(np.int16)).view(torch.bfloat16).reshape(shape).cuda()


def moeprep_router():
    """moeprep bench's router weight [E, H] (bf16) and correction bias [E] (f32)."""
    import numpy as np
    w = bf16_tensor(splitmix_uniform(11, E * H, np.float32(np.sqrt(3 / H))), (E, H))
    return w, torch.from_numpy(splitmix_uniform(12, E, 0.05)).cuda()


def moeprep_x(t, i):
    """moeprep bench's input set i at t tokens: [t, H] bf16, uniform in (-1.7, 1.7)."""
    return bf16_tensor(splitmix_uniform(1000 * t + i, t * H, 1.7), (t, H))


def moeprep_draws_check(w, b):
    """moeprep_router's w, b and moeprep_x's first draws against values Go
    printed (bench.RandBF16 / RandF32): "" when they match, else why not."""
    import numpy as np
    got = (moeprep_x(128, 0).view(torch.int16).flatten()[:8].cpu().numpy().view(np.uint16).tolist(),
           w.view(torch.int16).flatten()[:4].cpu().numpy().view(np.uint16).tolist(),
           [round(v, 6) for v in b[:4].tolist()])
    want = ([48923, 16146, 49033, 15901, 16183, 48979, 49014, 48866],
            [48118, 48159, 15289, 14662], [0.00791, 0.043946, -0.026526, 0.040484])
    return "" if got == want else f"moeprep draws differ from Go's: got {got}, want {want}"


# --- the operations -------------------------------------------------------

def router_gemm(x, w):
    # transformers: router_logits = F.linear(hidden.type(float32), weight.type(float32))
    return F.linear(x.float(), w.float())


def biased_grouped_topk(logits, bias):
    scores = logits.sigmoid()
    sfc = scores.view(-1, E) + bias.unsqueeze(0)
    group_scores = sfc.view(-1, NGROUP, E // NGROUP).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=TOPKGROUP, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, NGROUP, E // NGROUP).reshape(-1, E)
    sfc = sfc.masked_fill(~score_mask.bool(), 0.0)
    topk_idx = torch.topk(sfc, k=TOPK, dim=-1, sorted=False)[1]
    topk_w = scores.gather(1, topk_idx)
    topk_w = topk_w / (topk_w.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_idx, topk_w * RSF


def expert_counts(ids, num_experts):
    """bincount without its host sync (bincount reads the max id back to size
    its output), so that CUDA graphs can capture it."""
    flat = ids.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))


def align_block_size(ids, num_experts=E + REPLICAS, block=BLOCK, graphable=False):
    """Sorted slot ids padded per expert to the block size, the expert of each
    block, and the padded total; shapes fixed by the worst case, no host sync."""
    flat = ids.reshape(-1)
    numel = flat.numel()
    counts = expert_counts(ids, num_experts) if graphable else torch.bincount(flat, minlength=num_experts)
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    first = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    rank = torch.arange(numel, device=ids.device) - first[e_sorted]
    max_pad = numel + num_experts * (block - 1)
    sorted_ids = torch.full((max_pad,), numel, dtype=torch.int32, device=ids.device)
    sorted_ids[starts[e_sorted] + rank] = order.to(torch.int32)
    blocks = torch.arange(0, max_pad, block, device=ids.device)
    expert_ids = torch.searchsorted(ends, blocks, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), ends[-1:]


def experts_loop(x, topk_idx, topk_w, bank):
    """transformers' DeepseekV3NaiveMoe per-expert loop, then the shared expert."""
    gate_up, down, sh_gate_up, sh_down = bank
    final = torch.zeros_like(x)
    with torch.no_grad():
        mask = F.one_hot(topk_idx, num_classes=E).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = e[0]
        pos, tok = torch.where(mask[e])
        cur = x[tok]
        g, u = F.linear(cur, gate_up[e]).chunk(2, dim=-1)
        h = F.linear(F.silu(g) * u, down[e])
        h = h * topk_w[tok, pos, None]
        final.index_add_(0, tok, h.to(final.dtype))
    g, u = F.linear(x, sh_gate_up).chunk(2, dim=-1)
    return final + F.linear(F.silu(g) * u, sh_down)


def group_slots(ids, block=BLOCK, num_experts=E + REPLICAS):
    """Slots sorted by expert, each expert padded to a multiple of block rows:
    the token of each row (t for padding: the zero row), the slot of each row
    (numel for padding) and the cumulative padded offsets (int32), no host sync."""
    sorted_ids, _, _ = align_block_size(ids, num_experts, block, graphable=True)
    counts = expert_counts(ids, num_experts)
    offs = torch.cumsum((counts + block - 1) // block * block, 0).to(torch.int32)
    k = ids.shape[1]
    tok = torch.where(sorted_ids < ids.numel(), sorted_ids // k, ids.shape[0])
    return tok, sorted_ids, offs


def experts_grouped(x, ids, w, gu_t, dn_t):
    """bf16 grouped-GEMM engine: ids [T, K+1] over the 264-expert bank, w the
    slot weights; gu_t [G, H, 2I] and dn_t [G, I, H] are K-major views."""
    t = x.shape[0]
    tok, slot, offs = group_slots(ids)
    xz = torch.cat([x, x.new_zeros(1, x.shape[1])])
    a = xz[tok]
    g, u = torch._grouped_mm(a, gu_t, offs=offs).chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(g) * u, dn_t, offs=offs)
    wz = torch.cat([w.reshape(-1), w.new_zeros(1)])
    y = y * wz[slot.long()].unsqueeze(1).to(y.dtype)
    return torch.zeros(t + 1, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, tok, y)[:t]


FP8_MAX = 448.0


def quant_rows(a):
    """e4m3 with one float32 scale per row (amax / 448)."""
    s = a.abs().amax(dim=-1, keepdim=True).float().clamp_(min=1e-12) / FP8_MAX
    return (a.float() / s).to(torch.float8_e4m3fn), s.squeeze(-1)


def experts_scaled_grouped(x, ids, w, gu8_t, gu_s, dn8_t, dn_s):
    """fp8 w8a8 grouped-GEMM engine (rowwise scales) on the same routing."""
    t = x.shape[0]
    tok, slot, offs = group_slots(ids)
    xz = torch.cat([x, x.new_zeros(1, x.shape[1])])
    a8, sa = quant_rows(xz[tok])
    h = torch._scaled_grouped_mm(a8, gu8_t, sa, gu_s, offs=offs, out_dtype=torch.bfloat16)
    g, u = h.chunk(2, dim=-1)
    m8, sm = quant_rows(F.silu(g) * u)
    y = torch._scaled_grouped_mm(m8, dn8_t, sm, dn_s, offs=offs, out_dtype=torch.bfloat16)
    wz = torch.cat([w.reshape(-1), w.new_zeros(1)])
    y = y * wz[slot.long()].unsqueeze(1).to(y.dtype)
    return torch.zeros(t + 1, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, tok, y)[:t]


def fp8_rowwise(w):
    """[G, N, K] bf16 -> e4m3 [G, N, K] and float32 scales [G, N], one expert at a time."""
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty(w.shape[0], w.shape[1], dtype=torch.float32, device=w.device)
    for g in range(w.shape[0]):
        q[g], s[g] = quant_rows(w[g])
    return q, s


def graphed(fn, sets=XSETS):
    """CUDA graphs of fn(i) for each input set i: replaying one is the run."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for i in range(sets):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(i)
        graphs.append(g)
    return lambda i: graphs[i % sets].replay()


def layer(x, w, bias, bank):
    idx, wt = biased_grouped_topk(router_gemm(x, w), bias)
    return experts_loop(x, idx, wt, bank)


# --- timing ---------------------------------------------------------------

class Timer:
    def __init__(self, iters, budget):
        self.iters, self.budget = iters, budget
        self.flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def _pass(self, fn, n):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            self.flush.fill_(i)
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]  # us

    def measure(self, fn):
        fn(0)
        torch.cuda.synchronize()
        est = self._pass(fn, 1)[0]
        n = min(self.iters, max(int(self.budget * 1e6 / max(est, 1e-3)), min(5, self.iters)))
        return self._pass(fn, n)


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(p / 100 * (len(s) - 1) + 0.5)))]


def copy_bandwidth(n=2 << 30, reps=10):
    a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(0x5A)
    b = torch.empty_like(a)
    b.copy_(a)
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / (statistics.median(ts) / 1e3)


def triton_peer(tri, t, xs, routed, fused_ids, peers, tm, add, res):
    """Times the Triton peer at one T: each config of the sweep briefly, then
    the best one eager and as CUDA graphs, bf16 and block-FP8."""
    tm_mod, gub, gub_s, dnb, dnb_s = tri
    gu_t, dn_t = peers[0], peers[1]  # K-major views of the bf16 bank
    gu, dn = gu_t.transpose(1, 2), dn_t.transpose(1, 2)
    t_count = xs[0].shape[0]
    slot_w = [torch.cat([wt, torch.ones(t_count, 1, device="cuda")], dim=1) for _, wt in routed]
    quick = Timer(5, 0.05)
    for name, fp8 in (("triton", None), ("triton_fp8", (gub_s, dnb_s))):
        wgu, wdn = (gu, dn) if fp8 is None else (gub, dnb)
        best = None
        for cfg in tm_mod.CONFIGS:
            if fp8 is not None and cfg["BLOCK_N"] % 64:
                continue
            align = lambda ids, bm=cfg["BLOCK_M"]: align_block_size(ids, E + REPLICAS, bm, graphable=True)
            fn = lambda i, cfg=cfg, align=align: tm_mod.experts_triton(
                xs[i % XSETS], fused_ids[i % XSETS], slot_w[i % XSETS], wgu, wdn, align, cfg, fp8)
            try:
                us = statistics.median(quick.measure(fn))
            except Exception as e:  # noqa: BLE001
                res["notes"].append(f"{name} T={t} {cfg}: {type(e).__name__}: {e}"[:300])
                print(res["notes"][-1], flush=True)
                continue
            if best is None or us < best[0]:
                best = (us, cfg, fn)
        if best is None:
            continue
        _, cfg, fn = best
        if t <= 16:
            ref = experts_grouped(xs[0], fused_ids[0], slot_w[0], gu_t, dn_t)
            got = fn(0)
            rel = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            res["notes"].append(f"{name} T={t}: rel_l2 {rel:.2e} against the torch._grouped_mm engine")
            print(res["notes"][-1], flush=True)
        shown = dict(cfg, BLOCK_K=tm_mod.QB if fp8 is not None else cfg["BLOCK_K"])  # FP8 steps one scale block
        note = "BLOCK_M {BLOCK_M} BLOCK_N {BLOCK_N} BLOCK_K {BLOCK_K} warps {num_warps} stages {num_stages}".format(**shown)
        try:
            add(name, t, "eager", tm.measure(fn), note)
            add(name, t, "graph", tm.measure(graphed(fn)), note)
        except Exception as e:  # noqa: BLE001
            res["notes"].append(f"{name} T={t}: {type(e).__name__}: {e}"[:300])
            print(res["notes"][-1], flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1,16,128,1024,4096")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of device time per measurement")
    ap.add_argument("--loop-budget", type=float, default=2.0, help="seconds per per-expert-loop measurement")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune-no-cudagraphs")
    ap.add_argument("--compile-cap", type=float, default=120.0, help="stop compiling once this many seconds went into it")
    ap.add_argument("--json", default="")
    ap.add_argument("--no-grouped", action="store_true", help="skip the torch._grouped_mm / _scaled_grouped_mm peers")
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton fused-MoE peer")
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    res = {"tool": "torch", "torch": torch.__version__, "device": f"{dev.name} ({dev.multi_processor_count} SMs, "
           f"{dev.total_memory / 2**30:.1f} GiB)", "rows": [], "notes": [], "compile_seconds": {}, "compile_mode": a.compile_mode}
    began = time.time()
    res["copy_gbps"] = copy_bandwidth() / 1e9
    print(f"torch {torch.__version__} on {res['device']}: copy {res['copy_gbps']:.0f} GB/s", flush=True)

    bf = torch.bfloat16
    # moeprep bench's router and inputs (see moeprep_router); torch's own draws
    # only if they cannot be reproduced here.
    draws = "moeprep"
    try:
        w_router, bias = moeprep_router()
        why = moeprep_draws_check(w_router, bias)
    except Exception as e:  # noqa: BLE001 - no numpy, say: fall back, with a note
        why = f"moeprep draws unavailable: {type(e).__name__}: {e}"
    if why:
        draws = "torch"
        res["notes"].append(why[:300] + "; the peers use torch's own draws")
        print(res["notes"][-1], flush=True)
        w_router = torch.empty(E, H, dtype=bf, device="cuda").uniform_(-(3 / H) ** 0.5, (3 / H) ** 0.5)
        bias = torch.empty(E, device="cuda").uniform_(-0.05, 0.05)
    res["draws"] = draws
    # The fused 264-expert bank (256 routed, then the shared expert 8 times),
    # one copy: the per-expert loop's routed bank and shared MLP are views of it.
    gu = torch.empty(E + REPLICAS, 2 * I, H, dtype=bf, device="cuda").normal_(0, 0.02)
    dn = torch.empty(E + REPLICAS, H, I, dtype=bf, device="cuda").normal_(0, 0.02)
    gu[E + 1:] = gu[E]
    dn[E + 1:] = dn[E]
    bank = (gu[:E], dn[:E], gu[E], dn[E])
    peers, tri = None, None
    if not a.no_grouped:
        try:
            gu8, gu_s = fp8_rowwise(gu)
            dn8, dn_s = fp8_rowwise(dn)
            peers = (gu.transpose(1, 2), dn.transpose(1, 2), gu8.transpose(1, 2), gu_s, dn8.transpose(1, 2), dn_s)
        except Exception as e:  # noqa: BLE001 - a missing op or memory is a note, not the end of the run
            res["notes"].append(f"grouped peers not built: {type(e).__name__}: {e}"[:300])
            print(res["notes"][-1], flush=True)
    if not a.no_triton:
        try:
            import triton_moe
            gub, gub_s = triton_moe.quant_blocks(gu)
            dnb, dnb_s = triton_moe.quant_blocks(dn)
            tri = (triton_moe, gub, gub_s, dnb, dnb_s)
        except Exception as e:  # noqa: BLE001
            res["notes"].append(f"triton peer not built: {type(e).__name__}: {e}"[:300])
            print(res["notes"][-1], flush=True)
    tm = Timer(a.iters, a.budget)
    loop_tm = Timer(a.iters, a.loop_budget)

    compiled = {}
    if not a.no_compile:
        for name, fn in (("router_gemm", router_gemm), ("gate", biased_grouped_topk), ("align", align_block_size)):
            compiled[name] = torch.compile(fn, dynamic=True, mode=a.compile_mode)
    compile_spent = 0.0

    def add(kernel, t, impl, us, note=""):
        row = {"kernel": kernel, "tokens": t, "impl": impl, "us": statistics.median(us), "us_p10": pct(us, 10),
               "us_p90": pct(us, 90), "iters": len(us)}
        if note:
            row["note"] = note
        res["rows"].append(row)
        print(f"T={t:5d} {kernel:12s} {impl:8s} {row['us']:10.1f} us  (p10 {row['us_p10']:.1f}, p90 {row['us_p90']:.1f}, "
              f"{len(us)} runs)", flush=True)

    with torch.no_grad():
        for t in tokens:
            if draws == "moeprep":
                xs = [moeprep_x(t, i) for i in range(XSETS)]
            else:
                xs = [torch.randn(t, H, dtype=bf, device="cuda") for _ in range(XSETS)]
            logits = [router_gemm(x, w_router) for x in xs]
            routed = [biased_grouped_topk(lg, bias) for lg in logits]
            shared = (E + torch.arange(t, device="cuda") % REPLICAS).unsqueeze(1)
            fused_ids = [torch.cat([idx, shared], dim=1) for idx, _ in routed]
            res.setdefault("touched_experts", {})[str(t)] = statistics.mean(int(torch.unique(f).numel()) for f in fused_ids)
            ops = {
                "router_gemm": (router_gemm, lambda i, f: f(xs[i % XSETS], w_router)),
                "gate": (biased_grouped_topk, lambda i, f: f(logits[i % XSETS], bias)),
                "align": (align_block_size, lambda i, f: f(fused_ids[i % XSETS])),
            }
            for name, (fn, call) in ops.items():
                add(name, t, "eager", tm.measure(lambda i: call(i, fn)))
                if name in compiled:
                    if compile_spent > a.compile_cap:
                        res["notes"].append(f"{name} T={t}: compile skipped, {compile_spent:.0f} s spent compiling")
                        continue
                    c0 = time.time()
                    out_c = call(0, compiled[name])
                    torch.cuda.synchronize()
                    spent = time.time() - c0
                    compile_spent += spent
                    res["compile_seconds"][f"{name}@{t}"] = round(spent, 2)
                    if name == "gate":
                        ref = call(0, fn)
                        same = torch.equal(out_c[0].sort(dim=1)[0], ref[0].sort(dim=1)[0])
                        if not same:
                            res["notes"].append(f"gate T={t}: compiled ids differ from eager")
                    add(name, t, "compile", tm.measure(lambda i: call(i, compiled[name])))
            add("experts", t, "eager", loop_tm.measure(
                lambda i: experts_loop(xs[i % XSETS], routed[i % XSETS][0], routed[i % XSETS][1], bank)))
            add("layer", t, "eager", loop_tm.measure(lambda i: layer(xs[i % XSETS], w_router, bias, bank)))
            if peers is not None:
                gu_t, dn_t, gu8_t, gu_s, dn8_t, dn_s = peers
                slot_w = [torch.cat([wt, torch.ones(t, 1, device="cuda")], dim=1) for _, wt in routed]
                runs = {
                    "grouped": lambda i: experts_grouped(xs[i % XSETS], fused_ids[i % XSETS], slot_w[i % XSETS], gu_t, dn_t),
                    "scaled_grouped": lambda i: experts_scaled_grouped(xs[i % XSETS], fused_ids[i % XSETS], slot_w[i % XSETS],
                                                                       gu8_t, gu_s, dn8_t, dn_s),
                }
                for name, fn in runs.items():
                    try:
                        if name == "grouped" and t <= 16:
                            ref = experts_loop(xs[0], routed[0][0], routed[0][1], bank)
                            got = fn(0)
                            rel = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
                            res["notes"].append(f"grouped T={t}: rel_l2 {rel:.2e} against the per-expert loop")
                            print(res["notes"][-1], flush=True)
                        add(name, t, "eager", tm.measure(fn))
                        add(name, t, "graph", tm.measure(graphed(fn)))
                    except Exception as e:  # noqa: BLE001
                        res["notes"].append(f"{name} T={t}: {type(e).__name__}: {e}"[:300])
                        print(res["notes"][-1], flush=True)
                del slot_w
            if tri is not None:
                triton_peer(tri, t, xs, routed, fused_ids, peers, tm, add, res)
            del xs, logits, routed, fused_ids
    res["notes"].append("experts/layer: torch.compile not timed (the per-expert loop is data-dependent: "
                        "a graph break per hit expert)")
    res["seconds"] = time.time() - began
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(f"done in {res['seconds']:.0f} s; compile {compile_spent:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
