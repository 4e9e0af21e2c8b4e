"""A transfer encoding for KV, prototyped: fewer bits on the wire, f16 again on arrival.

A snapshot's K/V rows (f16) are quantised per block for the wire only and
decoded back to f16 before the restore, so the receiving engine, its kernels
and the snapshot's binding stay what they are; only the values change. This
script measures what that costs in answers: for each encoding it rewrites the
snapshot of a pipeline's document with the decoded values (the same layout,
checksums recomputed: a valid snapshot), runs the pipeline from it with
`swarmkv run --snapshot FILE`, and compares every agent's answer, token for
token, with the run from the original snapshot. It also writes the wire bytes
of each encoding (the codes, one f16 scale per block) and those bytes after
zstd level 3 over the codes (a stand-in for the entropy coding of CacheGen).

Encodings (b = bits per value):
  tok-b   per cell (token) row, blocks of 32 values, symmetric absmax
          (q8_0-like at b = 8), K and V alike;
  kch-b   K per channel over blocks of 32 cells (KIVI's layout: keys'
          outliers sit in channels), V per token as tok-b.

usage: /usr/bin/python3 bench/kv_wire_codec.py --swarmkv build/release/swarmkv --model M
           --pipeline P --out OUT.json [--encodings tok-8,tok-4,...]

Needs Debian's python3-numpy, python3-xxhash (the snapshot's XXH3-64
checksums) and python3-zstandard. The payload is llama.cpp's whole-context
state at the pinned commit (docs/snapshot-format.md): the architecture name,
then per KV cache (Gemma 3: the full-attention one, then the sliding-window
one) the streams' cells and, under flash attention (exact mode: always), the
K rows of every layer, then the V rows.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import xxhash
import zstandard

GGML_TYPE_F16 = 1
ENCODINGS = "tok-8,tok-6,tok-5,tok-4,tok-3,kch-4,kch-3"


# ---------------------------------------------------------------- the snapshot file
class Snapshot:
    """A version-1 snapshot: its header bytes, the section table and the payload (kv.* joined)."""

    def __init__(self, path):
        self.raw = open(path, "rb").read()
        b = self.raw
        if b[:8] != b"SWKVSNAP" or struct.unpack_from("<I", b, 8)[0] != 1:
            sys.exit(f"{path}: not a version-1 SwarmKV snapshot")
        m = struct.unpack_from("<I", b, 12)[0]
        self.meta = json.loads(b[16:16 + m])
        n = struct.unpack_from("<I", b, 16 + m)[0]
        self.table_at = 20 + m
        self.rows = []
        for i in range(n):
            at = self.table_at + 44 * i
            name = b[at:at + 16].rstrip(b"\0").decode()
            codec, offset, size, _ = struct.unpack_from("<IQQQ", b, at + 16)
            assert codec == 0, "only stored sections exist in version 1"
            self.rows.append((name, offset, size))
        self.header_end = self.table_at + 44 * n  # the header checksum follows
        self.kv_rows = [r for r in self.rows if r[0].startswith("kv.")]
        self.payload = bytearray(b"".join(b[o:o + s] for _, o, s in self.kv_rows))

    def write(self, path, payload):
        """The same file with `payload` as its kv.* sections, every checksum recomputed."""
        assert len(payload) == len(self.payload)
        out = bytearray(self.raw)
        at = 0
        for _, offset, size in self.kv_rows:
            out[offset:offset + size] = payload[at:at + size]
            at += size
        for i, (name, offset, size) in enumerate(self.rows):
            struct.pack_into("<Q", out, self.table_at + 44 * i + 36, xxhash.xxh3_64_intdigest(bytes(out[offset:offset + size])))
        struct.pack_into("<Q", out, self.header_end, xxhash.xxh3_64_intdigest(bytes(out[:self.header_end])))
        with open(path, "wb") as f:
            f.write(out)


# ---------------------------------------------------------------- llama.cpp's state
def kv_tensors(payload, n_caches):
    """[(kind 'k'|'v', cache index, layer index, offset, cells, row bytes, ggml type)] of the payload."""
    at = 0
    (n,) = struct.unpack_from("<I", payload, at)
    at += 4 + n  # the architecture's name
    out = []
    for cache in range(n_caches):
        (n_stream,) = struct.unpack_from("<I", payload, at)
        at += 4
        for _ in range(n_stream):
            (cells,) = struct.unpack_from("<I", payload, at)
            at += 4
            if cells == 0:
                continue
            for _ in range(cells):  # pos, n_seq_id, seq ids
                _, n_seq = struct.unpack_from("<iI", payload, at)
                at += 8 + 4 * n_seq
            v_trans, n_layer = struct.unpack_from("<II", payload, at)
            at += 8
            if v_trans:
                sys.exit("the payload's V is transposed (flash attention off): this prototype reads row-major V only")
            for kind in ("k", "v"):
                for layer in range(n_layer):
                    gtype, row = struct.unpack_from("<iQ", payload, at)
                    at += 12
                    out.append((kind, cache, layer, at, cells, row, gtype))
                    at += cells * row
    if at != len(payload):
        sys.exit(f"the payload has {len(payload) - at} bytes after its last tensor: another state layout")
    return out


# ---------------------------------------------------------------- the encodings
def quantise_blocks(x, bits):
    """x: (..., 32) float32 blocks. Symmetric absmax codes in [-(2^(b-1)-1), 2^(b-1)-1] with one f16
    scale per block; returns (codes int8, scales f16, decoded float32)."""
    q = (1 << (bits - 1)) - 1
    amax = np.abs(x).max(axis=-1, keepdims=True)
    scale = (amax / q).astype(np.float16)
    s = scale.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(s > 0, np.rint(x / np.where(s > 0, s, 1)), 0)
    codes = np.clip(codes, -q, q).astype(np.int8)
    return codes, scale, codes.astype(np.float32) * s


def encode(values, kind, encoding):
    """values: (cells, width) float32 of one layer's K or V. Returns (decoded float32 of the same shape,
    wire bytes, the codes' bytes for the entropy coder)."""
    layout, bits = encoding.split("-")
    bits = int(bits)
    cells, width = values.shape
    per_channel = layout == "kch" and kind == "k"
    x = values.T if per_channel else values  # blocks run along the last axis
    rows, length = x.shape
    pad = (-length) % 32
    xp = np.pad(x, ((0, 0), (0, pad)))
    codes, scales, dec = quantise_blocks(xp.reshape(rows, -1, 32), bits)
    dec = dec.reshape(rows, -1)[:, :length]
    wire = (codes.size * bits + 7) // 8 + scales.size * 2
    decoded = dec.T if per_channel else dec
    return np.ascontiguousarray(decoded), wire, codes.tobytes() + scales.tobytes()


