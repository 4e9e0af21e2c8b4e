#!/usr/bin/env python3
"""Summarises command.sh's runs: the new default (exact) against --no-exact.

    summarize.py OUT_DIR

Reads OUT_DIR/agents/*/rows.json (SmolLM2 F16) and OUT_DIR/gemma3/*/rows.json
(Gemma 3 Q4_K_M) (bench/old_vs_new.py, "old" = --no-exact, "new" = the default), OUT_DIR/prefill/*.json (`swarmkv run --json` and
llama-bench -o json) and OUT_DIR/answers/*.json (`swarmkv run --json`);
writes summary.json, summary.csv, report.md and plots/*.png.
"""
import csv, glob, json, os, statistics, sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
from swarmbench.report import md_table  # noqa: E402

out = sys.argv[1]
med = statistics.median
load = lambda p: json.load(open(p))  # noqa: E731
summary = {"agents": [], "prefill": [], "answers": [], "needs": {}}

# ---------------------------------------------------------------- agents
fork_dirs = [("SmolLM2 F16", d) for d in sorted(glob.glob(os.path.join(out, "agents", "*")))] + \
    [("Gemma 3 Q4_K_M", d) for d in sorted(glob.glob(os.path.join(out, "gemma3", "*")))]
for model, fork_dir in fork_dirs:
    rows = load(os.path.join(fork_dir, "rows.json"))
    for n in sorted({r["branches"] for r in rows}):
        for fork in sorted({r["fork"] for r in rows}):
            pick = lambda arm, k: [r[k] for r in rows if r["branches"] == n and r["fork"] == fork  # noqa: E731
                                   and r["binary"] == arm]
            if not pick("new", "total_ms"):
                continue
            summary["agents"].append({
                "model": model, "fork": fork, "agents": n, "trials": len(pick("new", "total_ms")),
                "prefix_tokens": rows[0]["prefix_tokens"],
                "stock_branch_ms": pick("old", "branch_phase_ms"), "exact_branch_ms": pick("new", "branch_phase_ms"),
                "stock_total_ms": pick("old", "total_ms"), "exact_total_ms": pick("new", "total_ms"),
                "branch_ratio": med(pick("new", "branch_phase_ms")) / med(pick("old", "branch_phase_ms")),
                "total_ratio": med(pick("new", "total_ms")) / med(pick("old", "total_ms")),
                "all_ok": all(r["ok"] for r in rows if r["branches"] == n and r["fork"] == fork)})

# 50 agents against the reference: every agent re-prefilling (measured at 1 agent, times 50).
smol = [a for a in summary["agents"] if a["model"] == "SmolLM2 F16"]
none1 = [a for a in smol if a["fork"] == "none" and a["agents"] == 1]
shared50 = [a for a in smol if a["fork"] == "shared" and a["agents"] == 50]
if none1 and shared50:
    for arm in ("stock", "exact"):
        ref = 50 * med(none1[0][f"{arm}_total_ms"])
        summary[f"speedup_50_{arm}"] = ref / med(shared50[0][f"{arm}_total_ms"])

# ---------------------------------------------------------------- prefill
pre = os.path.join(out, "prefill")
models = []
for p in sorted(glob.glob(os.path.join(pre, "*-exact-*.json"))):
    m = os.path.basename(p).split("-exact-")[0]
    if m not in models:
        models.append(m)
for m in models:
    rate = lambda arm: [d["prefix_tokens"] / d["prefill_ms"] * 1000  # noqa: E731
                        for d in map(load, sorted(glob.glob(os.path.join(pre, f"{m}-{arm}-*.json"))))]
    summary["prefill"].append({"weights": m, "stock_tok_s": rate("stock"), "exact_tok_s": rate("exact"),
                               "exact_over_stock": med(rate("exact")) / med(rate("stock"))})
for fa in ("fa1", "fa0"):
    runs = [load(p)[0] for p in sorted(glob.glob(os.path.join(pre, f"llama-bench-{fa}-*.json")))]
    if runs:
        summary[f"llama_bench_{fa}_tok_s"] = [r["avg_ts"] for r in runs]
        summary[f"llama_bench_{fa}_n_prompt"] = runs[0]["n_prompt"]

# ---------------------------------------------------------------- answers
ans = os.path.join(out, "answers")
groups = {}
for p in sorted(glob.glob(os.path.join(ans, "*.json"))):
    name = os.path.basename(p)[:-5]
    stem, fork = name.rsplit("-", 1)
    groups.setdefault(stem, {})[fork] = load(p)
