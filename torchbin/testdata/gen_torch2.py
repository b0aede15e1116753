#!/usr/bin/env python3
"""Writes torch2.bin and torch2.json with torch >= 2.1 (ran on torch 2.11 on
the GPU machine; no GPU needed): a real state dict with bf16, float8 (saved
by torch through _rebuild_tensor_v3 and an untyped storage), uint16, a
transposed float8 view, tied weights and the _metadata attribute of a
module state dict. Usage: python3 gen_torch2.py OUTDIR
"""

import json
import os
import pickletools
import sys
import zipfile

import torch

torch.manual_seed(4321)
ST = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3",
      torch.float8_e5m2: "F8_E5M2", torch.uint16: "U16"}

out = sys.argv[1]
lin = torch.nn.Linear(4, 3).to(torch.bfloat16)
sd = lin.state_dict()
tied = torch.randn(2, 4).to(torch.bfloat16)
sd["f8_e4m3"] = torch.randn(2, 3).to(torch.float8_e4m3fn)
sd["f8_e5m2"] = torch.randn(4).to(torch.float8_e5m2)
sd["f8_t"] = torch.randn(3, 2).to(torch.float8_e4m3fn).t()
sd["u16"] = torch.randint(0, 65535, (3,), dtype=torch.int32).to(torch.uint16)
sd["scale_inv"] = torch.rand(2, 2) + 0.5
sd["embed.weight"] = tied
sd["lm_head.weight"] = tied
path = os.path.join(out, "torch2.bin")
torch.save(sd, path)


def row_major(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


exp = {"tensors": [{"name": k, "dtype": ST[v.dtype], "shape": list(v.shape),
                    "hex": row_major(v).hex()} for k, v in sd.items()], "skipped": []}
with open(os.path.join(out, "torch2.json"), "w") as f:
    json.dump(exp, f, indent=1)
    f.write("\n")
with zipfile.ZipFile(path) as z, open(os.path.join(out, "torch2_pickle.txt"), "w") as f:
    f.write("torch %s\n" % torch.__version__)
    for i in z.infolist():
        f.write("%s method=%d size=%d\n" % (i.filename, i.compress_type, i.file_size))
    pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
    pickletools.dis(z.read(pkl), out=f)
