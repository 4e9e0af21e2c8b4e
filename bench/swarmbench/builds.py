"""What the benches that time one swarmkv binary on two builds of llama.cpp
share (bench/prefix_attention.py, bench/streaming_prefill.py,
bench/every_cpu.py, bench/sgemm_rows.py, bench/real_sizes.py): their common
arguments, the command.sh that reproduces a run, the environment that
points the binary at one build's lib/ folder (its RUNPATH overridden with
LD_LIBRARY_PATH), one `swarmkv bench` run on a build, and a model
requantised once by a build's llama-quantize (bench/real_sizes.py,
bench/perplexity.py), and the CPU that picked the builds' code paths.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from . import MODEL, ROOT
from .report import write_command


def arguments(default_out):
    """--bin, --before-lib, --after-lib, --out (default bench/results/DEFAULT_OUT), --trials."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--before-lib", required=True)
    ap.add_argument("--after-lib", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", default_out))
    ap.add_argument("--trials", type=int, default=3)
    return ap


def start(a):
    """OUT/plots/, and OUT/command.sh: this run's command line, from the repository root."""
    os.makedirs(os.path.join(a.out, "plots"), exist_ok=True)
    write_command(a.out)


def environment(lib, base=None):
    """`base` (default: this process's environment) with the build in `lib` first."""
    return dict(os.environ if base is None else base, LD_LIBRARY_PATH=lib)


def run(cmd, lib, base=None, timeout=1800):
    """cmd on the build in lib (environment(lib, base)); exits the script with the tail of its stderr
    when it fails. Returns its stdout."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=environment(lib, base), timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


def bench_run(binary, lib, arm, agents, doc_tokens, n_predict, tmp, extra=(), model=MODEL):
    """One `swarmkv bench` trial of `arm` (synthetic document of `doc_tokens` tokens, `agents`
    agents, `n_predict` tokens each) of `model` on the build in `lib`; extra: more arguments
    (--no-exact).
    Returns the run's figures: end to end, prefill, branch phase, peak RSS, the median step with
    every agent decoding (None without one) and each agent's tokens."""
    out = tempfile.mkdtemp(prefix=f"{arm}-{agents}-{doc_tokens}-", dir=tmp)
    cmd = [binary, "bench", "--model", model, "--arms", arm, "--branches", str(agents),
           "--doc-tokens", str(doc_tokens), "--n-predict", str(n_predict), "--trials", "1",
           "--pause-ms", "0", "--out", out, *extra]
    run(cmd, lib)
    with open(os.path.join(out, "best_run.json")) as f:
        t = json.load(f)["arms"][arm]["best_trial"]
    if not t["ok"]:
        sys.exit(f"{' '.join(cmd)}: the run failed")
    steps = [s for s in t["generation_step_ms_by_branches"] if s["branches"] == agents]
    return {"end_to_end_ms": t["end_to_end_ms"], "prefill_ms": t["prefill_ms"],
            "prefill_tokens_per_s": t["prefill_tokens_per_s"],
            "branch_phase_ms": t["branch_phase_ms"], "peak_rss_kib": t["peak_rss_kib"],
            "step_ms": steps[0]["median_ms"] if steps else None,
            "steps": steps[0]["steps"] if steps else 0,
            "answers": [b["tokens"] for b in t["branches"]]}


def requantised(bin_dir, src, weights, out, threads=None):
    """`out`: `src` in `weights` (a llama-quantize type), made once with
    `bin_dir`/llama-quantize --allow-requantize and published atomically."""
    if not os.path.exists(out):
        cmd = [os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", src, out + ".part", weights]
        if threads:
            cmd.append(str(threads))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.replace(out + ".part", out)
    return out


def cpu_model():
    """This machine's CPU model name, from /proc/cpuinfo ("unknown" where it has none)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return "unknown"


def cpu():
    """The CPU model, its hardware threads and the vector extensions that pick ggml's code paths."""
    flags = []
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                flags = [x for x in value.split() if x.startswith(("avx", "fma", "f16c", "asimd", "sve"))]
                break
    return f"{cpu_model()}, {os.cpu_count()} hardware threads ({' '.join(flags) or 'no vector flags listed'})"
