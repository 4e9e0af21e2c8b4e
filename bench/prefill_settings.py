"""Engine settings and weight formats for the document prefill, in one run.

For each configuration (weights x flash attention x KV type) it measures, with
the arms interleaved and their order reversed every other trial:

  parity   SwarmKV's own prefill (swarmkv_prefill_bench) next to llama-bench of
           the same llama.cpp build at equal settings: model, threads,
           n_batch/n_ubatch, flash attention, KV type and length (depth 0);
  grid     llama-bench pp512 and tg32 (the issue's table);
  readme   the README pipeline end to end (`swarmkv run`, snapshot store off):
           prefill tokens/s, total, branch phase, the answers;
  agents16 `swarmkv run`, 16 agents (32 tokens each) over the README's
           document, shared fork, snapshot store off;
  quality  llama-perplexity of each weight format on a real text.

usage: python3 bench/prefill_settings.py --build build/release --llama PREFIX
           --models q4_1=PATH,q4_0=PATH,f16=PATH --out bench/results/prefill-settings
           [--trials 3] [--doc-tokens 3501] [--text /usr/share/common-licenses/GPL-3]

Writes OUT/results.json (every sample), OUT/*.csv (one per table),
OUT/command.txt; bench/plot_prefill_settings.py draws OUT/plots and the report.
"""
import argparse
import csv
import json
import os
import re
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report, trials  # noqa: E402
from swarmbench.trials import alternate as order  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True, help="the release build folder (swarmkv, bench/swarmkv_prefill_bench)")
ap.add_argument("--llama", required=True, help="the llama.cpp prefix with bin/llama-bench, bin/llama-perplexity")
ap.add_argument("--models", required=True, help="name=path,... (the first is the baseline)")
ap.add_argument("--out", required=True)
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--doc-tokens", type=int, default=3501)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3", help="real text for perplexity")
ap.add_argument("--pipeline", default=os.path.join(os.path.dirname(__file__), "..", "examples", "pipelines",
                                                   "apache-license.yaml"))
ap.add_argument("--configs", default="",
                help="model:fa:kv[:n_ubatch],... to measure (default: every model with fa off and on, kv "
                     "f16, plus q8_0 KV with fa on for every model; n_ubatch 512)")
ap.add_argument("--agents16-configs", default="", help="model:fa:kv,... for the 16-agent runs (default: all)")
ap.add_argument("--skip", default="", help="comma list of sections to skip: parity,grid,readme,agents16,quality")
ap.add_argument("--resume", action="store_true",
                help="keep the sections OUT/results.json already holds and measure only the others")
args = ap.parse_args()

models = dict(kv.split("=", 1) for kv in args.models.split(","))
names = list(models)
skip = set(filter(None, args.skip.split(",")))
swarmkv = os.path.join(args.build, "swarmkv")
prefill_bench = os.path.join(args.build, "bench", "swarmkv_prefill_bench")
llama_bench = os.path.join(args.llama, "bin", "llama-bench")
llama_ppl = os.path.join(args.llama, "bin", "llama-perplexity")
os.makedirs(args.out, exist_ok=True)


def parse_configs(text):
    out = []
    for item in filter(None, text.split(",")):
        m, fa, kv, *ub = item.split(":")
        out.append((m, fa == "on", kv, int(ub[0]) if ub else 512))
    return out


configs = parse_configs(args.configs) or (
    [(m, fa, "f16", 512) for m in names for fa in (False, True)] + [(m, True, "q8_0", 512) for m in names])
agents16_configs = parse_configs(args.agents16_configs) or configs


def label(c):
    m, fa, kv, ub = c
    return f"{m} fa-{'on' if fa else 'off'}" + ("" if kv == "f16" else f" kv-{kv}") + ("" if ub == 512 else f" ub-{ub}")


def run(cmd, timeout=1800):
    return trials.run(cmd, timeout)


def llama_bench_tps(model, fa, kv, ub, prompt, gen, reps):
    """tokens/s samples of one llama-bench test (pp when prompt > 0, tg when gen > 0)."""
    cmd = [llama_bench, "-m", model, "-t", str(args.threads), "-b", "512", "-ub", str(ub), "-fa", "1" if fa else "0",
           "-ctk", kv, "-ctv", kv, "-p", str(prompt), "-n", str(gen), "-r", str(reps), "-o", "json"]
    rows = json.loads(run(cmd).stdout)
    assert len(rows) == 1, rows
    n = prompt if prompt > 0 else gen
    return [n / (ns / 1e9) for ns in rows[0]["samples_ns"]]


