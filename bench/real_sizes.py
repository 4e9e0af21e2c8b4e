"""SwarmKV at the sizes users run (issue 56, item 5): models in the shapes of
Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B with random weights
(scripts/gguf_skeleton.py shape: no model download reaches this machine), in
Q8_0 and Q4_K_M (llama-quantize --allow-requantize of the Q8_0 file), on the
native build, exact mode (the default), 2 threads.

Per model, one trial (prefills take minutes at 8B; --trials repeats, each
trial in the opposite order of models):
  pp        llama-bench -p DOC -n 0 of the same build (stock kernels) against
            `swarmkv bench --arms shared --branches 1`'s prefill tokens/s
  steps     the median step with every agent decoding, 1 and 16 agents
            (`--arms shared`), N_PREDICT greedy tokens each
  stock     (--stock-steps SHAPE) the 16-agent step under --no-exact too
  e2e       16 agents end to end: shared (measured), none = 16 x the 1-agent
            none run (none re-prefills per agent, one after another:
            extrapolated, said in the report)
  memory    peak RSS per agent: shared (16-agent run - 1-agent run) / 15;
            host (4-agent host run - shared's 1-agent run) / 3: host decodes
            its agents one after another, 16 of them take minutes at 8B
  snapshot  `swarmkv prefill --out` of two synthetic documents: bytes per
            token from their difference; the cluster's break-even link rate =
            bytes/token x prefill tokens/s (a link slower than that makes a
            worker's own prefill faster than fetching the snapshot)
  answers   shared's and none's tokens for the 1-agent run, shared's and
            host's for the first 4 of the 16 agents: equal? (random weights: the tokens are
            noise, but the same noise is the exactness claim)

usage: /usr/bin/python3 bench/real_sizes.py --bin build/release/swarmkv --lib PREFIX/lib
           [--shapes llama-3.2-1b,...] [--weights Q8_0,Q4_K_M] [--doc-tokens 3501]
           [--doc-tokens-for llama-3.1-8b=1024] [--weights-for llama-3.1-8b=Q4_K_M]
           [--stock-steps llama-3.2-1b] [--n-predict 8] [--trials 1]
           [--out bench/results/real-sizes] [--parts timing,report]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import builds as two_builds  # noqa: E402
from swarmbench.trials import alternate  # noqa: E402

SKELETON = os.path.join(two_builds.ROOT, "scripts", "gguf_skeleton.py")
SHAPES = ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"]
N_PREDICT = 8
HOST_AGENTS = 4
WORDS = "The quick brown fox jumps over the lazy dog. "


def log(msg):
    print(f"[real-sizes {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def model_file(shape, weights, lib, cache):
    """The shape's GGUF in `weights`, made once into `cache`."""
    q8 = os.path.join(cache, f"{shape}.Q8_0.gguf")
    if not os.path.exists(q8):
        log(f"writing {q8}")
        subprocess.run([sys.executable, SKELETON, "shape", shape, two_builds.MODEL, q8], check=True)
    if weights == "Q8_0":
        return q8
    return two_builds.requantised(os.path.join(os.path.dirname(lib), "bin"), q8, weights,
                                  os.path.join(cache, f"{shape}.{weights}.gguf"))


def llama_bench(lib, model, doc_tokens):
    """Prompt processing tokens/s of the stock kernels, one repetition."""
    cmd = [os.path.join(os.path.dirname(lib), "bin", "llama-bench"), "-m", model, "-p", str(doc_tokens),
           "-n", "0", "-t", "2", "-r", "1", "-o", "json"]
    return json.loads(two_builds.run(cmd, lib, timeout=3600))[0]["avg_ts"]


def snapshot_bytes_per_token(binary, lib, model, tmp):
    """Bytes per token of a snapshot file: the difference of two documents' files."""
    sizes = []
    for units in (40, 80):
        doc = os.path.join(tmp, f"snap-{units}.txt")
        with open(doc, "w") as f:
            f.write(WORDS * units)
        out = doc + ".swkv"
        r = json.loads(two_builds.run([binary, "prefill", doc, "--model", model, "--out", out,
                                       "--snapshot-cache", "off", "--json", "-t", "2"], lib))
        sizes.append((r["prefix_tokens"], os.path.getsize(out)))
    (t0, b0), (t1, b1) = sizes
    return (b1 - b0) / (t1 - t0)


