#!/usr/bin/python3
"""Writes the torchbin test checkpoints. Run from this folder with Debian's
torch (apt-get install python3-torch python3-numpy; torch 1.13):

    /usr/bin/python3 gen.py

Each good checkpoint X.bin gets X.json: every tensor's name, safetensors
dtype, shape and row-major bytes in hex, so the Go tests compare bytes
exactly without python. Broken checkpoints have no .json: each Go test
asserts its own error. Seeds are fixed; the output is deterministic except
for zip timestamps, which the tests never look at.

torch2.bin/.json come from gen_torch2.py, run once on torch 2.11 (the real
float8/uint16 layout: _rebuild_tensor_v3 over torch.storage.UntypedStorage,
plus the byteorder and .data/ entries of torch 2.x archives).
"""

import collections
import io
import json
import os
import pickle
import struct
import sys
import types
import zipfile

import torch
import torch._utils

torch.manual_seed(1234)

ST_DTYPE = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def row_major_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def expect(path, tensors, skipped=()):
    """Writes path's .json from [(name, tensor)] in state-dict order."""
    out = {"tensors": [], "skipped": list(skipped)}
    for name, t in tensors:
        out["tensors"].append({
            "name": name, "dtype": ST_DTYPE[t.dtype], "shape": list(t.shape),
            "hex": row_major_bytes(t).hex()})
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def rand(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, dtype=torch.int64).to(dtype)
    return (torch.randn(shape) * 3).to(dtype)


def save_good(path, sd, tensors=None, skipped=()):
    torch.save(sd, path)
    expect(path, tensors if tensors is not None else list(sd.items()), skipped)


# ---- checkpoints written by torch itself ------------------------------------

def gen_dtypes():
    sd = collections.OrderedDict()
    for i, (dt, shape) in enumerate([
            (torch.float32, (3, 4)), (torch.float16, (5,)), (torch.bfloat16, (2, 3)),
            (torch.float64, (2, 2)), (torch.int64, (4,)), (torch.int32, (3,)),
            (torch.int16, (3,)), (torch.int8, (4,)), (torch.uint8, (5,)),
            (torch.bool, (6,))]):
        sd["t%d.%s" % (i, str(dt).replace("torch.", ""))] = rand(shape, dt)
    save_good("dtypes.bin", sd)


def gen_views():
    base = rand((3, 5), torch.float32)
    line = rand((10,), torch.bfloat16)
    cube = rand((2, 3, 4), torch.float16)
    row = rand((4,), torch.float32)
    emb = rand((4, 3), torch.bfloat16)
    sd = collections.OrderedDict([
        ("transposed", base.t()),              # [5,3], strides (1,5)
        ("slice", line[2:7]),                  # storage offset 2
        ("block", base[1:, 2:]),               # offset 7, strides (5,1)
        ("permuted", cube.permute(2, 0, 1)),   # strides (1,12,4)
        ("every_other", line[1::2]),           # stride 2
        # views.bin was written with expand(3, 4) before such views were refused;
        # its size byte (and the CRC) was patched to what this line writes.
        ("expanded", row.expand(1, 4)),        # stride 0 on a size-1 dim (BERT's position_ids);
                                               # an expand that repeats elements is refused
        ("scalar", torch.tensor(2.5)),
        ("empty", torch.zeros(0, 3)),
        ("embed.weight", emb),                 # tied: same storage twice
        ("lm_head.weight", emb),
        ("lm_head_t", emb.t()),                # tied and transposed
    ])
    save_good("views.bin", sd)


def gen_params_and_metadata():
    torch.save({"w": torch.nn.Parameter(rand((2, 3), torch.float32)),
                "b": torch.nn.Parameter(rand((3,), torch.bfloat16), requires_grad=False)},
               "param.bin")
    sd = torch.load("param.bin")
    expect("param.bin", list(sd.items()))

    lin = torch.nn.Linear(3, 2).to(torch.bfloat16)
    sd = lin.state_dict()  # an OrderedDict with a _metadata attribute
    assert hasattr(sd, "_metadata")
    save_good("linear.bin", sd)

    inner = collections.OrderedDict([("a", rand((2,), torch.float32)), ("n", 7)])
    torch.save({"epoch": 3, "state_dict": inner, "note": "x"}, "wrapped.bin")
    expect("wrapped.bin", [("a", inner["a"])], skipped=["n"])


