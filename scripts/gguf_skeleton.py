#!/usr/bin/env python3
"""A GGUF model carried without its weights, for timings on a machine that a
model file cannot reach (scripts/gpu-check.sh).

    gguf_skeleton.py pack MODEL.gguf SKELETON    # here: header + tensor list
    gguf_skeleton.py fill SKELETON MODEL.gguf    # there: same shape, random weights

`pack` keeps the model's header (metadata, tokenizer, tensor table: a few MB)
and writes the tensor table as JSON beside it (SKELETON.json). `fill` writes a
model of the same architecture, shapes and types whose weights are random
(normal, sigma 0.02; norm weights 1): every kernel does the work the real
model makes it do, so timings hold, while the answers are noise. F32 and F16
tensors only (the default model is F16). `fill` needs numpy.
"""
import json
import os
import struct
import sys

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
          12: "<d"}
STRING, ARRAY = 8, 9
TYPE_BYTES = {0: 4, 1: 2}  # ggml F32, F16


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == STRING:
            return self.string()
        if t == ARRAY:
            item, n = self.take("<I"), self.take("<Q")
            return [self.value(item) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def read_header(path):
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the header of a small model fits
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version}, this reads 3")
    alignment = 32
    for _ in range(n_kv):
        key, t = r.string(), r.take("<I")
        v = r.value(t)
        if key == "general.alignment":
            alignment = v
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = r.string(), r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)]
        ggml_type, offset = r.take("<I"), r.take("<Q")
        if ggml_type not in TYPE_BYTES:
            raise ValueError(f"{path}: tensor {name} has ggml type {ggml_type}; F32/F16 only")
        count = 1
        for d in dims:
            count *= d
        tensors.append({"name": name, "type": ggml_type, "count": count, "offset": offset})
    data_start = (r.pos + alignment - 1) // alignment * alignment
    return data[:data_start], tensors, os.path.getsize(path)


def pack(model, skeleton):
    header, tensors, size = read_header(model)
    with open(skeleton, "wb") as f:
        f.write(header)
    with open(skeleton + ".json", "w") as f:
        json.dump({"model": os.path.basename(model), "bytes": size, "tensors": tensors}, f)
    print(f"{skeleton}: {len(header)} header bytes of {size}, {len(tensors)} tensors")


def fill(skeleton, out):
    import numpy as np

    with open(skeleton + ".json") as f:
        table = json.load(f)
    with open(skeleton, "rb") as f:
        header = f.read()
    rng = np.random.default_rng(0)
    with open(out, "wb") as f:
        f.write(header)
        for t in sorted(table["tensors"], key=lambda t: t["offset"]):
            at = len(header) + t["offset"]
            f.write(b"\0" * (at - f.tell()))  # alignment padding
            dtype = np.float32 if t["type"] == 0 else np.float16
            if t["name"].endswith("norm.weight"):
                values = np.ones(t["count"], dtype=dtype)
            else:
                values = (rng.standard_normal(t["count"], dtype=np.float32) * 0.02).astype(dtype)
            f.write(values.tobytes())
        f.write(b"\0" * (table["bytes"] - f.tell()))
    if os.path.getsize(out) != table["bytes"]:
        raise SystemExit(f"{out}: {os.path.getsize(out)} bytes, the model had {table['bytes']}")
    print(f"{out}: {table['bytes']} bytes, random weights in {table['model']}'s shapes")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "fill"):
        raise SystemExit(__doc__)
    (pack if sys.argv[1] == "pack" else fill)(sys.argv[2], sys.argv[3])