for stem, by_fork in groups.items():
    if not {"shared", "host", "none"} <= set(by_fork):
        continue
    ref = {a["name"]: a["tokens"] for a in by_fork["none"]["agents"]}
    row = {"run": stem, "agents": len(ref), "exact": [by_fork[f]["exact"] for f in ("shared", "host", "none")],
           "ok": [by_fork[f]["ok"] for f in ("shared", "host", "none")]}
    for fork in ("shared", "host"):
        row[f"{fork}_equal_none"] = sum(a["tokens"] == ref[a["name"]] for a in by_fork[fork]["agents"])
    summary["answers"].append(row)
with_needs = groups.get("smollm2-contract-review", {}).get("shared")
without = groups.get("smollm2-contract-review-without-needs", {}).get("shared")
if with_needs and without:
    done = lambda r: {a["name"]: a["timings_ms"]["done_at"] for a in r["agents"]}  # noqa: E731
    w, wo = done(with_needs), done(without)
    summary["needs"] = {"with_needs_done_at_ms": w, "without_needs_done_at_ms": wo,
                        "ratio": {k: w[k] / wo[k] for k in w if k != "definitions"},
                        "prefill_ms": [with_needs["prefill_ms"], without["prefill_ms"]]}

json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["what", "stock_median", "exact_median", "exact_over_stock", "trials"])
    for a in summary["agents"]:
        for k, label in (("branch", "branch phase ms"), ("total", "end to end ms")):
            w.writerow([f"{a['model']} {a['fork']} {a['agents']} agents {label}", med(a[f"stock_{k}_ms"]),
                        med(a[f"exact_{k}_ms"]), a[f"{k}_ratio"], a["trials"]])
    for p in summary["prefill"]:
        w.writerow([f"prefill tok/s {p['weights']}", med(p["stock_tok_s"]), med(p["exact_tok_s"]),
                    p["exact_over_stock"], len(p["exact_tok_s"])])

# ---------------------------------------------------------------- report


L = ["# Exact mode by default: the new default against `--no-exact`", "",
     "One binary, back to back; `--no-exact` is the former default (llama.cpp's stock kernels, flash "
     "attention off). SmolLM2-135M F16 unless said, 2 threads; medians of the trials listed.", "",
     "## Agents (the licences' text, %s tokens on SmolLM2, 32 greedy tokens each)" % (
         smol[0]["prefix_tokens"] if smol else "?"), ""]
L += md_table(["model", "fork", "agents", "trials", "branch phase `--no-exact` s", "exact s", "exact / no-exact",
            "end to end `--no-exact` s", "exact s", "exact / no-exact"],
           [[a["model"], a["fork"], a["agents"], a["trials"], f"{med(a['stock_branch_ms']) / 1000:.2f}",
             f"{med(a['exact_branch_ms']) / 1000:.2f}", f"{a['branch_ratio']:.3f}",
             f"{med(a['stock_total_ms']) / 1000:.2f}", f"{med(a['exact_total_ms']) / 1000:.2f}",
             f"{a['total_ratio']:.3f}"] for a in summary["agents"]])
if "speedup_50_exact" in summary:
    L += ["", f"50 agents against every agent re-prefilling (the 1-agent `none` run's end to end × 50, "
              f"measured in the same trials): exact {summary['speedup_50_exact']:.1f}×, "
              f"`--no-exact` {summary['speedup_50_stock']:.1f}×."]
L += ["", "## Prefill of the README document (store off)", ""]
L += md_table(["weights", "`--no-exact` tok/s", "exact tok/s", "exact / no-exact", "trials"],
           [[p["weights"], f"{med(p['stock_tok_s']):.0f}", f"{med(p['exact_tok_s']):.0f}",
             f"{p['exact_over_stock']:.3f}", len(p["exact_tok_s"])] for p in summary["prefill"]])
