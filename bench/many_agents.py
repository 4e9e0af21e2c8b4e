"""Fifty agents over one document: SwarmKV's shared fork against llama-server,
per-agent latency percentiles, and what max_live trades.

Sections, each a `swarmkv bench` run into OUT/<section>/ (skipped with
--resume when its best_run.json exists):

  baseline8  --branches 8 --arms none,shared: the reference (every agent
             re-prefills the document) measured at 8 agents; the report
             extrapolates it to --agents linearly (each agent's re-prefill
             and answer cost the same, one after another), next to shared
             at 8 for the measured ratio;
  arms       --branches AGENTS --arms shared,server-sequential,server-concurrent
             (no reference arm: at 50 agents it alone would take ~25 min);
  maxlive    --branches AGENTS --arms shared --max-live K for each K;
  long       with --long-model: --long-agents agents over a synthetic document
             of --long-doc-tokens tokens on that model (the sliding-window
             Gemma 3, 32k context), shared only.

Every run: the synthetic document of --doc-tokens tokens, --n-predict
greedy tokens per agent, 2 threads, one trial (the bench alternates nothing
within one arm; say so when comparing). Then writes OUT/results.json,
OUT/results.csv, OUT/plots/*.png, OUT/report.md and OUT/command.txt.

usage: python3 bench/many_agents.py [--out bench/results/many-agents]
           [--build build/release] [--model PATH] [--agents 50]
           [--doc-tokens 3501] [--n-predict 32] [--max-live 5,10,25,50] [--resume]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--out", default=os.path.join("bench", "results", "many-agents"))
ap.add_argument("--build", default=os.path.join("build", "release"))
ap.add_argument("--model", default=os.environ.get("SWARMKV_TEST_MODEL", ""))
ap.add_argument("--agents", type=int, default=50)
ap.add_argument("--baseline-agents", type=int, default=8)
ap.add_argument("--doc-tokens", type=int, default=3501)
ap.add_argument("--n-predict", type=int, default=32)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--max-live", default="5,10,25,50")
ap.add_argument("--long-model", default=os.environ.get("SWARMKV_TEST_MODEL_GEMMA3", ""))
ap.add_argument("--long-doc-tokens", type=int, default=16384)
ap.add_argument("--long-agents", type=int, default=16)
ap.add_argument("--resume", action="store_true")
args = ap.parse_args()
if not args.model:
    sys.exit("many_agents.py: --model or $SWARMKV_TEST_MODEL names the GGUF model")
os.makedirs(args.out, exist_ok=True)
swarmkv = os.path.join(args.build, "swarmkv")
common = ["--model", args.model, "--doc-tokens", str(args.doc_tokens), "--n-predict",
          str(args.n_predict), "-t", str(args.threads), "--trials", "1", "--server-kvu", "off"]


def bench(section, extra, base=None):
    out = os.path.join(args.out, section)
    done = os.path.join(out, "best_run.json")
    if not (args.resume and os.path.exists(done)):
        cmd = [swarmkv, "bench", *(base or common), "--out", out, *extra]
        print("[many-agents] " + shlex.join(cmd), file=sys.stderr, flush=True)
        t0 = time.monotonic()
        subprocess.run(cmd, check=True)
        print(f"[many-agents] {section}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    with open(done) as f:
        return json.load(f)


def arm(best, name):
    trial = best["results"][0]["arms"][name]["best_trial"]
    if trial is None:
        sys.exit(f"many_agents.py: arm {name} has no complete trial")
    return trial


base8 = bench("baseline8", ["--branches", str(args.baseline_agents), "--arms", "none,shared"])
arms50 = bench("arms", ["--branches", str(args.agents), "--arms",
                        "shared,server-sequential,server-concurrent"])
sweep = {}
for k in [int(x) for x in args.max_live.split(",")]:
    sweep[k] = bench(f"maxlive-{k}", ["--branches", str(args.agents), "--arms", "shared",
                                      "--max-live", str(k)])

long_run = None
if args.long_model:
    long_common = ["--model", args.long_model, "--doc-tokens", str(args.long_doc_tokens),
                   "--n-predict", str(args.n_predict), "-t", str(args.threads), "--trials", "1"]
    long_run = bench("long", ["--branches", str(args.long_agents), "--arms", "shared"], long_common)

rows = []


def row(label, agents, a, measured=True):
    lat = a["latency"]
    rows.append({
        "arm": label, "agents": agents, "measured": measured,
        "end_to_end_ms": a["end_to_end_ms"],
        "ttft_p50_ms": lat["ttft_ms"]["p50"], "ttft_p95_ms": lat["ttft_ms"]["p95"],
        "ttft_p99_ms": lat["ttft_ms"]["p99"],
        "completion_p50_ms": lat["completion_ms"]["p50"],
        "completion_p95_ms": lat["completion_ms"]["p95"],
        "completion_p99_ms": lat["completion_ms"]["p99"],
        # The server arms see whole answers only (no per-token times).
        "inter_token_p50_ms": None if label.startswith("server") else lat["inter_token_ms"]["p50"],
        "inter_token_p99_ms": None if label.startswith("server") else lat["inter_token_ms"]["p99"],
        "ok": a["ok"],
    })


none8 = arm(base8, "none")
shared8 = arm(base8, "shared")
row("none", args.baseline_agents, none8)
row("shared", args.baseline_agents, shared8)
for name in ("shared", "server-sequential", "server-concurrent"):
    row(name, args.agents, arm(arms50, name))
scale = args.agents / args.baseline_agents
extrapolated = {
    "arm": "none (extrapolated)", "agents": args.agents, "measured": False,
    "end_to_end_ms": none8["end_to_end_ms"] * scale,
    # The reference runs agents one after another: agent i finishes at i x the
    # per-agent time; its percentiles scale the same way.
    "completion_p50_ms": none8["latency"]["completion_ms"]["p50"] * scale,
    "completion_p99_ms": none8["latency"]["completion_ms"]["p99"] * scale,
}
maxlive_rows = []
for k, best in sweep.items():
    a = arm(best, "shared")
    lat = a["latency"]
    maxlive_rows.append({"max_live": k, "end_to_end_ms": a["end_to_end_ms"],
                         "ttft_p50_ms": lat["ttft_ms"]["p50"], "ttft_p99_ms": lat["ttft_ms"]["p99"],
                         "completion_p50_ms": lat["completion_ms"]["p50"],
                         "completion_p99_ms": lat["completion_ms"]["p99"],
                         "inter_token_p50_ms": lat["inter_token_ms"]["p50"], "ok": a["ok"]})

shared50 = arm(arms50, "shared")
seq50 = arm(arms50, "server-sequential")
conc50 = arm(arms50, "server-concurrent")
goals = {
    "shared_vs_extrapolated_baseline_end_to_end": extrapolated["end_to_end_ms"] / shared50["end_to_end_ms"],
    "shared_vs_baseline_end_to_end_measured_at_8": none8["end_to_end_ms"] / shared8["end_to_end_ms"],
    "shared_p99_completion_ms": shared50["latency"]["completion_ms"]["p99"],
    "server_sequential_p50_completion_ms": seq50["latency"]["completion_ms"]["p50"],
    "shared_vs_server_concurrent_end_to_end": conc50["end_to_end_ms"] / shared50["end_to_end_ms"],
    "shared_vs_server_sequential_end_to_end": seq50["end_to_end_ms"] / shared50["end_to_end_ms"],
}
goals["goal_25x_met"] = goals["shared_vs_extrapolated_baseline_end_to_end"] >= 25
goals["goal_p99_below_sequential_p50_met"] = (goals["shared_p99_completion_ms"]
                                              < goals["server_sequential_p50_completion_ms"])
command = report.invocation("python3", [a for a in sys.argv[1:] if a != "--resume"])
long_row = None
if long_run:
    a = arm(long_run, "shared")
    long_row = {"model": os.path.basename(args.long_model), "doc_tokens": args.long_doc_tokens,
                "agents": args.long_agents, "end_to_end_ms": a["end_to_end_ms"],
                "prefill_ms": a["prefill_ms"], "n_ctx": a["n_ctx"], "ok": a["ok"],
                "kv_bytes_peak": a["memory"]["kv_bytes_peak"], "latency": a["latency"],
                "peak_rss_kib": a["peak_rss_kib"]}
results = {"params": vars(args), "environment": arms50["environment"], "rows": rows,
           "long": long_row,
           "extrapolated_baseline": extrapolated, "max_live": maxlive_rows, "goals": goals,
           "command": command}
with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
report.write_csv(os.path.join(args.out, "results.csv"), list(rows[0].keys()), rows)
report.write_csv(os.path.join(args.out, "max_live.csv"), list(maxlive_rows[0].keys()), maxlive_rows)
report.write_command(args.out, "command.txt", python="python3",
                     argv=[a for a in sys.argv[1:] if a != "--resume"])
subprocess.run([sys.executable, os.path.join(HERE, "plot_many_agents.py"), args.out], check=True)
