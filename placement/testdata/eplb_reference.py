#!/usr/bin/env python3
"""Writes eplb_reference.json: skewed expert loads, and what DeepSeek's EPLB
(deepseek-ai/EPLB, eplb.py @d52c72d) places for them, so that placement's
tests compare against it without fetching anything at test time.

    python3 eplb_reference.py /path/to/EPLB > eplb_reference.json

Needs torch (Debian's python3-torch will do). The loads are drawn here with
Python's own seeded generator: Zipf-like counts over a random order of the
experts, as recorded routing is, with a case of ties."""
import json, random, sys

sys.path.insert(0, sys.argv[1])
import torch
from eplb import rebalance_experts

def zipf_layer(rng, e, a):
    order = list(range(e))
    rng.shuffle(order)
    out = [0] * e
    for i, p in enumerate(order):
        out[p] = int(1e6 / (i + 1) ** a * (0.8 + 0.4 * rng.random()))
    return out

cases = []
rng = random.Random(43)
for name, e, slots, gpus, nodes, groups, a, layers in [
    ("deepseek-r1 ep32 no redundancy", 256, 256, 32, 4, 8, 0.8, 6),
    ("deepseek-r1 ep36 288 slots", 256, 288, 36, 1, 8, 0.8, 6),
    ("deepseek-v3 hierarchical 4 nodes", 256, 320, 32, 4, 8, 0.8, 6),
    ("kimi-k2 ep64 global", 384, 448, 64, 8, 1, 1.0, 6),
    ("qwen3 ep8 mild skew", 128, 144, 8, 1, 1, 0.5, 6),
]:
    loads = [zipf_layer(rng, e, a) for _ in range(layers)]
    w = torch.tensor(loads, dtype=torch.float64)
    phy2log, _, logcnt = rebalance_experts(w, slots, groups, nodes, gpus)
    imb = []
    per = slots // gpus
    for l in range(layers):
        ranks = [0.0] * gpus
        for p in range(slots):
            ex = int(phy2log[l, p])
            ranks[p // per] += loads[l][ex] / int(logcnt[l, ex])
        mean = sum(ranks) / gpus
        imb.append((max(ranks) - mean) / mean)
    cases.append({"name": name, "experts": e, "slots": slots, "ep": gpus, "nodes": nodes, "n_group": groups,
                  "loads": loads, "eplb_physical_to_logical_map": phy2log.tolist(), "eplb_imbalance": imb})
json.dump({"source": "deepseek-ai/EPLB eplb.py @d52c72d, rebalance_experts(weight, slots, n_group, nodes, ep)",
           "cases": cases}, sys.stdout)
