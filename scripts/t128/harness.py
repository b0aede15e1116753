#!/usr/bin/env python3
"""T = 128 study (GEMM_NOTES.md, issue 13 pass 7): moeprep's mma3 grouped GEMM
kernels (the shipped fatbin and variants: sm_90a cubins of scripts/t128/m3var.cu or
of mk_m3only.sh's copy of grouped_gemm.cu's mma3 kernels under -D M3_...)
beside the Triton fused-MoE peer (bench/triton_moe.py), in one process, on
two routings (bench/torch_ref.py's biased grouped top-k + the fused shared
slot, on torch_ref's draws of x, router weight and bias, and on moeprep
bench's draws of them), one bank, under the bench's conditions: a 256 MiB buffer
overwritten before each run (outside the events), 4 rotating input sets, 2
rotating bank copies, CUDA events, medians; engines rotate within each round.

moeprep kernels are launched through the driver API (ctypes on libcuda), with
the launch geometry and dynamic shared memory the Go side would use.

usage: harness.py OUTDIR SHIPPED_FATBIN NAME=CUBIN[:GU_STAGES:DN_STAGES:BK:GU_BN:DN_BN:COLS_FAST:PDL] ...
"""
import ctypes
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, "bench")
import torch_ref as tr  # noqa: E402
import triton_moe as tm  # noqa: E402

H, I, E, G, TOPK = tr.H, tr.I, tr.E, tr.E + tr.REPLICAS, tr.TOPK
T = int(os.environ.get("T128_TOKENS", "128"))
ROUNDS = int(os.environ.get("T128_ROUNDS", "25"))
SLOTS = TOPK + 1

cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {r} {s.value}")


class LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("val", ctypes.c_uint8 * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint32), ("gy", ctypes.c_uint32), ("gz", ctypes.c_uint32),
                ("bx", ctypes.c_uint32), ("by", ctypes.c_uint32), ("bz", ctypes.c_uint32),
                ("smem", ctypes.c_uint32), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttr)), ("nattrs", ctypes.c_uint32)]


class Module:
    def __init__(self, path):
        self.img = open(path, "rb").read()
        self.mod = ctypes.c_void_p()
        ck(cu.cuModuleLoadData(ctypes.byref(self.mod), self.img), f"load {path}")
        self.fns = {}

    def fn(self, name, smem):
        if name not in self.fns:
            f = ctypes.c_void_p()
            ck(cu.cuModuleGetFunction(ctypes.byref(f), self.mod, name.encode()), name)
            if smem > 48 * 1024:
                ck(cu.cuFuncSetAttribute(f, 8, smem), "smem attr")
            self.fns[name] = f
        return self.fns[name]


def pack(args):
    vals = []
    for a in args:
        if isinstance(a, tuple):
            kind, v = a
            vals.append(ctypes.c_int64(v) if kind == "i64" else ctypes.c_int32(v))
        else:
            vals.append(ctypes.c_uint64(a))
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    return vals, ptrs


def launch(f, grid, block, smem, args, pdl=False):
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    vals, ptrs = pack(args)
    if not pdl:
        ck(cu.cuLaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, smem, stream, ptrs, None), "launch")
        return
    at = LaunchAttr()
    at.id = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    at.val[0] = 1
    cfg = LaunchConfig(grid[0], grid[1], grid[2], block, 1, 1, smem, stream, ctypes.pointer(at), 1)
    ck(cu.cuLaunchKernelEx(ctypes.byref(cfg), f, ptrs, None), "launchEx")


