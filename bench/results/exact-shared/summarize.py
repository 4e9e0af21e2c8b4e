#!/usr/bin/python3
"""Summarises the exact-vs-inexact bench (command.sh): one table (report.md,
summary.csv, summary.json) and one plot (plots/branch_phase.png).

Branch phase = end to end - prefill (- export): what the agents cost once the
document's state exists. Answers equal = agents whose tokens equal the `none`
arm's in the same run (same settings: exact against none --exact).
Modes: exact-patched (our flash-attention row kernel), exact-api (without
it: GGML_CPU_FA_BATCH_INVARIANT=0), inexact (today's default settings)."""
import csv
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import plot_style  # noqa: E402

root = sys.argv[1]
rows = []
MODES = ("inexact", "exact-api", "exact-patched")
for mode in MODES:
    with open(os.path.join(root, mode, "all_trials.csv")) as f:
        for r in csv.DictReader(f):
            e2e = float(r["end_to_end_ms"])
            prefill = float(r["prefill_ms"] or 0) + float(r["export_ms"] or 0)
            arm = "none" if r["arm"] == "baseline" else r["arm"]
            rows.append({
                "mode": mode, "arm": arm, "agents": int(r["branches"]),
                "end_to_end_s": round(e2e / 1000, 2), "prefill_s": round(prefill / 1000, 2),
                "branch_phase_s": round((e2e - prefill) / 1000, 2) if arm != "none" else None,
                "answers_equal": r.get("answers_match_reference", r.get("answers_match_baseline")),
            })
with open(os.path.join(root, "summary.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
with open(os.path.join(root, "summary.json"), "w") as f:
    json.dump(rows, f, indent=1)


def get(mode, arm, n):
    for r in rows:
        if r["mode"] == mode and r["arm"] == arm and r["agents"] == n:
            return r
    return None


points = sorted({r["agents"] for r in rows})
lines = ["# Exact vs inexact shared fork (SmolLM2-135M F16, 2 threads, one trial per arm)", "",
         "Command: `bench/results/exact-shared/command.sh`. Each mode's reference is `none` with its "
         "own settings (`exact`: flash attention on, micro-batches of at most 63 rows, "
         "batch-invariant matmuls; `exact-api` without our attention kernel, so one-row steps on "
         "one thread; `exact-patched` with it). Branch phase = end to end − prefill − export.", "",
         "| agents | arm | mode | end to end s | prefill s | branch phase s | answers equal to its none |",
         "|---|---|---|---|---|---|---|"]
for n in points:
    for arm in ("none", "shared", "host"):
        for mode in MODES:
            r = get(mode, arm, n)
            if r:
                name = arm
                bp = "—" if r["branch_phase_s"] is None else f"{r['branch_phase_s']:.2f}"
                lines.append(f"| {n} | {name} | {mode} | {r['end_to_end_s']:.2f} | {r['prefill_s']:.2f} "
                             f"| {bp} | {r['answers_equal'] if arm != 'none' else '—'} |")
lines += ["", "Every mode's answers are compared with its own reference on this synthetic "
          "document (its near-ties are few); the exactness tests are in "
          "tests/pipeline_model_test.cpp (ExactForkTest), tests/engine_model_test.cpp "
          "(ExactKernelTest) and tests/attention_kernel_test.cpp (the row kernel, bit for bit).", "",
          "Exact shared against inexact shared, branch phase (end to end in brackets; goal for the "
          "patched kernel: ≤ 1.15×):", ""]
for n in points:
    i = get("inexact", "shared", n)
    for mode in ("exact-api", "exact-patched"):
        e = get(mode, "shared", n)
        if e and i and i["branch_phase_s"]:
            lines.append(f"- {n} agents, {mode}: {e['branch_phase_s']:.2f} s vs {i['branch_phase_s']:.2f} s = "
                         f"**{e['branch_phase_s'] / i['branch_phase_s']:.2f}×** "
                         f"({e['end_to_end_s']:.1f} s vs {i['end_to_end_s']:.1f} s, "
                         f"{e['end_to_end_s'] / i['end_to_end_s']:.2f}×)")
with open(os.path.join(root, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")

os.makedirs(os.path.join(root, "plots"), exist_ok=True)
fig, axes = plot_style.figure(1, 1, width=8.0)
ax = axes[0][0]
arms = ["shared inexact", "shared exact-api", "shared exact-patched", "host inexact", "host exact-api",
        "host exact-patched"]


def median(n, label):
    arm, mode = label.split()
    r = get(mode, arm, n)
    return r["branch_phase_s"] if r else None


drawn = plot_style.grouped_bars(ax, points, arms, median, labels=[f"{n} agents" for n in points],
                                value_fmt=lambda v: f"{v:.1f}")
plot_style.value_scale(ax, drawn, suffix=" s")
ax.set_ylabel("branch phase (s)")
plot_style.arm_legend(ax, arms)
plot_style.panel_title(ax, "Branch phase (end to end − prefill), 3,501-token document, 32 tokens per agent")
plot_style.save(fig, os.path.join(root, "plots", "branch_phase.png"))
print("\n".join(lines))
