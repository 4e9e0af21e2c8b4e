#!/usr/bin/env python3
"""Snapshot store benchmark: size, write/verify/restore speed with the page
cache warm and cold, and cold-vs-warm end-to-end runs (the README pipeline,
and 1, 4, 16 agents), all arms measured inside one run, alternating.

usage: bench/snapshot_bench.py --swarmkv build/release/swarmkv --out DIR
           [--model GGUF]... [--trials 3] [--agents 1,4,16]
       bench/snapshot_bench.py --report-only --out DIR   (tables and plot from DIR/results.json;
           run it with Debian's /usr/bin/python3 for python3-matplotlib)
       bench/snapshot_bench.py --plot-only --out DIR     (only DIR/cold_vs_warm.png, from DIR/results.json)
Writes DIR/results.json, io.csv, e2e.csv, readme.csv, report.md and plots
(python3-matplotlib). The first --model is used for the end-to-end runs.
"""
import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import ROOT  # noqa: E402
from swarmbench.trials import alternate, run  # noqa: E402
README_PIPELINE = os.path.join(ROOT, "examples/pipelines/apache-license.yaml")
DOCUMENT = os.path.join(ROOT, "examples/documents/apache-2.0.txt")
QUESTIONS = [
    "Summarise this licence in three sentences.",
    "List the obligations of someone who redistributes the Work.",
    "What are the risks for a contributor, in terms of warranty and liability?",
    "When does a patent licence granted under this licence terminate?",
]


def sh(args, timeout=1800):
    return run(args, timeout, quiet=True).stdout


def cold_and_warm(binary, pipeline, model, fork, store, n_trials):
    """`swarmkv run --json` of pipeline, cold (store off) and warm (the primed store at `store`),
    alternated, n_trials each: yields (arm, trial, result)."""
    for t in range(n_trials):
        for arm in alternate(("cold", "warm"), t):
            extra = ["--snapshot-cache", "off"] if arm == "cold" else ["--cache-dir", store]
            yield arm, t, json.loads(sh([binary, "run", pipeline, "--model", model, "--json", "--fork", fork,
                                         *extra]))