class Engine:
    """One build of moeprep's mma3 kernels and its launch geometry."""

    def __init__(self, name, path, gs=4, ds=4, bk=64, gbn=64, dbn=64, cols_fast=0, pdl=0, pdl_launch=False):
        self.name, self.mod = name, Module(path)
        self.gs, self.ds, self.bk, self.gbn, self.dbn = gs, ds, bk, gbn, dbn
        self.cols_fast, self.pdl, self.pdl_launch = cols_fast, pdl, pdl_launch
        self.gsmem = gs * (16 + 2 * gbn) * bk * 2
        self.dsmem = ds * (16 + dbn) * bk * 2
        self.gfn = self.mod.fn("moe_gate_up_mma3_bf16_bf16", self.gsmem)
        self.dfn = self.mod.fn("moe_down_mma3_bf16_bf16", self.dsmem)

    def grid(self, rows, n, bn):
        cols = (n + bn - 1) // bn
        return (cols, rows, 1) if self.cols_fast else (rows, cols, 1)

    def gate_up(self, al, x, gu, inter):
        sorted_ids, expert_ids, total = al
        rows = (sorted_ids.numel() + 15) // 16
        args = [sorted_ids.data_ptr(), expert_ids.data_ptr(), total.data_ptr(), x.data_ptr(), gu.data_ptr(),
                gu.data_ptr() + I * H * 2, ("i64", 2 * I * H), 0, 0, ("i64", 0), inter.data_ptr(),
                ("i32", T * SLOTS), ("i32", SLOTS), ("i32", I), ("i32", H), ("i32", 16), ("i32", G)]
        launch(self.gfn, self.grid(rows, I, self.gbn), 128, self.gsmem, args)

    def down(self, al, inter, dn, out):
        sorted_ids, expert_ids, total = al
        rows = (sorted_ids.numel() + 15) // 16
        args = [sorted_ids.data_ptr(), expert_ids.data_ptr(), total.data_ptr(), inter.data_ptr(), dn.data_ptr(),
                ("i64", I * H), 0, ("i64", 0), out.data_ptr(), ("i32", T * SLOTS), ("i32", H), ("i32", I),
                ("i32", 16), ("i32", G)]
        launch(self.dfn, self.grid(rows, H, self.dbn), 128, self.dsmem, args, pdl=self.pdl_launch)


splitmix_uniform, bf16_tensor = tr.splitmix_uniform, tr.bf16_tensor  # moeprep bench's draws


class Routing:
    """Four input sets, their routing (biased grouped top-k + the fused shared
    slot), slot weights and block-16 alignments."""

    def __init__(self, name, xs, w_router, bias):
        self.name, self.xs = name, xs
        routed = [tr.biased_grouped_topk(tr.router_gemm(x, w_router), bias) for x in xs]
        shared = (E + torch.arange(T, device="cuda") % tr.REPLICAS).unsqueeze(1)
        self.fused = [torch.cat([idx, shared], dim=1) for idx, _ in routed]
        self.slot_w = [torch.cat([wt, torch.ones(T, 1, device="cuda")], dim=1) for _, wt in routed]
        self.touched = [int(torch.unique(f).numel()) for f in self.fused]
        self.als = []
        for f in self.fused:
            s, e, tot = tr.align_block_size(f, G, 16, graphable=True)
            self.als.append((s, e, tot, tot.to(torch.int32)))