if "llama_bench_fa1_tok_s" in summary:
    f16 = [p for p in summary["prefill"] if p["weights"] == "F16"][0]
    fa1, fa0 = med(summary["llama_bench_fa1_tok_s"]), med(summary["llama_bench_fa0_tok_s"])
    L += ["", f"llama-bench on F16, pp{summary['llama_bench_fa1_n_prompt']}, 2 threads, in the same trials: "
              f"flash attention on (ggml's tiled CPU kernel: llama-bench does not set "
              f"GGML_CPU_FA_BATCH_INVARIANT) {fa1:.0f} tok/s, off {fa0:.0f} tok/s; SwarmKV exact "
              f"{med(f16['exact_tok_s']):.0f} tok/s = {med(f16['exact_tok_s']) / fa1:.3f}× llama-bench with "
              f"flash attention on."]
L += ["", "## Answers under the default (exact)", ""]
L += md_table(["run", "agents", "exact (shared, host, none)", "shared == none", "host == none"],
           [[r["run"], r["agents"], r["exact"], f"{r['shared_equal_none']}/{r['agents']}",
             f"{r['host_equal_none']}/{r['agents']}"] for r in summary["answers"]])
if summary["needs"]:
    n = summary["needs"]
    L += ["", "contract-review, shared, exact, with and without `needs` (one run each): whole-document "
              "agents' done_at_ms with / without: " +
          ", ".join(f"{k} {n['with_needs_done_at_ms'][k]:.0f} / {n['without_needs_done_at_ms'][k]:.0f} "
                    f"({v:.2f}×)" for k, v in n["ratio"].items()) +
          f"; prefill_ms {n['prefill_ms'][0]:.0f} / {n['prefill_ms'][1]:.0f}."]
L += ["", "Reproduce: `bench/results/exact-default/command.sh` (TRIALS=3).", "",
      "![agents](plots/agents.png)", "", "![prefill](plots/prefill.png)"]
open(os.path.join(out, "report.md"), "w").write("\n".join(L) + "\n")

# ---------------------------------------------------------------- plots
try:
    from swarmbench import style as ps
except ImportError:
    print("matplotlib missing: no plots", file=sys.stderr)
    sys.exit(0)
os.makedirs(os.path.join(out, "plots"), exist_ok=True)
pts = [a for a in smol if a["fork"] != "none"]
fig, axes = ps.figure(1, 2, width=11, height_per_row=3.6)
keys = [f"{a['fork']} {a['agents']}" for a in pts]
by = {f"{a['fork']} {a['agents']}": a for a in pts}
for ax, k, label in ((axes[0][0], "branch", "branch phase"), (axes[0][1], "total", "end to end")):
    drawn = ps.grouped_points(ax, keys, ["exact"], lambda g, _arm: by[g][f"{k}_ratio"],
                              lambda g, _arm: [v / med(by[g][f"stock_{k}_ms"]) for v in by[g][f"exact_{k}_ms"]],
                              labels=[g.replace(" ", "\n") + (" agent" if by[g]["agents"] == 1 else " agents")
                                      for g in keys],
                              value_fmt=lambda v: f"{v:.2f}")
    ps.value_scale(ax, drawn, bars=False, base=1.0)
    ps.reference_line(ax, label="1 = as fast as --no-exact", legend=False)
    ax.set_ylabel("exact / --no-exact")
    ps.panel_title(ax, f"{label}: exact over --no-exact (large dot: ratio of medians; small dots: each trial over "
                       f"the --no-exact median); below 1 = exact faster")
ps.title(fig, "Exact mode by default vs the former default, SmolLM2 F16, 2 threads")
ps.save(fig, os.path.join(out, "plots", "agents.png"))

fig, axes = ps.figure(1, 1, width=8, height_per_row=3.6)
ax = axes[0][0]
w = [p["weights"] for p in summary["prefill"]]
byw = {p["weights"]: p for p in summary["prefill"]}
bars = ps.grouped(ax, w, ["none", "shared"],
                  lambda g, arm: med(byw[g]["stock_tok_s" if arm == "none" else "exact_tok_s"]),
                  lambda g, arm: byw[g]["stock_tok_s" if arm == "none" else "exact_tok_s"],
                  value_fmt=lambda v: f"{v:.0f}")
ax.set_ylabel("prefill tokens/s")
ps.arm_legend(ax, ["none", "shared"], dots="one trial", names={"none": "--no-exact", "shared": "exact (default)"},
              points=not bars)
ps.panel_title(ax, f"README document prefill, store off ({'bar' if bars else 'large dot'}: median; dots: trials)")
ps.title(fig, "Prefill speed by weight type: exact (default) vs --no-exact")
ps.save(fig, os.path.join(out, "plots", "prefill.png"))