def gen_sharded():
    os.makedirs("sharded", exist_ok=True)
    a = collections.OrderedDict([("model.a", rand((2, 2), torch.bfloat16)),
                                 ("model.b", rand((3,), torch.bfloat16))])
    b = collections.OrderedDict([("model.c", rand((2,), torch.float32))])
    save_good("sharded/pytorch_model-00001-of-00002.bin", a)
    save_good("sharded/pytorch_model-00002-of-00002.bin", b)
    wm = {k: "pytorch_model-00001-of-00002.bin" for k in a}
    wm.update({k: "pytorch_model-00002-of-00002.bin" for k in b})
    with open("sharded/pytorch_model.bin.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 28}, "weight_map": wm}, f, indent=1)
        f.write("\n")


def gen_unsupported_formats():
    torch.save({"a": rand((2,), torch.float32)}, "legacy.bin",
               _use_new_zipfile_serialization=False)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    torch.jit.save(torch.jit.script(Tiny()), "torchscript.pt")


# ---- hand-crafted archives ---------------------------------------------------

def write_zip(path, entries, archive=None, compress=False):
    """entries: [(name inside the archive folder, bytes)]."""
    archive = archive or os.path.splitext(os.path.basename(path))[0]
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in entries:
            z.writestr(archive + "/" + name, data)


def rewrite_zip(src, dst, change):
    """Copies a torch zip entry by entry; change(name, data) -> (data, method)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data, method = change(info.filename, zin.read(info.filename))
            zout.writestr(info.filename, data, compress_type=method)


class Storage:
    """Stands for a storage in a crafted pickle; pickled as a persistent id."""

    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Call:
    """Pickles as func(*args) (REDUCE)."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


class CraftPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def craft_pickle(obj):
    buf = io.BytesIO()
    CraftPickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def fake_global(module, name, obj):
    """Makes obj pickle as the global module.name, which this torch lacks."""
    mod = sys.modules[module]
    setattr(mod, name, obj)
    obj.__module__ = module
    obj.__qualname__ = name
    return obj


def fake_class(module, name):
    return fake_global(module, name, type(name, (), {}))


class FakeDType:
    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name  # pickled by reference, like torch.dtype


def fake_dtype(name):
    FakeDType.__module__ = "torch"
    obj = FakeDType(name)
    setattr(torch, name, obj)
    return obj


def v2(storage, offset, shape, stride):
    return Call(torch._utils._rebuild_tensor_v2, storage, offset, tuple(shape),
                tuple(stride), False, collections.OrderedDict())


def gen_float8():
    """torch 1.13 has no float8: fake the storage classes, dtypes and
    _rebuild_tensor_v3 so the mapping is still tested. The real torch 2.x
    layout is in torch2_float8.bin (made by gen_torch2.py on torch 2.11)."""
    e4 = fake_class("torch", "Float8_e4m3fnStorage")
    e5 = fake_class("torch", "Float8_e5m2Storage")
    untyped = torch.UntypedStorage  # pickles as torch.storage.UntypedStorage, as in 2.x
    v3 = fake_global("torch._utils", "_rebuild_tensor_v3", lambda *a: None)
    f8 = fake_dtype("float8_e4m3fn")
    raw = {k: bytes(torch.randint(0, 256, (n,), dtype=torch.uint8).tolist())
           for k, n in (("0", 6), ("1", 4), ("2", 8))}
    sd = collections.OrderedDict([
        ("e4m3", v2(Storage(e4, "0", 6), 0, (2, 3), (3, 1))),
        ("e5m2", v2(Storage(e5, "1", 4), 0, (4,), (1,))),
        ("e4m3_v3", Call(v3, Storage(untyped, "2", 8), 2, (2, 3), (1, 2), False,
                         collections.OrderedDict(), f8)),
    ])
    write_zip("float8.bin", [("data.pkl", craft_pickle(sd)), ("version", b"3\n")] +
              [("data/" + k, v) for k, v in raw.items()])
    r2 = raw["2"][2:]
    gathered = bytes(r2[i + 2 * j] for i in range(2) for j in range(3))
    out = {"tensors": [
        {"name": "e4m3", "dtype": "F8_E4M3", "shape": [2, 3], "hex": raw["0"].hex()},
        {"name": "e5m2", "dtype": "F8_E5M2", "shape": [4], "hex": raw["1"].hex()},
        {"name": "e4m3_v3", "dtype": "F8_E4M3", "shape": [2, 3], "hex": gathered.hex()},
    ], "skipped": []}
    with open("float8.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def gen_broken():
    fs = torch.FloatStorage
    four = struct.pack("<4f", 1, 2, 3, 4)

    def crafted(path, obj, storages=(("0", four),), extra=()):
        write_zip(path, [("data.pkl", obj if isinstance(obj, bytes) else craft_pickle(obj)),
                         ("version", b"3\n")] +
                  [("data/" + k, v) for k, v in storages] + list(extra))

    # The classic: GLOBAL os.system, REDUCE ('echo pwned',).
    crafted("malicious.bin", b"\x80\x02cos\nsystem\nq\x00X\n\x00\x00\x00echo pwnedq\x01\x85q\x02Rq\x03.")
    # The same as Python itself pickles it on Linux (posix.system).
    crafted("malicious_posix.bin", craft_pickle({"w": Call(os.system, "echo pwned")}))
    crafted("out_of_bounds.bin", {"w": v2(Storage(fs, "0", 4), 1, (2, 2), (2, 1))})
    crafted("missing_storage.bin", {"w": v2(Storage(fs, "7", 4), 0, (4,), (1,))})
    crafted("numel_mismatch.bin", {"w": v2(Storage(fs, "0", 5), 0, (4,), (1,))})
    crafted("not_a_dict.bin", [v2(Storage(fs, "0", 4), 0, (4,), (1,))])
    crafted("list_value.bin", {"w": v2(Storage(fs, "0", 4), 0, (4,), (1,)), "extra": [1, 2]})
    crafted("two_models.bin", {"state_dict": {"w": v2(Storage(fs, "0", 4), 0, (4,), (1,))},
                               "optimizer": {"state": {}}})
    crafted("big_endian.bin", {"w": v2(Storage(fs, "0", 4), 0, (4,), (1,))},
            extra=[("byteorder", b"big")])
    crafted("bad_storage_key.bin", {"w": v2(Storage(fs, "../0", 4), 0, (4,), (1,))})

    torch.save({"w": rand((4, 4), torch.float32)}, "good_small.tmp")
    rewrite_zip("good_small.tmp", "compressed.bin", lambda n, d: (d, zipfile.ZIP_DEFLATED))
    # The storage entry cut to 40 of its 64 bytes, the pickle unchanged.
    rewrite_zip("good_small.tmp", "truncated_storage.bin",
                lambda n, d: (d[:40] if "/data/" in n else d, zipfile.ZIP_STORED))
    # The directory claims 1 GiB for the storage: its data runs past EOF.
    with open("good_small.tmp", "rb") as f:
        blob = bytearray(f.read())
    os.remove("good_small.tmp")
    name = b"good_small/data/0"
    cd = blob.rfind(b"PK\x01\x02", 0, blob.rfind(name))
    assert blob[cd + 46:cd + 46 + len(name)] == name
    struct.pack_into("<II", blob, cd + 20, 1 << 30, 1 << 30)
    with open("past_eof.bin", "wb") as f:
        f.write(blob)
    with open("not_torch.bin", "wb") as f:
        f.write(b"hello, this is not a checkpoint\n")


if __name__ == "__main__":
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    gen_dtypes()
    gen_views()
    gen_params_and_metadata()
    gen_sharded()
    gen_unsupported_formats()
    gen_broken()
    gen_float8()