def main():
    outdir, shipped = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(0), "T": T, "rounds": ROUNDS, "notes": []}
    bf = torch.bfloat16
    # torch_ref's draws, in its order (so the same routing as its Triton peer).
    w_router = torch.empty(E, H, dtype=bf, device="cuda").uniform_(-(3 / H) ** 0.5, (3 / H) ** 0.5)
    bias = torch.empty(E, device="cuda").uniform_(-0.05, 0.05)
    gu0 = torch.empty(G, 2 * I, H, dtype=bf, device="cuda").normal_(0, 0.02)
    dn0 = torch.empty(G, H, I, dtype=bf, device="cuda").normal_(0, 0.02)
    gu0[E + 1:] = gu0[E]
    dn0[E + 1:] = dn0[E]
    banks = [(gu0, dn0), (gu0.clone(), dn0.clone())]
    routings = [Routing("torch", [torch.randn(T, H, dtype=bf, device="cuda") for _ in range(4)], w_router, bias)]
    # moeprep bench's draws (bench/run.go, layer.go: splitmix64 seeds 11, 12, 1000 T + i).
    import numpy as np
    wr_m = bf16_tensor(splitmix_uniform(11, E * H, np.float32(np.sqrt(3 / H))), (E, H))
    bias_m = torch.from_numpy(splitmix_uniform(12, E, 0.05)).cuda()
    xs_m = [bf16_tensor(splitmix_uniform(1000 * T + i, T * H, 1.7), (T, H)) for i in range(4)]
    # Check against values printed by bench.RandBF16 / RandF32 in Go.
    got = (xs_m[0].view(torch.int16).flatten()[:8].cpu().numpy().view(np.uint16).tolist() if T == 128 else None,
           wr_m.view(torch.int16).flatten()[:4].cpu().numpy().view(np.uint16).tolist(),
           [round(v, 6) for v in bias_m[:4].tolist()])
    want = ([48923, 16146, 49033, 15901, 16183, 48979, 49014, 48866] if T == 128 else None,
            [48118, 48159, 15289, 14662], [0.00791, 0.043946, -0.026526, 0.040484])
    res["notes"].append(f"moeprep draws {'match' if got == want else 'DIFFER: ' + str(got)} Go's")
    print(res["notes"][-1], flush=True)
    routings.append(Routing("moeprep", xs_m, wr_m, bias_m))
    for rt in routings:
        res[f"touched_{rt.name}"] = rt.touched
        print(f"{rt.name} routing at T={T}: experts touched {rt.touched} (mean {statistics.mean(rt.touched):.2f})", flush=True)
    cfg = dict(tm.CONFIGS[0])
    numel = T * SLOTS
    inter = torch.empty(numel, I, dtype=bf, device="cuda")
    out = torch.empty(numel, H, dtype=torch.float32, device="cuda")
    mid = torch.empty(numel, 2 * I, dtype=bf, device="cuda")
    flush = torch.empty(tr.FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    engines = [Engine("shipped", shipped)]
    for spec in sys.argv[3:]:
        name, rest = spec.split("=", 1)
        parts = rest.split(":")
        keys = ["gs", "ds", "bk", "gbn", "dbn", "cols_fast", "pdl"]
        kw = dict(zip(keys, [int(v) for v in parts[1:]]))
        engines.append(Engine(name, parts[0], **kw))
        if kw.get("pdl"):
            engines.append(Engine(name + "+launch", parts[0], pdl_launch=True, **kw))

    # Correctness: every engine's intermediate and output bit-identical to the shipped kernels'.
    for rt in routings:
        ref = None
        for en in engines:
            inter.view(torch.int16).fill_(0x7fc1)
            out.view(torch.int32).fill_(0x7fc00001)
            al = rt.als[0][:2] + (rt.als[0][3],)
            en.gate_up(al, rt.xs[0], banks[0][0], inter)
            en.down(al, inter, banks[0][1], out)
            torch.cuda.synchronize()
            got = (inter.view(torch.int16).clone(), out.view(torch.int32).clone())
            if ref is None:
                ref = got
                bad = int((got[0] == 0x7fc1).sum()) + int((got[1] == 0x7fc00001).sum())
                res["notes"].append(f"{rt.name} routing, shipped: {bad} poison words left")
            else:
                d0 = int((got[0] != ref[0]).sum())
                d1 = int((got[1] != ref[1]).sum())
                res["notes"].append(f"{rt.name} routing, {en.name}: {d0} inter / {d1} out words differ from shipped")
            print(res["notes"][-1], flush=True)
        # Sanity against the Triton peer: silu(g)*u from Triton's gate_up vs moeprep's intermediate.
        s, e, tot, _ = rt.als[0]
        tm.moe_gemm(rt.xs[0], banks[0][0], mid, s, e, tot, numel, SLOTS, cfg)
        g, u = mid.float().chunk(2, dim=-1)
        act = torch.nn.functional.silu(g) * u
        rel = ((act - ref[0].view(bf).view(numel, I).float()).norm() / act.norm()).item()
        res["notes"].append(f"{rt.name} routing: moeprep intermediate vs Triton's silu(g)*u: rel_l2 {rel:.2e}")
        print(res["notes"][-1], flush=True)

    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    def run_moeprep(en, rt, i):
        gu, dn = banks[i % 2]
        s, e, _, t32 = rt.als[i % 4]
        al = (s, e, t32)
        es = [ev() for _ in range(3)]
        es[0].record()
        en.gate_up(al, rt.xs[i % 4], gu, inter)
        es[1].record()
        en.down(al, inter, dn, out)
        es[2].record()
        return es

    def run_triton(rt, i, split, full):
        gu, dn = banks[i % 2]
        s, e, tot, _ = rt.als[i % 4]
        x, ids, w = rt.xs[i % 4], rt.fused[i % 4], rt.slot_w[i % 4]
        es = []

        def mark(always=False):
            if split or always:
                es.append(ev())
                es[-1].record()

        mark(True)
        if full:
            s, e, tot = tr.align_block_size(ids, G, 16, graphable=True)
            mark()
        tm.moe_gemm(x, gu, mid, s, e, tot, numel, SLOTS, cfg)
        mark()
        g, u = mid.chunk(2, dim=-1)
        a = torch.nn.functional.silu(g) * u
        mark()
        o = torch.empty(numel, H, dtype=bf, device="cuda")
        tm.moe_gemm(a, dn, o, s, e, tot, numel, 1, cfg, w=w.reshape(-1).float())
        if full:
            mark()
            o.view(T, SLOTS, H).sum(dim=1)
        mark(True)
        return es

    jobs = []
    for rt in routings:
        for en in engines:
            jobs.append((f"{rt.name}/{en.name}", lambda i, en=en, rt=rt: run_moeprep(en, rt, i)))
        jobs.append((f"{rt.name}/triton", lambda i, rt=rt: run_triton(rt, i, True, False)))
        jobs.append((f"{rt.name}/triton_layer", lambda i, rt=rt: run_triton(rt, i, False, True)))
        jobs.append((f"{rt.name}/triton_layer_split", lambda i, rt=rt: run_triton(rt, i, True, True)))
    for _, fn in jobs:  # warm-up (Triton compiles here)
        fn(0)
    torch.cuda.synchronize()
    times = {name: [] for name, _ in jobs}
    t0 = time.time()
    for r in range(ROUNDS):
        order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]
        pending = []
        for name, fn in order:
            flush.fill_(r)
            pending.append((name, fn(r)))
        torch.cuda.synchronize()
        for name, es in pending:
            times[name].append([es[k].elapsed_time(es[k + 1]) * 1e3 for k in range(len(es) - 1)])
    res["seconds_timing"] = time.time() - t0
    rows = {}
    for name, ts in times.items():
        tot = sorted(sum(t) for t in ts)
        rows[name] = {"segments": [statistics.median(c) for c in zip(*ts)], "total": statistics.median(tot),
                      "p10": tot[len(tot) // 10], "p90": tot[-1 - len(tot) // 10]}
    res["rows"] = rows
    with open(os.path.join(outdir, f"harness_T{T}.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nmedians of {ROUNDS} rounds, us: total (p10, p90) | segments "
          "(moeprep: gate_up, down; triton: gate_up, silu*u, down; layer_split: align, gate_up, silu*u, down, sum)")
    for name, row in rows.items():
        print(f"{name:28s} {row['total']:8.1f} ({row['p10']:7.1f}, {row['p90']:7.1f}) | "
              + " ".join(f"{v:7.1f}" for v in row["segments"]))


if __name__ == "__main__":
    main()
