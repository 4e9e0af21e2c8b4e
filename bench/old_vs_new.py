#!/usr/bin/env python3
"""Two swarmkv binaries alternated back to back on the same pipelines.

  bench/old_vs_new.py OLD_BIN NEW_BIN MODEL OUT_DIR [--trials 3] [--branches 8,16] [--forks host,shared]
  bench/old_vs_new.py --plot-only OUT_DIR   (redraws branch_phase.png from OUT_DIR/rows.json; runs nothing)

Writes OUT_DIR/pipeline-<n>.json (the runs' input: the first 17,080
characters of the Apache 2.0 and MPL 2.0 licences, ~3,500 tokens with the
template, one 32-token question per branch), rows.json, rows.csv,
report.md and branch_phase.png. The binaries alternate within each trial
and swap order on every other trial; the branch phase is total_ms -
prefill_ms (what the fork strategy and scheduler cost after the one
document prefill), compared by medians.
"""
import argparse, json, os, statistics, subprocess, sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import ROOT as root, report  # noqa: E402
from swarmbench.trials import alternate  # noqa: E402


def plot_branch_phase(rows, out):
    """branch_phase.png: old vs new per fork (trials as dots), and new / old in its own panel (points)."""
    try:
        from swarmbench import style as ps
        from matplotlib.lines import Line2D
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    med = statistics.median
    ns = sorted({r["branches"] for r in rows})
    forks = list(dict.fromkeys(r["fork"] for r in rows))
    phase = lambda n, fork, b: [r["branch_phase_ms"] / 1000 for r in rows  # noqa: E731
                                if r["branches"] == n and r["fork"] == fork and r["binary"] == b]
    trials = len({r["trial"] for r in rows})
    fig, axes = ps.figure(1, len(forks) + 1, width=4.0 * (len(forks) + 1), height_per_row=3.6)
    every = [t for n in ns for fork in forks for b in ("old", "new") for t in phase(n, fork, b)]
    bars = ps.bars_fit(every)  # one presentation and one scale for the forks' panels, so they compare too
    draw = ps.grouped_bars if bars else ps.grouped_points
    drawn = []
    for ax, fork in zip(axes[0], forks):
        drawn += draw(ax, ns, ["old", "new"], lambda n, b: med(phase(n, fork, b)), lambda n, b: phase(n, fork, b),
                      labels=[str(n) for n in ns])
        ax.set_xlabel("branches")
        ax.set_ylabel("branch phase s")
        ps.panel_title(ax, f"{fork} fork: branch phase (total − prefill; {'bar' if bars else 'large dot'}: "
                           f"median of {trials} trials)")
    for ax in axes[0][:-1]:
        ps.value_scale(ax, drawn, bars=bars)
    ax = axes[0][-1]
    drawn = ps.grouped_points(ax, ns, forks, lambda n, fork: med(phase(n, fork, "new")) / med(phase(n, fork, "old")),
                              labels=[str(n) for n in ns], value_fmt=lambda v: f"{v:.3f}")
    ps.value_scale(ax, drawn, bars=False, base=1.0)
    reference = ps.reference_line(ax, label="1 = as fast as old", legend=False)
    ax.set_xlabel("branches")
    ax.set_ylabel("new / old")
    ps.panel_title(ax, "new / old branch phase, ratio of medians (below 1 = new faster)")
    ps.arm_legend(ax, ["old", "new"], dots="one trial", points=not bars,
                  extra=[*(Line2D([], [], color=ps.colour(f), label=f"{f}: new / old", **ps.MEDIAN) for f in forks),
                         reference])
    ps.title(fig, f"Old vs new binary, alternated back to back: document of {rows[0]['prefix_tokens']} tokens, "
                  "32 generated tokens per branch")
    ps.save(fig, os.path.join(out, "branch_phase.png"))


ap = argparse.ArgumentParser()
ap.add_argument("old", nargs="?"); ap.add_argument("new", nargs="?"); ap.add_argument("model", nargs="?")
ap.add_argument("out", nargs="?")
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--branches", default="8,16")
ap.add_argument("--forks", default="host,shared")
ap.add_argument("--rows", help="rows.json of an earlier run: write the outputs from it, run nothing")
ap.add_argument("--plot-only", metavar="OUT_DIR", help="redraw OUT_DIR/branch_phase.png from OUT_DIR/rows.json")
args = ap.parse_args()
if args.plot_only:
    plot_branch_phase(json.load(open(os.path.join(args.plot_only, "rows.json"))), args.plot_only)
    sys.exit(0)
