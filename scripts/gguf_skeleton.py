#!/usr/bin/env python3
"""GGUF models with random weights, for timings where a model file cannot be
had: a model carried without its weights to a machine no download reaches
(scripts/gpu-check.sh), and models in the shapes of the 1-8B models users
run, which this project's machines cannot download (bench/real_sizes.py).

    gguf_skeleton.py pack MODEL.gguf SKELETON    # here: header + tensor list
    gguf_skeleton.py fill SKELETON MODEL.gguf    # there: same shape, random weights
    gguf_skeleton.py shape NAME TOKENIZER.gguf OUT.gguf   # a real size, Q8_0

`pack` keeps the model's header (metadata, tokenizer, tensor table: a few MB)
and writes the tensor table as JSON beside it (SKELETON.json). `fill` writes a
model of the same architecture, shapes and types whose weights are random
(normal, sigma 0.02; norm weights 1): every kernel does the work the real
model makes it do, so timings hold, while the answers are noise. F32 and F16
tensors only (the default model is F16). `fill` needs numpy.

`shape` writes a Llama-architecture model in the shapes of NAME (one of
SHAPES below: layers, widths, heads, vocabulary) with Q8_0 weights (F32
norms), uniform int8 quanta under one scale (sigma ~0.02), and the tokenizer
and chat template of TOKENIZER.gguf (a Llama-architecture GGUF such as
SmolLM2's), its vocabulary padded with unused tokens to NAME's size so that
the embedding and output products have the real model's width. Other weight
types come from it with llama-quantize --allow-requantize. Timings hold (the
kernels do the real model's work); answers are noise.
"""
import json
import os
import struct
import sys

# Llama 3's published shapes (config.json of each model).
SHAPES = {
    "llama-3.2-1b": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, n_vocab=128256,
                         tied=True),
    "llama-3.2-3b": dict(n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, n_ff=8192, n_vocab=128256,
                         tied=True),
    "llama-3.1-8b": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                         tied=False),
}
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


def read_metadata(path):
    """TOKENIZER.gguf's key-value pairs as (key, type, value, item type)."""
    with open(path, "rb") as f:
        r = Reader(f.read(64 << 20))
    if r.data[:4] != b"GGUF" or struct.unpack_from("<I", r.data, 4)[0] != 3:
        raise SystemExit(f"{path}: not a version 3 GGUF file")
    r.pos = 8 + 8
    n_kv = r.take("<Q")
    kv = []
    for _ in range(n_kv):
        key, t = r.string(), r.take("<I")
        item = struct.unpack_from("<I", r.data, r.pos)[0] if t == ARRAY else None
        kv.append((key, t, r.value(t), item))
    return kv


class Writer:
    def __init__(self):
        self.parts = []

    def put(self, fmt, v):
        self.parts.append(struct.pack(fmt, v))

    def string(self, s):
        b = s.encode("utf-8")
        self.put("<Q", len(b))
        self.parts.append(b)

    def value(self, t, v, item=None):
        if t in SCALAR:
            self.put(SCALAR[t], v)
        elif t == STRING:
            self.string(v)
        else:
            self.put("<I", item)
            self.put("<Q", len(v))
            for x in v:
                self.value(item, x)

    def bytes(self):
        return b"".join(self.parts)


Q8_0, F32 = 8, 0
ALIGN = 32
UNUSED_TOKEN = 5  # llama_token_type: unused


def shape_tensors(d):
    """(name, dims in ggml order, type) of a Llama model of shape d."""
    e, hd = d["n_embd"], d["n_embd"] // d["n_head"]
    t = [("token_embd.weight", [e, d["n_vocab"]], Q8_0), ("output_norm.weight", [e], F32)]
    if not d["tied"]:
        t.append(("output.weight", [e, d["n_vocab"]], Q8_0))
    for i in range(d["n_layer"]):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", [e], F32), (b + "attn_q.weight", [e, d["n_head"] * hd], Q8_0),
              (b + "attn_k.weight", [e, d["n_head_kv"] * hd], Q8_0),
              (b + "attn_v.weight", [e, d["n_head_kv"] * hd], Q8_0),
              (b + "attn_output.weight", [d["n_head"] * hd, e], Q8_0), (b + "ffn_norm.weight", [e], F32),
              (b + "ffn_gate.weight", [e, d["n_ff"]], Q8_0), (b + "ffn_up.weight", [e, d["n_ff"]], Q8_0),
              (b + "ffn_down.weight", [d["n_ff"], e], Q8_0)]
    return t