def ours_tps(model, fa, kv, ub, tokens, reps):
    out = tempfile.mktemp(suffix=".json")
    run([prefill_bench, "--model", model, "--doc-tokens", str(tokens), "--n-batch", "512", "--n-ubatch", str(ub),
         "--trials", str(reps),
         "--threads", str(args.threads), "--flash-attn", "on" if fa else "off", "--kv-type", kv, "--out", out])
    r = json.load(open(out))
    os.unlink(out)
    return [r["params"]["doc_tokens"] / (ms / 1000) for ms in r["results"][0]["prefill_ms"]]


results = {}
results_path = os.path.join(args.out, "results.json")
if args.resume and os.path.exists(results_path):
    results = json.load(open(results_path))
    skip |= {k for k in ("parity", "grid", "readme", "agents16", "quality") if k in results}
results.update({"params": vars(args), "models": models, "configs": [label(c) for c in configs]})


def keep():
    """results.json after every section: a failure later loses nothing measured."""
    report.write_json(results_path, results, indent=2)


cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
results["environment"] = {"cpu": cpu, "cores": os.cpu_count(),
                          "engine": json.loads(run([swarmkv, "info", "--model", models[names[0]]]).stdout)["engine"]}

# ---------------------------------------------------------------- parity
if "parity" not in skip:
    parity = {label(c): {"ours": [], "llama_bench": []} for c in configs}
    for trial in range(args.trials):
        for c in order(configs, trial):
            m, fa, kv, ub = c
            arms = [("ours", lambda: ours_tps(models[m], fa, kv, ub, args.doc_tokens, 1)),
                    ("llama_bench", lambda: llama_bench_tps(models[m], fa, kv, ub, args.doc_tokens, 0, 1))]
            for arm, f in order(arms, trial):
                parity[label(c)][arm] += f()
    results["parity"] = parity
    keep()
    with open(os.path.join(args.out, "parity.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "tokens", "ours_median_tps", "llama_bench_median_tps", "ratio", "ours_samples",
                    "llama_bench_samples"])
        for k, v in parity.items():
            o, l = statistics.median(v["ours"]), statistics.median(v["llama_bench"])
            w.writerow([k, args.doc_tokens, f"{o:.1f}", f"{l:.1f}", f"{o / l:.3f}",
                        " ".join(f"{x:.1f}" for x in v["ours"]), " ".join(f"{x:.1f}" for x in v["llama_bench"])])

