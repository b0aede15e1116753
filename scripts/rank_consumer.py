#!/usr/bin/python3
"""An independent consumer of moeprep's per-rank output (--ep N [--moe-tp M]).

    /usr/bin/python3 scripts/rank_consumer.py DST [--golden DIR] [--replica first|last|both]
                                               [--backend gloo --device cpu | --backend nccl --device cuda]

One command starts the contract's N*M ranks (torch.multiprocessing, one process a rank; with nccl one
a GPU). Each process opens only what a serving rank would: DST/config.json, the shared index and the
shared shards' routers (and, on rank 0, an unfused shared expert), and its own rank-0000r-of-0000K/
directory; it records every byte it reads. It routes every golden token with the family's router
(written here from the papers' and transformers' formulas, not from moeprep's Go code), serves each
token's logical experts with one replica each (the first or the last slot holding the expert), runs its
local slots' SiLU-gated MLPs (gpt-oss's clamped form with its expert biases, the down bias on MoE-TP
part 0 alone) on its part of the intermediate dimension, and all-reduces the partial
outputs. Rank 0 compares the sum with the transformers MoE block output recorded in the golden
(reference/moe-layer-L.safetensors: x, y), in float64, and the script exits 0 only when every layer
is within --tol.

Needs torch with torch.distributed (Debian's python3-torch has gloo); reads safetensors itself (the
format is an 8-byte header length, a JSON header, and the raw bytes), so no other package.
"""

import argparse
import json
import math
import os
import re
import socket
import struct
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Default tolerance on relative L2 (DEVELOPMENT.md says the same): the weights are
# bf16 values held exactly in float32 and every product and sum is float32, as in the golden's
# transformers run; only the order of the float32 sums differs (split over ranks, over the M
# intermediate parts, over slots), each ~H or ~I terms long, so the two outputs differ by a few
# float32 ulps, ~1e-6 relative. 1e-5 leaves headroom for that and is still four orders of magnitude
# under what one wrong expert, one wrong slice or one token routed elsewhere does (>1e-2).
DEFAULT_TOL = 1e-5


class Reader:
    """Reads safetensors tensors by seeking to their bytes, counting every byte read per file."""

    def __init__(self, root):
        self.root = root
        self.bytes = {}  # path relative to root -> bytes read
        self.headers = {}

    def _read(self, rel, offset, n):
        path = os.path.join(self.root, rel)
        with open(path, "rb") as f:
            f.seek(offset)
            b = f.read(n)
        if len(b) != n:
            raise ValueError(f"{path}: wanted {n} bytes at {offset}, file holds {len(b)}")
        self.bytes[rel] = self.bytes.get(rel, 0) + n
        return b

    def json(self, rel):
        path = os.path.join(self.root, rel)
        size = os.path.getsize(path)
        return json.loads(self._read(rel, 0, size))

    def header(self, rel):
        if rel not in self.headers:
            size = os.path.getsize(os.path.join(self.root, rel))
            (n,) = struct.unpack("<Q", self._read(rel, 0, 8))
            if n > size - 8 or n > 100 << 20:
                raise ValueError(f"{rel}: header length {n} past the file's {size} bytes")
            h = json.loads(self._read(rel, 8, n))
            h.pop("__metadata__", None)
            self.headers[rel] = (8 + n, size, h)
        return self.headers[rel]

    def has(self, rel, name):
        return name in self.header(rel)[2]

    def tensor(self, rel, name):
        base, size, h = self.header(rel)
        if name not in h:
            raise KeyError(f"{rel}: no tensor {name}")
        e = h[name]
        a, b = e["data_offsets"]
        shape = e["shape"]
        dt = e["dtype"]
        width = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4}.get(dt)
        if width is None:
            raise ValueError(f"{rel}: {name} has dtype {dt}, which this consumer does not read")
        if b - a != width * math.prod(shape) or base + b > size or a < 0:
            raise ValueError(f"{rel}: {name} {dt}{shape} has bytes [{a},{b}) of a {size - base}-byte body")
        raw = bytearray(self._read(rel, base + a, b - a))
        if dt == "BF16":
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).float()
        elif dt == "F16":
            t = torch.frombuffer(raw, dtype=torch.float16).float()
        elif dt == "F32":
            t = torch.frombuffer(raw, dtype=torch.float32).clone()
        elif dt == "I32":
            t = torch.frombuffer(raw, dtype=torch.int32).clone()
        else:
            t = E4M3[torch.frombuffer(raw, dtype=torch.uint8).long()]
        return t.reshape(shape)