def drop_page_cache(path):
    """Evicts `path` from the page cache (posix_fadvise DONTNEED after fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def pipeline_with(n_agents, path, max_tokens):
    agents = "\n".join(
        f"  - name: a{i}\n    prompt: {json.dumps(QUESTIONS[i % len(QUESTIONS)] + f' (reader {i})')}"
        for i in range(n_agents))
    with open(path, "w") as f:
        f.write(f"name: snapshot-bench-{n_agents}\nn_batch: 512\n"
                "system: You are a careful legal analyst. Answer only from the document, concisely.\n"
                f"document:\n  file: {DOCUMENT}\ndefaults:\n  max_tokens: {max_tokens}\n"
                "  temperature: 0\n  repeat_penalty: 1.1\n  dry_multiplier: 0.8\n"
                f"agents:\n{agents}\n")


def io_row(binary, model, work, n_trials):
    """The README document's snapshot of `model`: its size, write speed, and verify, load and restore
    times with the page cache warm and cold (medians of n_trials); zstd -1's ratio when zstd is here."""
    name = os.path.basename(model)
    store = os.path.join(work, "io-store")
    shutil.rmtree(store, ignore_errors=True)
    snap = os.path.join(work, "readme.swkv")
    p = json.loads(sh([binary, "prefill", README_PIPELINE, "--model", model, "--json",
                       "--snapshot-cache", "off", "--out", snap]))
    size = os.path.getsize(snap)
    row = {"model": name, "prefix_tokens": p["prefix_tokens"], "file_bytes": size,
           "bytes_per_token": size / p["prefix_tokens"], "prefill_ms": p["prefill_ms"],
           "export_ms": p["export_ms"], "write_ms": p["write_ms"],
           "write_mb_s": size / 1e3 / p["write_ms"]}
    for cache in ("warm", "cold"):
        verify, load, restore = [], [], []
        for _ in range(n_trials):
            if cache == "cold":
                drop_page_cache(snap)
            v = json.loads(sh([binary, "snapshot", "verify", "--json", snap]))[0]
            verify.append(v["total_ms"])
            if cache == "cold":
                drop_page_cache(snap)
            r = json.loads(sh([binary, "run", README_PIPELINE, "--model", model, "--json",
                               "--snapshot", snap, "--snapshot-cache", "off"]))
            load.append(r["snapshot"]["load_ms"])
            restore.append(r["restore_ms"])
        mv, ml, mr = (statistics.median(x) for x in (verify, load, restore))
        row.update({f"verify_ms_{cache}": mv, f"verify_mb_s_{cache}": size / 1e3 / mv,
                    f"load_ms_{cache}": ml, f"load_mb_s_{cache}": size / 1e3 / ml,
                    f"restore_ms_{cache}": mr,
                    f"restore_mb_s_{cache}": size / 1e3 / mr})
    if shutil.which("zstd"):
        out = subprocess.run(["zstd", "-q", "-1", "-T1", "-c", snap], capture_output=True)
        row["zstd1_ratio"] = size / len(out.stdout)
        t0 = time.perf_counter()
        subprocess.run(["zstd", "-q", "-d", "-T1", "-c"], input=out.stdout, capture_output=True)
        row["zstd1_decompress_mb_s"] = size / 1e6 / (time.perf_counter() - t0)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swarmkv")
    ap.add_argument("--model", action="append")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--agents", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.report_only or args.plot_only:
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)
        if args.plot_only:
            plot_cold_vs_warm(results, args.out)
        else:
            write_tables(results, args.out)
        return
    if not args.swarmkv or not args.model:
        ap.error("--swarmkv and --model are required (or --report-only, --plot-only)")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="swarmkv-snapshot-bench-")
    binary = args.swarmkv
    results = {"command": " ".join(sys.argv), "trials": args.trials, "io": [], "e2e": [], "readme": []}
    try:
        for model in args.model:  # I/O: size, write, verify and restore, page cache warm and cold
            row = io_row(binary, model, work, args.trials)
            results["io"].append(row)
            print(json.dumps(row), flush=True)

        model = args.model[0]
        # ---- The README pipeline, cold (store off) vs warm (store on, primed).
        store = os.path.join(work, "store")
        for fork in ("shared", "host"):
            sh([binary, "prefill", README_PIPELINE, "--model", model, "--cache-dir", store])
            for arm, t, r in cold_and_warm(binary, README_PIPELINE, model, fork, store, args.trials):
                results["readme"].append({
                    "fork": fork, "arm": arm, "trial": t, "total_ms": r["total_ms"],
                    "prefill_ms": r["prefill_ms"], "load_ms": r["snapshot"]["load_ms"],
                    "source": r["snapshot"]["source"],
                    "prefilled_tokens": r["snapshot"]["prefilled_tokens"],
                    "first_token_at_ms": min(a["first_token_at_ms"] for a in r["agents"]),
                    "answers": [a["answer"] for a in r["agents"]]})
                print(fork, arm, t, round(r["total_ms"]), flush=True)

        # ---- 1, 4, 16 agents.
        for n in [int(x) for x in args.agents.split(",")]:
            path = os.path.join(work, f"agents{n}.yaml")
            pipeline_with(n, path, args.max_tokens)
            for fork in ("shared", "host"):
                for arm, t, r in cold_and_warm(binary, path, model, fork, store, args.trials):
                    results["e2e"].append({
                        "agents": n, "fork": fork, "arm": arm, "trial": t,
                        "total_ms": r["total_ms"], "prefill_ms": r["prefill_ms"],
                        "load_ms": r["snapshot"]["load_ms"], "source": r["snapshot"]["source"],
                        "first_token_at_ms": min(a["first_token_at_ms"] for a in r["agents"])})
                    print(n, fork, arm, t, round(r["total_ms"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    write_tables(results, args.out)


def med(rows, key, **match):
    vals = [r[key] for r in rows if all(r[k] == v for k, v in match.items())]
    return statistics.median(vals) if vals else float("nan")


def plot_cold_vs_warm(results, out):
    """cold_vs_warm.png: total and first-token time, cold vs warm, per fork and agent count (trials as
    dots), and cold / warm in its own panel. False when matplotlib is missing."""
    sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
    try:
        from swarmbench import style as ps
        from matplotlib.lines import Line2D
    except ImportError:
        return False
    e2e = results["e2e"]
    ns = sorted({r["agents"] for r in e2e})
    forks = ("shared", "host")
    labels = [f"{n} agent{'' if n == 1 else 's'}" for n in ns]
    pick = lambda key, n, fork, arm: [r[key] / 1000 for r in e2e  # noqa: E731
                                      if r["agents"] == n and r["fork"] == fork and r["arm"] == arm]
    fig, axes = ps.figure(2, len(forks) + 1, width=13.0, height_per_row=3.4)
    all_bars = True
    for row, (key, what, span) in zip(axes, [("total_ms", "whole run", ""),
                                             ("first_token_at_ms", "first token", ", from the run's start")]):
        every = [t for n in ns for fork in forks for arm in ("cold", "warm") for t in pick(key, n, fork, arm)]
        bars = ps.bars_fit(every)  # one presentation and one scale for both forks' panels, so they compare too
        all_bars &= bars
        draw = ps.grouped_bars if bars else ps.grouped_points
        drawn = []
        for ax, fork in zip(row, forks):
            drawn += draw(ax, ns, ["cold", "warm"], lambda n, arm: statistics.median(pick(key, n, fork, arm)),
                          lambda n, arm: pick(key, n, fork, arm), labels=labels,
                          value_fmt=lambda v: f"{v:.1f}" if v >= 10 else f"{v:.2f}")
            ax.set_ylabel(f"{what} s")
            ps.panel_title(ax, f"{fork} fork: {what}{span} ({'bar' if bars else 'large dot'}: median of "
                               f"{results['trials']} trials)")
        for ax in row[:-1]:
            ps.value_scale(ax, drawn, bars=bars)
        ax = row[-1]
        ratio = lambda n, fork: (statistics.median(pick(key, n, fork, "cold")) /  # noqa: E731
                                 statistics.median(pick(key, n, fork, "warm")))
        ps.value_scale(ax, ps.grouped_points(ax, ns, forks, ratio, labels=labels, value_fmt=lambda v: f"{v:.1f}×"),
                       suffix="×", bars=False, base=1.0)
        reference = ps.reference_line(ax, label="1× = no gain", legend=False)
        ax.set_ylabel("cold / warm")
        ps.panel_title(ax, f"Warm speed-up, {what}: median cold / median warm")
    ps.arm_legend(axes[0][-1], ["cold", "warm"], dots="one trial", points=not all_bars,
                  extra=[*(Line2D([], [], color=ps.colour(f), label=f"{f}: cold / warm", **ps.MEDIAN) for f in forks),
                         reference])
    ps.title(fig, f"The README's document (the Apache 2.0 licence), {', '.join(map(str, ns))} agents: cold = "
                  "prefilled, warm = restored from the primed snapshot store; model load excluded")
    ps.save(fig, os.path.join(out, "cold_vs_warm.png"))
    return True


def write_tables(results, out):
    io = results["io"]
    if io:
        with open(os.path.join(out, "io.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(io[0].keys()))
            w.writeheader()
            w.writerows(io)
    for name in ("e2e", "readme"):
        rows = [{k: v for k, v in r.items() if k != "answers"} for r in results[name]]
        if rows:
            with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                w.writeheader()
                w.writerows(rows)
    lines = ["# Snapshot store: size, I/O speed, cold vs warm", "",
             f"Reproduce: `{results['command']}`", "",
             f"Medians of {results['trials']} trials per arm; arms alternate inside one run. "
             "Cold page cache: `posix_fadvise(DONTNEED)` on the file before each read. "
             "`load` = read + checksum of every section (`snapshot.load_ms`); `restore` = "
             "`llama_state_set_data` into the shared fork's context (`restore_ms`).", "",
             "## Size and I/O (README document)", "",
             "| model | tokens | file MB | bytes/token | prefill ms | write MB/s | verify MB/s warm / cold "
             "| load MB/s warm / cold | restore MB/s warm | zstd -1 ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in io:
        lines.append(
            f"| {r['model']} | {r['prefix_tokens']} | {r['file_bytes'] / 1e6:.1f} | {r['bytes_per_token']:.0f} "
            f"| {r['prefill_ms']:.0f} | {r['write_mb_s']:.0f} | {r['verify_mb_s_warm']:.0f} / "
            f"{r['verify_mb_s_cold']:.0f} | {r['load_mb_s_warm']:.0f} / {r['load_mb_s_cold']:.0f} "
            f"| {r['restore_mb_s_warm']:.0f} | {r.get('zstd1_ratio', float('nan')):.3f} |")
    rd = results["readme"]
    if rd:
        lines += ["", "## The README pipeline, cold vs warm", "",
                  "| fork | cold prefill ms | warm load ms | ratio | cold first token ms | warm first token ms "
                  "| ratio | cold total ms | warm total ms | answers cold == warm |", "|---|---|---|---|---|---|---|---|---|---|"]
        for fork in ("shared", "host"):
            cold_p, warm_l = med(rd, "prefill_ms", fork=fork, arm="cold"), med(rd, "load_ms", fork=fork, arm="warm")
            cold_f, warm_f = (med(rd, "first_token_at_ms", fork=fork, arm=a) for a in ("cold", "warm"))
            cold_t, warm_t = (med(rd, "total_ms", fork=fork, arm=a) for a in ("cold", "warm"))
            answers = {tuple(r["answers"]) for r in rd if r["fork"] == fork}
            lines.append(f"| {fork} | {cold_p:.0f} | {warm_l:.1f} | {cold_p / warm_l:.0f}x | {cold_f:.0f} "
                         f"| {warm_f:.0f} | {cold_f / warm_f:.1f}x | {cold_t:.0f} | {warm_t:.0f} "
                         f"| {'yes' if len(answers) == 1 else 'NO'} |")
    e2e = results["e2e"]
    if e2e:
        lines += ["", "## 1, 4 and 16 agents, cold vs warm (total_ms, model load excluded)", "",
                  "| agents | fork | cold ms | warm ms | speed-up | cold first token ms | warm first token ms |",
                  "|---|---|---|---|---|---|---|"]
        for n in sorted({r["agents"] for r in e2e}):
            for fork in ("shared", "host"):
                c, w = med(e2e, "total_ms", agents=n, fork=fork, arm="cold"), med(e2e, "total_ms", agents=n, fork=fork, arm="warm")
                cf, wf = (med(e2e, "first_token_at_ms", agents=n, fork=fork, arm=a) for a in ("cold", "warm"))
                lines.append(f"| {n} | {fork} | {c:.0f} | {w:.0f} | {c / w:.2f}x | {cf:.0f} | {wf:.0f} |")
        if plot_cold_vs_warm(results, out):
            lines += ["", "![cold vs warm](cold_vs_warm.png)"]
        else:
            lines += ["", "(matplotlib missing: no plot)"]
    lines += ["", "## Peer: llama-server's slot save/restore of the same prefix", "",
              "[peer/llama_server_slots.md](peer/llama_server_slots.md) (`bench/llama_server_slots.py`): "
              "same document, same models, `/slots/0?action=save|restore`, then the same request; "
              "`timings.cache_n` says whether the restored slot was really reused."]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