def transcode(snap, encoding):
    """The payload with every f16 K/V row replaced by its decoded wire form, and what it measured."""
    n_caches = 2 if snap.meta["layout"].get("n_swa", 0) else 1
    payload = bytearray(snap.payload)
    kv_bytes = wire = 0
    coder = zstandard.ZstdCompressor(level=3)
    packed = 0
    err = {"k": [0.0, 0.0], "v": [0.0, 0.0]}  # sum of squared error, sum of squares
    for kind, _, _, at, cells, row, gtype in kv_tensors(snap.payload, n_caches):
        if gtype != GGML_TYPE_F16:
            sys.exit(f"a K/V tensor of ggml type {gtype}: the prototype encodes f16 snapshots only")
        n = cells * row
        values = np.frombuffer(snap.payload, dtype=np.float16, count=n // 2, offset=at).astype(np.float32)
        values = values.reshape(cells, row // 2)
        decoded, w, codes = encode(values, kind, encoding)
        out16 = decoded.astype(np.float16)
        payload[at:at + n] = out16.tobytes()
        diff = out16.astype(np.float32) - values
        err[kind][0] += float((diff * diff).sum())
        err[kind][1] += float((values * values).sum())
        kv_bytes += n
        wire += w
        packed += len(coder.compress(codes))
    return payload, {"kv_bytes": kv_bytes, "wire_bytes": wire, "wire_zstd_bytes": packed,
                     "bits_per_value": 8 * wire / (kv_bytes / 2),
                     "rel_rms_k": (err["k"][0] / err["k"][1]) ** 0.5, "rel_rms_v": (err["v"][0] / err["v"][1]) ** 0.5}


# ---------------------------------------------------------------- runs
def run_json(cmd, env):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    print(f"[{time.time() - t:6.1f} s] {' '.join(cmd[1:4])} ...", file=sys.stderr, flush=True)
    return json.loads(p.stdout)


def agreement(run, base):
    """Agents whose tokens equal the base run's, and the mean share of each answer's tokens that agree
    before the first difference."""
    same, prefix = 0, []
    got = {a["name"]: a["tokens"] for a in run["agents"]}
    for a in base["agents"]:
        t, b = got[a["name"]], a["tokens"]
        same += t == b
        k = next((i for i, (x, y) in enumerate(zip(t, b)) if x != y), min(len(t), len(b)))
        prefix.append(k / max(len(b), 1))
    return same, len(base["agents"]), sum(prefix) / len(prefix)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--swarmkv", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--out", required=True, help="results (JSON)")
    ap.add_argument("--encodings", default=ENCODINGS)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="swarmkv-kv-wire-")
    env = dict(os.environ, SWARMKV_CACHE=os.path.join(work, "cache"))
    env.pop("SWARMKV_LOG_LEVEL", None)
    base_cmd = [args.swarmkv, "run", args.pipeline, "--model", args.model, "--json", "-t", str(args.threads),
                "--kv-type", "f16"]
    base = run_json(base_cmd + ["--snapshot-cache", "on"], env)
    store = os.path.join(work, "cache", "snapshots")
    files = [f for f in os.listdir(store) if f.endswith(".swkv")]
    assert len(files) == 1, files
    original = os.path.join(store, files[0])
    snap = Snapshot(original)
    # The untouched file through the same path first: the comparison's own noise floor (must be 0).
    again = run_json(base_cmd + ["--snapshot", original, "--snapshot-cache", "off"], env)
    same, n, _ = agreement(again, base)
    if same != n:
        sys.exit(f"a run from the original snapshot differs from the run that made it ({same}/{n}): no baseline")
    results = {"model": os.path.basename(args.model), "pipeline": args.pipeline, "prefix_tokens": base["prefix_tokens"],
               "snapshot_bytes": os.path.getsize(original), "payload_bytes": len(snap.payload),
               "agents": n, "max_tokens": max(a["n_tokens"] for a in base["agents"]), "encodings": []}
    for enc in filter(None, args.encodings.split(",")):
        t = time.time()
        payload, m = transcode(snap, enc)
        m["encode_decode_s"] = time.time() - t
        path = os.path.join(work, f"{enc}.swkv")
        snap.write(path, payload)
        r = run_json(base_cmd + ["--snapshot", path, "--snapshot-cache", "off"], env)
        m["agents_equal"], _, m["token_prefix_agreement"] = agreement(r, base)
        m["encoding"] = enc
        m["answers"] = {a["name"]: a["answer"] for a in r["agents"]}
        results["encodings"].append(m)
        print(f"{enc}: {m['bits_per_value']:.2f} bits/value, {m['agents_equal']}/{n} answers equal, "
              f"token agreement {m['token_prefix_agreement']:.3f}, rel. RMS K {m['rel_rms_k']:.4f} "
              f"V {m['rel_rms_v']:.4f}", file=sys.stderr, flush=True)
        os.unlink(path)
    results["base_answers"] = {a["name"]: a["answer"] for a in base["agents"]}
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