# ---------------------------------------------------------------- grid
if "grid" not in skip:
    grid = {}
    for c in configs:
        m, fa, kv, ub = c
        grid[label(c)] = {"pp512": llama_bench_tps(models[m], fa, kv, ub, 512, 0, args.trials),
                          "tg32": llama_bench_tps(models[m], fa, kv, ub, 0, 32, args.trials)}
    results["grid"] = grid
    keep()
    with open(os.path.join(args.out, "grid.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "pp512_median_tps", "tg32_median_tps"])
        for k, v in grid.items():
            w.writerow([k, f"{statistics.median(v['pp512']):.1f}", f"{statistics.median(v['tg32']):.1f}"])


# ---------------------------------------------------------------- readme
def readme_run(c, pipeline=args.pipeline):
    m, fa, kv, ub = c
    p = run([swarmkv, "run", pipeline, "--model", models[m], "--snapshot-cache", "off", "--json",
             "--threads", str(args.threads), "--flash-attn", "on" if fa else "off", "--kv-type", kv,
             "--n-ubatch", str(ub)])
    r = json.loads(p.stdout)
    return {"prefill_ms": r["prefill_ms"], "prefix_tokens": r["prefix_tokens"], "total_ms": r["total_ms"],
            "branch_phase_ms": r["total_ms"] - r["prefill_ms"], "snapshot_bytes": r["snapshot"]["bytes"],
            "answers": {a["name"]: a["answer"] for a in r["agents"]},
            "n_tokens": {a["name"]: a["n_tokens"] for a in r["agents"]},
            "ok": r["ok"], "engine": r["engine"]}


if "readme" not in skip:
    readme = {label(c): [] for c in configs}
    for trial in range(args.trials):
        for c in order(configs, trial):
            readme[label(c)].append(readme_run(c))
    results["readme"] = readme
    keep()
    base = readme[label(configs[0])][0]["answers"]
    with open(os.path.join(args.out, "readme.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "prefix_tokens", "prefill_median_ms", "prefill_tps", "total_median_ms",
                    "branch_phase_median_ms", "snapshot_bytes", "answers_equal_to_" + label(configs[0]).replace(" ", "_"),
                    "answers_repeat_across_trials"])
        for k, runs in readme.items():
            pre = statistics.median(r["prefill_ms"] for r in runs)
            same = sum(runs[0]["answers"][a] == base[a] for a in base)
            repeat = all(r["answers"] == runs[0]["answers"] for r in runs)
            w.writerow([k, runs[0]["prefix_tokens"], f"{pre:.0f}", f"{runs[0]['prefix_tokens'] / pre * 1000:.1f}",
                        f"{statistics.median(r['total_ms'] for r in runs):.0f}",
                        f"{statistics.median(r['branch_phase_ms'] for r in runs):.0f}", runs[0]["snapshot_bytes"],
                        f"{same}/{len(base)}", repeat])

# ---------------------------------------------------------------- agents16
SIXTEEN = [
    "Summarise the licence in one paragraph.", "What may a licensee do with the Work?",
    "What must a redistributor keep in the source?", "What does the NOTICE file have to contain?",
    "When does the patent licence terminate?", "What is a Contribution?", "Who is a Contributor?",
    "What does the licence say about trademarks?", "What warranty does the licence give?",
    "What limits the Contributors' liability?", "May a licensee offer support for a fee?",
    "What is a Derivative Work?", "How is the licence applied to a new work?",
    "What is the Source form of a work?", "What counts as Object form?", "What is the Legal Entity?"]


def sixteen_agents_pipeline(path):
    doc = os.path.relpath(os.path.join(os.path.dirname(args.pipeline), "..", "documents", "apache-2.0.txt"),
                          os.path.dirname(path))
    lines = ["name: sixteen-agents", f"document: {{file: {json.dumps(doc)}}}", "defaults: {max_tokens: 32}",
             "agents:"]
    lines += [f"  - {{name: a{i:02d}, prompt: {json.dumps(q)}}}" for i, q in enumerate(SIXTEEN)]
    open(path, "w").write("\n".join(lines) + "\n")


if "agents16" not in skip:
    agents16 = {label(c): [] for c in agents16_configs}
    pipeline16 = os.path.join(args.out, "sixteen-agents.yaml")
    sixteen_agents_pipeline(pipeline16)
    for trial in range(args.trials):
        for c in order(agents16_configs, trial):
            agents16[label(c)].append(readme_run(c, pipeline16))
    results["agents16"] = agents16
    keep()
    with open(os.path.join(args.out, "agents16.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "prefix_tokens", "prefill_median_ms", "total_median_ms", "branch_phase_median_ms",
                    "answers_repeat_across_trials"])
        for k, runs in agents16.items():
            w.writerow([k, runs[0]["prefix_tokens"], f"{statistics.median(r['prefill_ms'] for r in runs):.0f}",
                        f"{statistics.median(r['total_ms'] for r in runs):.0f}",
                        f"{statistics.median(r['branch_phase_ms'] for r in runs):.0f}",
                        all(r["answers"] == runs[0]["answers"] for r in runs)])

# ---------------------------------------------------------------- quality
if "quality" not in skip:
    quality = {}
    for m in names:
        p = run([llama_ppl, "-m", models[m], "-f", args.text, "-c", "512", "-b", "512", "-t", str(args.threads)])
        found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", p.stdout + p.stderr)
        if not found:
            sys.exit(f"llama-perplexity printed no final estimate for {m}")
        quality[m] = {"ppl": float(found.group(1)), "ppl_stderr": float(found.group(2)),
                      "size_bytes": os.path.getsize(models[m])}
    results["quality"] = quality
    keep()
    with open(os.path.join(args.out, "quality.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "ppl", "ppl_stderr", "size_bytes"])
        for m, q in quality.items():
            w.writerow([m, q["ppl"], q["ppl_stderr"], q["size_bytes"]])

keep()
report.write_command(args.out, "command.txt", python="python3")
print(f"results in {args.out}", file=sys.stderr)