def one_model(a, shape, weights, doc_tokens, tmp):
    model = model_file(shape, weights, a.lib, a.cache)
    run = lambda arm, agents: two_builds.bench_run(a.bin, a.lib, arm, agents, doc_tokens, a.n_predict,  # noqa
                                                   tmp, model=model)
    r = {"shape": shape, "weights": weights, "doc_tokens": doc_tokens, "model_bytes": os.path.getsize(model)}
    t = time.time()
    r["llama_bench_pp_tokens_per_s"] = llama_bench(a.lib, model, doc_tokens)
    one, none = run("shared", 1), run("none", 1)
    sixteen, host = run("shared", 16), run("host", HOST_AGENTS)
    if shape in a.stock_steps:
        r["step_ms_16_no_exact"] = two_builds.bench_run(a.bin, a.lib, "shared", 16, doc_tokens, a.n_predict,
                                                        tmp, extra=["--no-exact"], model=model)["step_ms"]
    r.update({
        "prefill_tokens_per_s": one["prefill_tokens_per_s"], "prefill_ms": one["prefill_ms"],
        "step_ms_1": one["step_ms"], "step_ms_16": sixteen["step_ms"],
        "e2e_ms_shared_16": sixteen["end_to_end_ms"],
        "e2e_ms_none_1": none["end_to_end_ms"], "e2e_ms_none_16_extrapolated": 16 * none["end_to_end_ms"],
        "rss_kib_1": one["peak_rss_kib"], "rss_kib_shared_16": sixteen["peak_rss_kib"],
        "rss_kib_host_4": host["peak_rss_kib"],
        "answers_shared_eq_none_1": one["answers"] == none["answers"],
        "answers_host_eq_shared": host["answers"] == sixteen["answers"][:HOST_AGENTS],
    })
    r["snapshot_bytes_per_token"] = snapshot_bytes_per_token(a.bin, a.lib, model, tmp)
    r["seconds"] = time.time() - t
    log(f"{shape} {weights} @ {doc_tokens}: prefill {r['prefill_tokens_per_s']:.1f} tok/s "
        f"(llama-bench {r['llama_bench_pp_tokens_per_s']:.1f}), steps {r['step_ms_1']:.0f}/"
        f"{r['step_ms_16']:.0f} ms, {r['seconds']:.0f} s")
    return r


def timing(a):
    rows = []
    if os.path.exists(os.path.join(a.out, "trials.json")):
        with open(os.path.join(a.out, "trials.json")) as f:
            rows = json.load(f)  # a run cut short goes on where it stopped
    points = [(s, w) for s in a.shapes for w in a.weights_for.get(s, a.weights)]
    with tempfile.TemporaryDirectory(prefix="real-sizes-") as tmp:
        for trial in range(a.trials):
            for shape, weights in alternate(points, trial):
                if any(r["trial"] == trial and r["shape"] == shape and r["weights"] == weights for r in rows):
                    continue
                r = one_model(a, shape, weights, a.doc_tokens_for.get(shape, a.doc_tokens), tmp)
                rows.append(dict(r, trial=trial))
                with open(os.path.join(a.out, "trials.json"), "w") as f:
                    json.dump(rows, f, indent=1)


def median_rows(rows):
    keys = {}
    for r in rows:
        keys.setdefault((r["shape"], r["weights"]), []).append(r)
    out = []
    for (shape, weights), rs in keys.items():
        m = {k: (statistics.median(x[k] for x in rs) if isinstance(v, (int, float)) and not isinstance(v, bool)
                 else all(x[k] for x in rs) if isinstance(v, bool) else v) for k, v in rs[0].items()}
        m["trials"] = len(rs)
        out.append(m)
    return sorted(out, key=lambda m: (SHAPES.index(m["shape"]), m["weights"]))


def label(m):
    return f"{m['shape'].replace('llama-', '')}\n{m['weights']}\n{m['doc_tokens']:,} tok"


def plot(out, med):
    """OUT/plots/real-sizes.png: prefill over llama-bench's, and 16 agents' speed-up over none."""
    from swarmbench import style as ps
    fig, axes = ps.figure(1, 2, width=11.0)
    groups = [label(m) for m in med]
    by = {label(m): m for m in med}
    for ax, arm, value, name in (
            (axes[0][0], "shared", lambda m: m["prefill_tokens_per_s"] / m["llama_bench_pp_tokens_per_s"],
             "prefill: swarmkv (exact) tok/s / llama-bench tok/s"),
            (axes[0][1], "shared", lambda m: m["e2e_ms_none_16_extrapolated"] / m["e2e_ms_shared_16"],
             "16 agents end to end: none* s / shared s")):
        drawn = ps.grouped_points(ax, groups, [arm], lambda g, _a: value(by[g]), labels=groups,
                                  value_fmt=lambda v: f"{v:.2f}×")
        ps.value_scale(ax, drawn + [1.0], bars=False)
        ps.reference_line(ax, label="1×", legend=False)
        ps.panel_title(ax, name)
    ps.title(fig, "Random-weight models in Llama 3 shapes, native build, 2 threads (none*: 16 x one agent)")
    ps.save(fig, os.path.join(out, "plots", "real-sizes.png"))