def tensor_bytes(dims, ggml_type):
    count = 1
    for x in dims:
        count *= x
    return count * 4 if ggml_type == F32 else count // 32 * 34


def shape_metadata(name, d, tokenizer):
    u32, f32, string = 4, 6, STRING
    hp = [("general.architecture", string, "llama"), ("general.name", string, f"{name} (random weights)"),
          ("general.file_type", u32, 7),  # LLAMA_FTYPE_MOSTLY_Q8_0
          ("llama.context_length", u32, 131072), ("llama.embedding_length", u32, d["n_embd"]),
          ("llama.block_count", u32, d["n_layer"]), ("llama.feed_forward_length", u32, d["n_ff"]),
          ("llama.attention.head_count", u32, d["n_head"]),
          ("llama.attention.head_count_kv", u32, d["n_head_kv"]),
          ("llama.rope.dimension_count", u32, d["n_embd"] // d["n_head"]),
          ("llama.rope.freq_base", f32, 500000.0), ("llama.attention.layer_norm_rms_epsilon", f32, 1e-5),
          ("llama.vocab_size", u32, d["n_vocab"])]
    kv = [(k, t, v, None) for k, t, v in hp]
    for key, t, v, item in read_metadata(tokenizer):
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.ggml.tokens":
            if len(v) > d["n_vocab"]:
                raise SystemExit(f"{tokenizer}: {len(v)} tokens, more than {name}'s {d['n_vocab']}")
            v = v + [f"<|swarmkv_pad_{i}|>" for i in range(len(v), d["n_vocab"])]
        elif key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            pad = UNUSED_TOKEN if key.endswith("token_type") else 0.0
            v = v + [pad] * (d["n_vocab"] - len(v))
        kv.append((key, t, v, item))
    return kv


def shape(name, tokenizer, out):
    import numpy as np

    if name not in SHAPES:
        raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    d = SHAPES[name]
    w = Writer()
    kv, tensors = shape_metadata(name, d, tokenizer), shape_tensors(d)
    w.parts.append(b"GGUF")
    w.put("<I", 3)
    w.put("<Q", len(tensors))
    w.put("<Q", len(kv))
    for key, t, v, item in kv:
        w.string(key)
        w.put("<I", t)
        w.value(t, v, item)
    offset = 0
    for tname, dims, ggml_type in tensors:
        w.string(tname)
        w.put("<I", len(dims))
        for x in dims:
            w.put("<Q", x)
        w.put("<I", ggml_type)
        w.put("<Q", offset)
        offset = (offset + tensor_bytes(dims, ggml_type) + ALIGN - 1) // ALIGN * ALIGN
    header = w.bytes()
    rng = np.random.default_rng(0)
    # Uniform int8 quanta q in [-127, 127] have sigma 127/sqrt(3) ~ 73.3: a
    # scale of 0.02/73.3 gives the weights sigma 0.02.
    scale = np.frombuffer(np.float16(0.02 / 73.3).tobytes(), dtype=np.uint8)
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(header + b"\0" * (-len(header) % ALIGN))
        start = f.tell()
        for tname, dims, ggml_type in tensors:
            f.write(b"\0" * (-(f.tell() - start) % ALIGN))
            n = tensor_bytes(dims, ggml_type)
            if ggml_type == F32:
                f.write(np.ones(n // 4, dtype=np.float32).tobytes())
                continue
            blocks_per_row = dims[0] // 32
            rows_per_chunk = max(1, (64 << 20) // (blocks_per_row * 34))
            for r0 in range(0, dims[1], rows_per_chunk):
                nb = (min(dims[1], r0 + rows_per_chunk) - r0) * blocks_per_row
                blocks = np.empty((nb, 34), dtype=np.uint8)
                blocks[:, :2] = scale
                blocks[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
                f.write(blocks.tobytes())
    os.replace(tmp, out)
    params = sum(tensor_bytes(dims, t) // (4 if t == F32 else 34) * (1 if t == F32 else 32)
                 for _, dims, t in tensors)
    print(f"{out}: {name}, {params / 1e9:.2f} B parameters, {os.path.getsize(out) / 1e9:.2f} GB (Q8_0)")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "shape" and len(sys.argv) == 5:
        shape(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] in ("pack", "fill"):
        (pack if sys.argv[1] == "pack" else fill)(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
