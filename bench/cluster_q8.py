"""f16 against q8_0 K/V on the exact kernels, in one run: what half-size snapshots cost and save.

Sections (each written to OUT/results.json as soon as it is measured):

  prefill   `swarmkv prefill --out` of synthetic documents (the seed's
            phrase; --lengths prefix tokens) per model, f16 and q8_0
            alternated within each trial: prefill ms and the snapshot's
            bytes; then each snapshot through a loopback redis-server
            (swarmkv_bus_bench: publish and fetch ms);
  agents16  bench/results/prefill-default/sixteen-agents.yaml (16 agents x
            32 tokens over the README's document) per model under --fork
            shared, f16 and q8_0 alternated; then one --fork none run with
            q8_0 K/V, the re-prefill that exact mode must equal
            (bench/results/exact-default/ has f16's);
  ppl       llama-perplexity on the engine-settings page's text (GPL-3),
            512-token chunks, flash attention on the batch-invariant kernel
            (GGML_CPU_FA_BATCH_INVARIANT=1) and no repacking, f16 vs q8_0
            K/V, per model;
  transfer  bench/cluster_transfer.py --kv-type q8_0 (its loopback, links
            and e2e sections) into OUT/transfer-q8_0/: the shaped links'
            delivered rates with the q8_0 snapshot, and `run --redis` on one
            and two workers against the local run, answers compared;
  wire      bench/kv_wire_codec.py per model: wire-only encodings of the f16
            snapshot below 8 bits, bytes against answers.

Every arm of a section runs back to back in this one process's run, on
this machine, nothing else running (timings are noisy: compare arms inside
one run). bench/plot_cluster_q8.py then writes OUT/report.md and OUT/plots.

usage: python3 bench/cluster_q8.py [--out bench/results/cluster-q8] [--trials 3]
           [--skip SECTION,...] [--resume]
Needs root for the transfer section's network namespaces, redis-server,
Debian's python3-xxhash and python3-zstandard for the wire section.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import ROOT as REPO, report, servers  # noqa: E402
from swarmbench.trials import alternate as order, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = ("prefill", "agents16", "ppl", "transfer", "wire")
KV = ("f16", "q8_0")
CACHE = os.path.expanduser("~/.cache/swarmkv")

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--out", default=os.path.join("bench", "results", "cluster-q8"))
ap.add_argument("--build", default=os.path.join("build", "release"))
ap.add_argument("--models", default=",".join([
    "smollm2=" + os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.F16.gguf"),
    "gemma3=" + os.path.join(CACHE, "models", "gemma-3-270m-q4_k_m.gguf")]))
ap.add_argument("--lengths", default="512,3501,7000", help="prefix tokens of the prefill section's documents")
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--pipeline", default=os.path.join(REPO, "bench", "results", "prefill-default", "sixteen-agents.yaml"))
ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3", help="perplexity text")
ap.add_argument("--llama", default=None, help="llama.cpp prefix with bin/llama-perplexity (default: "
                                              "scripts/build-llama.sh's)")
ap.add_argument("--skip", default="")
ap.add_argument("--resume", action="store_true", help="keep the sections OUT/results.json has")
args = ap.parse_args()

models = dict(item.split("=", 1) for item in args.models.split(","))
lengths = [int(x) for x in args.lengths.split(",")]
skip = set(filter(None, args.skip.split(",")))
if skip - set(SECTIONS):
    sys.exit(f"--skip: unknown section(s) {', '.join(sorted(skip - set(SECTIONS)))}")
for name, path in models.items():
    if not os.path.isfile(path):
        sys.exit(f"no model {name} at {path} (scripts/fetch-model.sh)")


os.makedirs(args.out, exist_ok=True)
results_path = os.path.join(args.out, "results.json")
results = json.load(open(results_path)) if args.resume and os.path.exists(results_path) else {}
skip |= {s for s in SECTIONS if s in results} if args.resume else set()


def keep():
    report.write_json(results_path, results, indent=2)


work = tempfile.mkdtemp(prefix="swarmkv-q8-bench-")
bindir = os.path.join(work, "bin")  # a rebuild of --build during the run changes nothing
os.makedirs(bindir)
for b in ("swarmkv", os.path.join("bench", "swarmkv_bus_bench")):
    shutil.copy2(os.path.join(args.build, b), bindir)
SWARMKV = os.path.join(bindir, "swarmkv")
BUS_BENCH = os.path.join(bindir, "swarmkv_bus_bench")
ENV = dict(os.environ, SWARMKV_CACHE=os.path.join(work, "cache"))
for k in ("SWARMKV_LOG_LEVEL", "SWARMKV_REDIS", "SWARMKV_MODEL"):
    ENV.pop(k, None)
llama = args.llama or subprocess.run([os.path.join(REPO, "scripts", "build-llama.sh")], capture_output=True,
                                     text=True, check=True).stdout.strip()

cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
results["environment"] = {"cpu": cpu, "cores": os.cpu_count(), "kernel": os.uname().release,
                          "engine": json.loads(run([SWARMKV, "info", "--model", next(iter(models.values()))])
                                               .stdout)["engine"]}
results["params"] = {"models": {k: os.path.basename(v) for k, v in models.items()}, "lengths": lengths,
                     "trials": args.trials, "threads": args.threads,
                     "pipeline": os.path.relpath(args.pipeline, REPO), "text": args.text}
keep()


# ---------------------------------------------------------------- prefill
WORDS = "The quick brown fox jumps over the lazy dog".split()


def seed_phrase(n):
    """n pieces of the seed's phrase, each one token in SmolLM2's vocabulary."""
    out = []
    while len(out) < n:
        out += [("" if not out else " ") + w for w in WORDS] + ["."]
    return "".join(out[:n])


def prefill(model, doc, snap, kv):
    p = run([SWARMKV, "prefill", doc, "--model", model, "--out", snap, "--snapshot-cache", "off", "--json",
             "-t", str(args.threads), "--kv-type", kv], env=ENV)
    r = json.loads(p.stdout)
    return {"prefill_ms": r["prefill_ms"], "prefix_tokens": r["prefix_tokens"], "file_bytes": os.path.getsize(snap)}


def fetch_over_loopback(files):
    with servers.redis() as redis:
        return {f: json.loads(run([BUS_BENCH, "--redis", f"redis://127.0.0.1:{redis.port}", "--file", f, "--trials",
                                   str(max(3, args.trials))]).stdout) for f in files}


if "prefill" not in skip:
    rows = []
    docs = {}
    for m, path in models.items():
        overhead = None
        for L in lengths:
            doc = os.path.join(work, f"{m}-{L}.txt")
            if overhead is None:  # the prefix tokens that are not the document's (template, system prompt)
                open(doc, "w").write(seed_phrase(16))
                overhead = prefill(path, doc, os.path.join(work, "probe.swkv"), "f16")["prefix_tokens"] - 16
            open(doc, "w").write(seed_phrase(max(1, L - overhead)))
            docs[(m, L)] = doc
            if L == lengths[0]:
                for kv in KV:  # warm-up (the page cache, each K/V type's first run)
                    prefill(path, doc, os.path.join(work, f"{m}-{L}-{kv}.swkv"), kv)
    samples = {(m, L, kv): [] for m in models for L in lengths for kv in KV}
    for t in range(args.trials):
        for m in models:
            for L in order(lengths, t):
                for kv in order(KV, t):
                    samples[(m, L, kv)].append(prefill(models[m], docs[(m, L)],
                                                       os.path.join(work, f"{m}-{L}-{kv}.swkv"), kv))
    fetched = fetch_over_loopback([os.path.join(work, f"{m}-{L}-{kv}.swkv") for m in models for L in lengths
                                   for kv in KV])
    for (m, L, kv), s in samples.items():
        b = fetched[os.path.join(work, f"{m}-{L}-{kv}.swkv")]
        rows.append({"model": m, "length": L, "kv": kv, "prefix_tokens": s[0]["prefix_tokens"],
                     "prefill_ms": [x["prefill_ms"] for x in s], "file_bytes": s[-1]["file_bytes"],
                     "loopback": b})
    results["prefill"] = rows
    keep()


# ---------------------------------------------------------------- agents16
def pipeline_run(model, kv, fork):
    p = run([SWARMKV, "run", args.pipeline, "--model", model, "--fork", fork, "--kv-type", kv, "--json",
             "--snapshot-cache", "off", "-t", str(args.threads)], env=ENV)
    r = json.loads(p.stdout)
    assert r["ok"], r
    return {"prefill_ms": r["prefill_ms"], "total_ms": r["total_ms"], "branch_phase_ms": r["total_ms"] - r["prefill_ms"],
            "prefix_tokens": r["prefix_tokens"], "exact": r["exact"], "kv_type": r["engine"]["kv_type"],
            "tokens": {a["name"]: a["tokens"] for a in r["agents"]},
            "answers": {a["name"]: a["answer"] for a in r["agents"]}}


if "agents16" not in skip:
    out = {}
    for m, path in models.items():
        arms = {kv: [] for kv in KV}
        for kv in KV:
            pipeline_run(path, kv, "shared")  # warm-up
        for t in range(args.trials):
            for kv in order(KV, t):
                arms[kv].append(pipeline_run(path, kv, "shared"))
        # The re-prefill for q8_0 only: bench/results/exact-default/ holds f16's on both models.
        ref = {"q8_0": pipeline_run(path, "q8_0", "none")}
        out[m] = {"shared": arms, "none": ref}
        results["agents16"] = out
        keep()


# ---------------------------------------------------------------- ppl
if "ppl" not in skip:
    ppl = {}
    env = dict(os.environ, GGML_CPU_FA_BATCH_INVARIANT="1")
    for m, path in models.items():
        for kv in KV:
            p = run([os.path.join(llama, "bin", "llama-perplexity"), "-m", path, "-f", args.text, "-c", "512",
                     "-b", "512", "-t", str(args.threads), "-fa", "on", "-ctk", kv, "-ctv", kv, "--no-repack"],
                    env=env)
            found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", p.stdout + p.stderr)
            if not found:
                sys.exit(f"llama-perplexity printed no final estimate for {m} {kv}")
            ppl[f"{m} {kv}"] = {"model": m, "kv": kv, "ppl": float(found.group(1)),
                                "ppl_stderr": float(found.group(2))}
    results["ppl"] = ppl
    keep()


# ---------------------------------------------------------------- transfer
if "transfer" not in skip:
    sub = os.path.join(args.out, "transfer-q8_0")
    first = models[next(iter(models))]
    run([sys.executable, os.path.join(HERE, "cluster_transfer.py"), "--out", sub, "--build", bindir,
         "--model", first, "--kv-type", "q8_0", "--trials", str(args.trials), "--skip", "breakeven", "--no-plot"])
    results["transfer"] = {"folder": os.path.relpath(sub, args.out), "model": next(iter(models))}
    keep()


# ---------------------------------------------------------------- wire
if "wire" not in skip:
    wire = {}
    for m, path in models.items():
        dest = os.path.join(work, f"wire-{m}.json")
        run(["/usr/bin/python3", os.path.join(HERE, "kv_wire_codec.py"), "--swarmkv", SWARMKV, "--model", path,
             "--pipeline", args.pipeline, "--out", dest, "--threads", str(args.threads)])
        wire[m] = json.load(open(dest))
    results["wire"] = wire
    keep()

report.write_command(args.out, "command.txt", python="python3")
shutil.rmtree(work, ignore_errors=True)
subprocess.run(["/usr/bin/python3", os.path.join(HERE, "plot_cluster_q8.py"), args.out], check=True)