if not args.out:
    ap.error("OLD_BIN NEW_BIN MODEL OUT_DIR are required (or --plot-only OUT_DIR)")
os.makedirs(args.out, exist_ok=True)
docs = os.path.join(root, "examples", "documents")
doc = (open(os.path.join(docs, "apache-2.0.txt")).read() + "\n\n" +
       open(os.path.join(docs, "mpl-2.0.txt")).read())[:17080]
branches = [int(b) for b in args.branches.split(",")]
forks = args.forks.split(",")
for n in branches:
    agents = [{"name": f"branch{i}", "prompt": f"Question {i + 1}: summarise clause {i + 1} of the licence.",
               "max_tokens": 32} for i in range(n)]
    json.dump({"name": f"perf{n}", "document": {"text": doc}, "agents": agents, "threads": 2},
              open(os.path.join(args.out, f"pipeline-{n}.json"), "w"), indent=1)

rows = json.load(open(args.rows)) if args.rows else []
for trial in range(1, 0 if args.rows else args.trials + 1):
    for n in branches:
        for fork in forks:
            for which in alternate(["old", "new"], trial - 1):
                binary = args.old if which == "old" else args.new
                proc = subprocess.run([binary, "run", os.path.join(args.out, f"pipeline-{n}.json"), "--model",
                                       args.model, "--fork", fork, "--json"], capture_output=True, text=True)
                d = json.loads(proc.stdout)
                row = {"trial": trial, "branches": n, "fork": fork, "binary": which, "ok": d["ok"],
                       "prefix_tokens": d["prefix_tokens"], "total_ms": d["total_ms"], "prefill_ms": d["prefill_ms"],
                       "branch_phase_ms": d["total_ms"] - d["prefill_ms"],
                       "answers": [a["answer"] for a in d["agents"]]}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "answers"}), flush=True)
json.dump(rows, open(os.path.join(args.out, "rows.json"), "w"), indent=1)
keys = ["trial", "branches", "fork", "binary", "ok", "prefix_tokens", "total_ms", "prefill_ms", "branch_phase_ms"]
report.write_csv(os.path.join(args.out, "rows.csv"), keys, [[r[k] for k in keys] for r in rows])

med = statistics.median
lines = ["# Old vs new binary, alternated back to back", "",
         f"{args.trials} trials; per trial each binary once per point, order swapped every other trial. "
         f"Document {rows[0]['prefix_tokens']} tokens (template included), 32 greedy tokens per branch, 2 threads.", "",
         "| branches | fork | old branch phase ms (median) | new (median) | new / old | old e2e ms | new e2e ms | answers identical |",
         "|---|---|---|---|---|---|---|---|"]
summary = []
for n in branches:
    for fork in forks:
        pick = lambda b, k: [r[k] for r in rows if r["branches"] == n and r["fork"] == fork and r["binary"] == b]
        point = [r for r in rows if r["branches"] == n and r["fork"] == fork]
        same = all(r["answers"] == point[0]["answers"] for r in point)
        ratio = med(pick("new", "branch_phase_ms")) / med(pick("old", "branch_phase_ms"))
        summary.append({"branches": n, "fork": fork, "old_branch_phase_ms": pick("old", "branch_phase_ms"),
                        "new_branch_phase_ms": pick("new", "branch_phase_ms"), "new_over_old": ratio,
                        "answers_identical": same})
        lines.append(f"| {n} | {fork} | {med(pick('old', 'branch_phase_ms')):.0f} | {med(pick('new', 'branch_phase_ms')):.0f} | "
                     f"{ratio:.3f} | {med(pick('old', 'total_ms')):.0f} | {med(pick('new', 'total_ms')):.0f} | {same} |")
json.dump(summary, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
lines += ["", "Reproduce:", "", "```sh",
          f"bench/old_vs_new.py OLD_BIN NEW_BIN MODEL {args.out} --trials {args.trials} --branches {args.branches} --forks {args.forks}",
          "```", "", "![branch phase](branch_phase.png)"]
open(os.path.join(args.out, "report.md"), "w").write("\n".join(lines) + "\n")
plot_branch_phase(rows, args.out)
