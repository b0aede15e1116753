#!/usr/bin/env python3
"""Writes the binary statistics fixtures that placement's ReadStats tests
read, in the forms the engines write them, so the tests need no Python:

    cd placement/testdata && /usr/bin/python3 make_stats_fixtures.py

Needs torch (Debian's python3-torch). The safetensors files are written by
save_file below, the format's few lines (8-byte little-endian header length,
the JSON header, the data; the header padded with spaces to 8 bytes as the
safetensors library pads it), as safetensors.torch.save_file would write
them: the Python safetensors package was not on the machine that made them.

sglang/: what SGLang's expert-distribution recorder torch.saves in its stat
mode (python/sglang/srt/eplb/expert_distribution.py, _StatAccumulator.dump,
sgl-project/sglang@02295fe5ac5c): a dict of rank, logical_count (int32,
[passes][layers][experts]) and average_utilization_rate_over_window; and
refusals: a negative count, float counts, the per_token mode's records,
a 4-d tensor.

trtllm/: what TensorRT-LLM's ExpertStatistic writes
(tensorrt_llm/_torch/expert_statistic.py, NVIDIA/TensorRT-LLM@0fccc5b97dd7):
meta_info.json, and rank<R>.safetensors with one int64 bincount [experts]
per "<iteration>_<layer>"."""
import json, os, struct

import torch


def save_file(tensors, path):
    header, data = {}, b""
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        assert t.dtype == torch.int64
        raw = t.numpy().astype("<i8").tobytes()
        header[name] = {"dtype": "I64", "shape": list(t.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)

os.makedirs("sglang", exist_ok=True)
# 2 passes, 3 layers, 4 experts; layer 2 recorded no load.
lc = torch.tensor([[[1, 2, 3, 4], [0, 0, 7, 1], [0, 0, 0, 0]],
                   [[10, 20, 30, 40], [5, 0, 0, 1], [0, 0, 0, 0]]], dtype=torch.int32)
torch.save(dict(rank=0, logical_count=lc, average_utilization_rate_over_window=None), "sglang/stat.pt")
# One pass as [layers][experts], int64, saved as a non-contiguous view
# (a transpose) to exercise torchbin's strided reads.
torch.save(dict(logical_count=torch.tensor([[1, 3], [2, 4]], dtype=torch.int64).t()), "sglang/two_d.pt")
bad = lc.clone()
bad[1, 1, 2] = -5
torch.save(dict(rank=0, logical_count=bad), "sglang/negative.pt")
torch.save(dict(logical_count=lc.float()), "sglang/float.pt")
torch.save(dict(records=[dict(forward_pass_id=0, rank=0)], last_physical_to_logical_map=torch.zeros(3, 4, dtype=torch.int32)), "sglang/per_token.pt")
torch.save(dict(logical_count=lc.unsqueeze(0)), "sglang/four_d.pt")

os.makedirs("trtllm", exist_ok=True)
with open("trtllm/meta_info.json", "w") as f:
    json.dump({"num_experts": 4, "num_experts_per_token": 2}, f)
# Iterations 100 and 101 of MoE layers 3 and 5, on two ranks.
save_file({"100_3": torch.tensor([1, 0, 2, 1]), "100_5": torch.tensor([0, 4, 0, 0]),
           "101_3": torch.tensor([3, 0, 0, 1]), "101_5": torch.tensor([2, 2, 0, 0])}, "trtllm/rank0.safetensors")
save_file({"100_3": torch.tensor([0, 0, 0, 8]), "100_5": torch.tensor([1, 1, 1, 1]),
           "101_3": torch.tensor([5, 5, 0, 0]), "101_5": torch.tensor([0, 0, 6, 0])}, "trtllm/rank1.safetensors")

# The loads cmd/moeprep's TestConvertPerRankCommand writes as JSON for the
# qwen3-moe fixture (8 experts, MoE layers 1 and 2), recorded by two ranks
# over iterations 7 and 8: summed they are
# layer 1 [100, 1, 1, 1, 1, 1, 1, 50], layer 2 [1, 1, 1, 1, 1, 1, 90, 1].
os.makedirs("trtllm-qwen3", exist_ok=True)
with open("trtllm-qwen3/meta_info.json", "w") as f:
    json.dump({"num_experts": 8, "num_experts_per_token": 2}, f)
T = torch.tensor
save_file({"7_1": T([60, 1, 0, 0, 1, 0, 0, 20]), "8_1": T([40, 0, 0, 0, 0, 0, 0, 30]),
           "7_2": T([1, 1, 1, 1, 1, 1, 45, 1]), "8_2": T([0, 0, 0, 0, 0, 0, 45, 0])}, "trtllm-qwen3/rank0.safetensors")
save_file({"7_1": T([0, 0, 1, 1, 0, 1, 1, 0]), "8_1": T([0] * 8),
           "7_2": T([0] * 8), "8_2": T([0] * 8)}, "trtllm-qwen3/rank1.safetensors")