def e4m3_table():
    """The 256 float8 e4m3fn values (bias 7, no infinities, S.1111.111 is NaN)."""
    out = []
    for v in range(256):
        s = -1.0 if v & 0x80 else 1.0
        e = (v >> 3) & 0xF
        m = v & 7
        if e == 0xF and m == 7:
            out.append(float("nan"))
        elif e == 0:
            out.append(s * m / 8 * 2.0**-6)
        else:
            out.append(s * (1 + m / 8) * 2.0 ** (e - 7))
    return torch.tensor(out, dtype=torch.float32)


E4M3 = e4m3_table()


def dequant_blocks(w, scale, bo, bi):
    """w [rows, cols] float (e4m3 values) times its [ceil(rows/bo), ceil(cols/bi)] block grid."""
    rows, cols = w.shape
    if tuple(scale.shape) != (-(-rows // bo), -(-cols // bi)):
        raise ValueError(f"scale grid {list(scale.shape)} does not cover a [{rows}, {cols}] weight in {bo}x{bi} blocks")
    s = scale.repeat_interleave(bo, 0)[:rows].repeat_interleave(bi, 1)[:, :cols]
    return w * s


# ---------------------------------------------------------------------------------------------
# Routing, per family, from the source config (DST/config.json is SRC's plus the "moeprep" key).


def route(cfg, logits, bias):
    """Top-k logical expert ids [T,k] and their weights [T,k] (rsf not included)."""
    mt = cfg.get("model_type", "")
    k = cfg["num_experts_per_tok"]
    if mt in ("deepseek_v3", "kimi_k2", "glm4_moe"):
        # DeepSeek-V3: sigmoid scores; the correction bias only chooses; experts chosen within the
        # topk_group groups whose two best biased scores sum highest; weights are the unbiased
        # scores, renormalised.
        scores = logits.sigmoid()
        choice = scores + bias if bias is not None else scores
        g = cfg.get("n_group", 1) or 1
        tg = cfg.get("topk_group", g) or g
        T, E = choice.shape
        grp = choice.view(T, g, E // g).topk(min(2, E // g), dim=-1).values.sum(-1)
        keep = torch.zeros(T, g, dtype=torch.bool)
        keep.scatter_(1, grp.topk(tg, dim=-1).indices, True)
        masked = choice.masked_fill(~keep.repeat_interleave(E // g, 1), float("-inf"))
        ids = masked.topk(k, dim=-1).indices
        w = scores.gather(1, ids)
        if cfg.get("norm_topk_prob", True):
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w
    if mt == "gpt_oss":
        # gpt-oss: the router has a bias; top-k of the logits, then softmax over those k alone
        top, ids = logits.topk(k, dim=-1)
        return ids, top.softmax(dim=-1)
    if mt in ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe"):
        # softmax over all experts, top-k; Mixtral always renormalises, Qwen as norm_topk_prob says
        p = logits.softmax(dim=-1)
        w, ids = p.topk(k, dim=-1)
        if mt == "mixtral" or cfg.get("norm_topk_prob", False):
            w = w / w.sum(-1, keepdim=True)
        return ids, w
    raise ValueError(f"model_type {mt!r}: this consumer routes deepseek_v3, qwen3_moe, qwen2_moe, mixtral, olmoe, gpt_oss")


def router_names(cfg, prefix):
    """The router's weight and its bias (DeepSeek's correction bias, which only chooses; gpt-oss's
    logit bias, which routing adds to the logits)."""
    if cfg.get("model_type") == "gpt_oss":
        return f"{prefix}.router.weight", f"{prefix}.router.bias"
    return f"{prefix}.gate.weight", f"{prefix}.gate.e_score_correction_bias"


# ---------------------------------------------------------------------------------------------
# The rank's stacks.

STACK_SUFFIXES = ("all_gate.weight", "all_up.weight", "all_down.weight", "gate_up_proj", "up_gate_proj", "down_proj")
# expert biases (gpt-oss, "expert_bias"): [n, I] gate and up (or [n, 2I] fused in the layout's order), [n, H] down.
# Under --moe-tp each part's gate and up biases are its rows; the down bias is on part 0 and zeros on the others
# (CONTRACT.md), so adding every part's down bias before the all-reduce adds it once.
BIAS_SUFFIXES = ("all_gate.bias", "all_up.bias", "all_down.bias", "gate_up_proj_bias", "up_gate_proj_bias", "down_proj_bias")


def stack_prefixes(prefix):
    # stacked keeps the MoE module's name P; gate-up and up-gate use transformers 5's (Mixtral's
    # block_sparse_moe becomes mlp): the contract's rule, restated.
    return [f"{prefix}.experts.", prefix.replace(".block_sparse_moe", ".mlp") + ".experts."]


def load_weight(rd, wmap, name, m):
    """A stack [n, out, in] as float32 (dequantised when FP8 block-scaled), in out-in orientation."""
    rel = wmap[name]
    w = rd.tensor(rel, name)
    quant = m.get("quantization", "none")
    if quant == "fp8_block_128x128":
        bo, bi = m.get("weight_block_size", [128, 128])
        sname = name + "_scale_inv"
        scale = rd.tensor(wmap[sname], sname)
        fused = name.endswith("gate_up_proj") or name.endswith("up_gate_proj")
        parts = []
        for n in range(w.shape[0]):
            wn, sn = w[n], scale[n]
            if m.get("orientation") == "in-out":
                wn, sn = wn.t(), sn.t()  # the grid is transposed with its weight
            if fused:  # two stacked grids, one a half (CONTRACT.md)
                half, gh = wn.shape[0] // 2, sn.shape[0] // 2
                d = torch.cat([dequant_blocks(wn[:half], sn[:gh], bo, bi), dequant_blocks(wn[half:], sn[gh:], bo, bi)])
            else:
                d = dequant_blocks(wn, sn, bo, bi)
            parts.append(d)
        return torch.stack(parts)
    if quant != "none":
        raise ValueError(f"quantization {quant}: this consumer reads bf16/f16/f32 and fp8_block_128x128 stacks")
    if m.get("orientation") == "in-out":
        w = w.transpose(1, 2)
    return w


def load_shared(rd, wmap, name, m):
    """A shared-file [out, in] weight as float32, dequantised where an FP8 block grid is beside it."""
    w = rd.tensor(wmap[name], name)
    sname = name + "_scale_inv"
    if sname in wmap:
        bo, bi = m.get("weight_block_size", [128, 128])
        w = dequant_blocks(w, rd.tensor(wmap[sname], sname), bo, bi)
    return w


def load_rank_layer(rd, wmap, prefix, m):
    """gate [n,i,H], up [n,i,H], down [n,H,i] of the rank's local bank for one MoE layer."""
    found = {}
    for p in stack_prefixes(prefix):
        for s in STACK_SUFFIXES:
            if p + s in wmap:
                found[s] = p + s
    if "all_gate.weight" in found:
        g = load_weight(rd, wmap, found["all_gate.weight"], m)
        u = load_weight(rd, wmap, found["all_up.weight"], m)
        d = load_weight(rd, wmap, found["all_down.weight"], m)
    elif "gate_up_proj" in found or "up_gate_proj" in found:
        key = "gate_up_proj" if "gate_up_proj" in found else "up_gate_proj"
        gu = load_weight(rd, wmap, found[key], m)
        half = gu.shape[1] // 2
        first, second = gu[:, :half], gu[:, half:]
        g, u = (first, second) if key == "gate_up_proj" else (second, first)
        d = load_weight(rd, wmap, found["down_proj"], m)
    else:
        raise ValueError(f"the rank's index has no expert stacks of {prefix}")
    return g, u, d


def load_rank_biases(rd, wmap, prefix):
    """gate [n,i], up [n,i], down [n,H] biases of the rank's local bank, or None where it has none."""
    found = {s: p + s for p in stack_prefixes(prefix) for s in BIAS_SUFFIXES if p + s in wmap}
    if not found:
        return None
    if "all_gate.bias" in found:
        return tuple(rd.tensor(wmap[found[s]], found[s]) for s in ("all_gate.bias", "all_up.bias", "all_down.bias"))
    key = "gate_up_proj_bias" if "gate_up_proj_bias" in found else "up_gate_proj_bias"
    gu = rd.tensor(wmap[found[key]], found[key])
    half = gu.shape[1] // 2
    first, second = gu[:, :half], gu[:, half:]
    g, u = (first, second) if key == "gate_up_proj_bias" else (second, first)
    return g, u, rd.tensor(wmap[found["down_proj_bias"]], found["down_proj_bias"])


def swiglu(x, g, u, d, act=None, b=None):
    """One expert on rows x: SwiGLU, or the contract's clamped form (gpt-oss's `activation`:
    g' = min(g, limit), u' = clamp(u, -limit, limit), g' * sigmoid(alpha g') * (u' + up_offset)),
    with the expert's biases b = (gate, up, down) where it has them."""
    hg, hu = x @ g.t(), x @ u.t()
    if b is not None:
        hg, hu = hg + b[0], hu + b[1]
    if act:
        alpha, limit, off = act.get("alpha", 1.0), act.get("limit"), act.get("up_offset", 0.0)
        if limit is not None:
            hg, hu = hg.clamp(max=limit), hu.clamp(min=-limit, max=limit)
        h = hg * torch.sigmoid(alpha * hg) * (hu + off)
    else:
        h = torch.nn.functional.silu(hg) * hu
    out = h @ d.t()
    return out + b[2] if b is not None else out


def clamped_swiglu(a):
    """Whether a contract activation is the clamped SwiGLU this consumer computes (gpt-oss's)."""
    return a is None or (isinstance(a, dict) and set(a) <= {"alpha", "limit", "up_offset"})


# ---------------------------------------------------------------------------------------------


def within(root, rel, allowed):
    rel = os.path.normpath(rel)
    if rel.startswith("..") or os.path.isabs(rel):
        raise ValueError(f"{rel}: outside {root}")
    if not any(rel == a or rel.startswith(a + os.sep) for a in allowed):
        raise ValueError(f"{rel}: not a file this rank may open ({allowed})")
    return rel


def worker(rank, args, world, port, result_dir):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank % max(1, torch.cuda.device_count())}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    rd = Reader(args.dst)
    ok = True
    try:
        cfg = rd.json("config.json")
        m = cfg["moeprep"]
        ep = m["expert_parallel"]
        me = ep["rank_files"][rank]
        if me["rank"] != rank:
            raise ValueError(f"rank_files[{rank}] says rank {me['rank']}")
        shared_idx = rd.json(ep["shared_index"])["weight_map"]
        shared_files = set(shared_idx.values())
        own_dir = os.path.dirname(me["index"])
        rank_idx = rd.json(within(args.dst, me["index"], [own_dir]))["weight_map"]
        rank_map = {k: within(args.dst, os.path.join(own_dir, v), [own_dir]) for k, v in rank_idx.items()}
        shared_map = {k: within(args.dst, v, sorted(shared_files)) for k, v in shared_idx.items()}

        # what this consumer computes: SwiGLU experts, or gpt-oss's clamped form with expert biases,
        # the routing weight on the output
        unsupported = [k for k in ("shared_activation", "routed_input_scaled", "output_scale", "zero_experts")
                       if m.get(k)] + [f"layers[{i}].{k}" for i, l in enumerate(m["layers"]) for k in ("activation", "shared_activation", "bank") if l.get(k)]
        if not clamped_swiglu(m.get("activation")):
            unsupported.append(f"activation {m['activation']}")
        if unsupported:
            raise ValueError(f"the contract says {', '.join(unsupported)}: this consumer runs SwiGLU experts (gpt-oss's clamped form too) only")
        act = m.get("activation")
        E = m["num_experts"]
        S, spr, first = ep["slots"], ep["slots_per_rank"], me["first_slot"]
        N = ep["ep"]
        rsf = m.get("routed_scaling_factor", 1.0)
        f = 1.0 if m.get("routed_scaling_factor_folded") else rsf
        sw = m.get("shared_slot_weight", 0.0)
        replicas = ["first", "last"] if args.replica == "both" else [args.replica]
        results = []
        for li, layer in enumerate(m["layers"]):
            L, prefix = layer["index"], layer["prefix"]
            p2l = ep["physical_to_logical_map"][li]
            if len(p2l) != S or sorted(set(p2l)) != list(range(E)):
                raise ValueError(f"layer {L}: physical_to_logical_map is not {S} slots covering {E} experts")
            # the tokens: rank 0 reads the golden and sends x, as attention would hand it over
            if rank == 0:
                gpath = os.path.join(args.golden, f"moe-layer-{L}.safetensors")
                gr = Reader(os.path.dirname(gpath))
                x = gr.tensor(os.path.basename(gpath), "x")
                y_ref = gr.tensor(os.path.basename(gpath), "y").double()
                ref_ids = gr.tensor(os.path.basename(gpath), "topk_ids") if gr.has(os.path.basename(gpath), "topk_ids") else None
                shape = torch.tensor(list(x.shape), dtype=torch.int64)
            else:
                shape = torch.zeros(2, dtype=torch.int64)
            shape = shape.to(device)
            dist.broadcast(shape, 0)
            T, H = shape.tolist()
            if rank != 0:
                x = torch.zeros(T, H)
            x = x.to(device)
            dist.broadcast(x, 0)

            wname, bname = router_names(cfg, prefix)
            W = rd.tensor(shared_map[wname], wname).to(device)
            bias = rd.tensor(shared_map[bname], bname).to(device) if bname in shared_map else None
            logits = x @ W.t()
            if cfg.get("model_type") == "gpt_oss":
                logits, bias = logits + bias, None
            ids, w = route(cfg, logits, bias)
            gate, up, down = (t.to(device) for t in load_rank_layer(rd, rank_map, prefix, m))
            eb = load_rank_biases(rd, rank_map, prefix)
            if m.get("expert_bias") and eb is None:
                raise ValueError(f"rank {rank} layer {L}: the contract says expert_bias, the rank has no bias stacks")
            eb = tuple(t.to(device) for t in eb) if eb is not None else None
            nslots = gate.shape[0]
            if nslots < spr:
                raise ValueError(f"rank {rank} layer {L}: {nslots} local slots, the contract says {spr}")
            for rep in replicas:
                # each logical expert served by one physical slot: its first or last replica
                serve = {}
                for p, e in enumerate(p2l):
                    if rep == "last" or e not in serve:
                        serve[e] = p
                phys = torch.tensor([serve[e] for e in range(E)], device=device)[ids]
                out = torch.zeros(T, H, device=device)
                for j in range(spr):
                    tok, kk = (phys == first + j).nonzero(as_tuple=True)
                    if tok.numel():
                        bj = (eb[0][j], eb[1][j], eb[2][j]) if eb is not None else None
                        out.index_add_(0, tok, w[tok, kk, None] * swiglu(x[tok], gate[j], up[j], down[j], act, bj))
                # fused shared expert (fuse-shared): the local slots after the routed ones are this EP
                # group's replica's slices; token t is served by replica t mod N, every slice of it
                if m.get("num_fused_shared_experts", 0):
                    tok = (torch.arange(T, device=device) % N == me["ep_rank"]).nonzero(as_tuple=True)[0]
                    for j in range(spr, nslots):
                        out.index_add_(0, tok, sw * swiglu(x[tok], gate[j], up[j], down[j]))
                out = out * f
                # an unfused shared expert is a shared-file tensor: rank 0 adds it once
                if rank == 0:
                    for sp in (f"{prefix}.shared_experts.", f"{prefix}.shared_expert."):
                        if sp + "gate_proj.weight" in shared_map:
                            sg, su, sd = (load_shared(rd, shared_map, sp + n + ".weight", m).to(device) for n in ("gate_proj", "up_proj", "down_proj"))
                            sh = swiglu(x, sg, su, sd)
                            gname = f"{prefix}.shared_expert_gate.weight"
                            if gname in shared_map:
                                sh = sh * (x @ rd.tensor(shared_map[gname], gname).to(device).t()).sigmoid()
                            out = out + sh
                dist.all_reduce(out)
                if rank == 0:
                    yd, rd64 = out.double().cpu(), y_ref
                    diff = yd - rd64
                    rel = (diff.norm() / rd64.norm()).item()
                    cos = (torch.dot(yd.flatten(), rd64.flatten()) / (yd.norm() * rd64.norm())).item()
                    maxabs = diff.abs().max().item()
                    same = None
                    if ref_ids is not None:
                        a, b = ids.cpu().sort(-1).values, ref_ids.long().sort(-1).values
                        same = int((a == b).all(-1).sum())
                    passed = rel <= args.tol  # NaN fails
                    ok = ok and passed
                    results.append({"layer": L, "replica": rep, "rel_l2": rel, "max_abs": maxabs, "cosine": cos,
                                    "tokens_routed_as_golden": same, "tokens": T, "pass": passed})
        read = {k: v for k, v in rd.bytes.items()}
        rank_bytes = sum(v for k, v in read.items() if k.startswith(own_dir + os.sep))
        rank_size = sum(os.path.getsize(os.path.join(args.dst, p)) for p in me["files"] + [me["index"]])
        summary = {"rank": rank, "files_read": read, "bytes_read": sum(read.values()), "own_dir_bytes_read": rank_bytes,
                   "own_dir_bytes": rank_size, "shared_bytes_read": sum(read.values()) - rank_bytes}
        if rank == 0:
            summary["layers"] = results
            summary["pass"] = ok
        with open(os.path.join(result_dir, f"rank-{rank}.json"), "w") as fh:
            json.dump(summary, fh)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dst", help="moeprep convert/fuse-shared --ep output")
    ap.add_argument("--golden", help="directory of moe-layer-L.safetensors (default DST/reference)")
    ap.add_argument("--replica", choices=["first", "last", "both"], default="both",
                    help="which replica serves an expert that has several (both: run each)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tol", type=float, default=DEFAULT_TOL, help="largest relative L2 error that passes")
    ap.add_argument("--json", help="write every rank's summary (bytes read, per-layer errors) to this file")
    args = ap.parse_args()
    args.dst = os.path.abspath(args.dst)
    args.golden = os.path.abspath(args.golden or os.path.join(args.dst, "reference"))
    with open(os.path.join(args.dst, "config.json")) as fh:
        ep = json.load(fh).get("moeprep", {}).get("expert_parallel")
    if not ep:
        sys.exit(f"{args.dst}: config.json has no moeprep.expert_parallel: not a per-rank (--ep) output")
    world = ep["ranks"]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(worker, args=(args, world, free_port(), tmp), nprocs=world, join=True)
        except mp.ProcessRaisedException as e:  # one line: the rank's error, not its traceback
            lines = [l for l in str(e).strip().splitlines() if l.strip()]
            sys.exit(f"rank_consumer: {lines[0].strip()} {lines[-1].strip()}")
        ranks = [json.load(open(os.path.join(tmp, f"rank-{r}.json"))) for r in range(world)]
    r0 = ranks[0]
    for r in ranks:
        print(f"rank {r['rank']}: read {r['bytes_read']} B: {r['own_dir_bytes_read']} of its directory's "
              f"{r['own_dir_bytes']} B, {r['shared_bytes_read']} B of config.json and the shared files; opened "
              f"{', '.join(sorted(r['files_read']))}")
    for l in r0["layers"]:
        print(f"layer {l['layer']} replica {l['replica']}: rel L2 {l['rel_l2']:.3e}  max abs {l['max_abs']:.3e}  "
              f"cosine {l['cosine']:.9f}  routed as golden {l['tokens_routed_as_golden']}/{l['tokens']}  "
              f"{'ok' if l['pass'] else 'FAIL'} (tol {args.tol:g})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(ranks, fh, indent=1)
    print("PASS" if r0["pass"] else "FAIL", f"{world} ranks, backend {args.backend}")
    sys.exit(0 if r0["pass"] else 1)


if __name__ == "__main__":
    main()