def report(a):
    with open(os.path.join(a.out, "trials.json")) as f:
        rows = json.load(f)
    med = median_rows(rows)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"medians": med, "n_predict": a.n_predict, "threads": 2, "host_agents": HOST_AGENTS}, f,
                  indent=1)
    fields = sorted({k for r in rows for k in r})
    with open(os.path.join(a.out, "trials.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    speed = ["| model | weights | document tokens | prefill tok/s: swarmkv / llama-bench | ratio | "
             "step ms, 1 / 16 agents (16 --no-exact) | 16 agents end to end s: shared / none* | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    size = ["| model | weights | file GB | peak RSS MiB per agent: shared / host | snapshot KiB per token | "
            "break-even link | answers equal | trials |", "|---|---|---|---|---|---|---|---|"]
    for m in med:
        stock = f" ({m['step_ms_16_no_exact']:.0f})" if "step_ms_16_no_exact" in m else ""
        speed.append(
            f"| {m['shape']} | {m['weights']} | {m['doc_tokens']:,} | {m['prefill_tokens_per_s']:.1f} / "
            f"{m['llama_bench_pp_tokens_per_s']:.1f} | "
            f"{m['prefill_tokens_per_s'] / m['llama_bench_pp_tokens_per_s']:.2f}× | "
            f"{m['step_ms_1']:.0f} / {m['step_ms_16']:.0f}{stock} | {m['e2e_ms_shared_16'] / 1e3:.0f} / "
            f"{m['e2e_ms_none_16_extrapolated'] / 1e3:.0f} | "
            f"{m['e2e_ms_none_16_extrapolated'] / m['e2e_ms_shared_16']:.1f}× |")
        bpt = m["snapshot_bytes_per_token"]
        equal = m["answers_shared_eq_none_1"] and m["answers_host_eq_shared"]
        size.append(
            f"| {m['shape']} | {m['weights']} | {m['model_bytes'] / 1e9:.2f} | "
            f"{(m['rss_kib_shared_16'] - m['rss_kib_1']) / 15 / 1024:.1f} / "
            f"{(m['rss_kib_host_4'] - m['rss_kib_1']) / (HOST_AGENTS - 1) / 1024:.1f} | {bpt / 1024:.1f} | "
            f"{bpt * m['prefill_tokens_per_s'] * 8 / 1e6:.1f} Mbit/s | {'yes' if equal else 'NO'} | "
            f"{m['trials']} |")
    table = "\n".join(speed) + "\n\n" + "\n".join(size) + "\n"
    with open(os.path.join(a.out, "tables.md"), "w") as f:
        f.write(table)
    plot(a.out, med)
    print(table)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--lib", required=True, help="the native build's lib/ folder")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--weights", default="Q8_0,Q4_K_M")
    ap.add_argument("--doc-tokens", type=int, default=3501)
    ap.add_argument("--doc-tokens-for", action="append", default=[], help="SHAPE=N")
    ap.add_argument("--weights-for", action="append", default=[], help="SHAPE=W1,W2")
    ap.add_argument("--stock-steps", default="", help="shapes whose 16-agent step is timed --no-exact too")
    ap.add_argument("--n-predict", type=int, default=N_PREDICT)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/swarmkv/models/real-sizes"))
    ap.add_argument("--out", default=os.path.join(two_builds.ROOT, "bench", "results", "real-sizes"))
    ap.add_argument("--parts", default="timing,report")
    a = ap.parse_args()
    a.shapes, a.weights = a.shapes.split(","), a.weights.split(",")
    a.doc_tokens_for = {k: int(v) for k, v in (x.split("=") for x in a.doc_tokens_for)}
    a.weights_for = {k: v.split(",") for k, v in (x.split("=") for x in a.weights_for)}
    a.stock_steps = a.stock_steps.split(",")
    os.makedirs(a.cache, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    two_builds.start(a)
    if "timing" in a.parts:
        timing(a)
    if "report" in a.parts:
        report(a)


if __name__ == "__main__":
    main()
