#!/usr/bin/env python3
"""Summarises command.sh's runs: old vs new medians and answer identity.

    summarize.py OUT_DIR TRIALS [--title T] [--old WHAT] [--old-short REV] [--reading FILE]

Also summarises other old-vs-new folders laid out alike (the serve modes
are read from the file names; --reading replaces the "Reading it" notes).
Reads OUT_DIR/pipeline/rows.json (bench/old_vs_new.py), OUT_DIR/serve/*.json
(../serve/client.py) and OUT_DIR/answers/*.json (`swarmkv run --json`);
writes summary.json, summary.csv, report.md and plots/old_vs_new.png.
"""
import argparse, csv, json, os, statistics, sys, textwrap

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("trials", type=int)
ap.add_argument("--title", default="One core: old vs new binary, back to back")
ap.add_argument("--old", default="release build of 3260f4d (before issue 37)")
ap.add_argument("--old-short", default="3260f4d")
ap.add_argument("--setting", default="2-core machine, nothing else running")
ap.add_argument("--reading", help="markdown file: the report's notes instead of issue 37's")
args = ap.parse_args()
out, trials = args.out, args.trials
med = statistics.median
rows = []  # one per measured quantity: what, old median, new median, new/old, trials, identical


def answers_of(result):
    return [(a["name"], a["status"], a.get("answer"), a.get("tokens")) for a in result["agents"]]


# 16 agents, shared fork
pipeline = json.load(open(os.path.join(out, "pipeline", "rows.json")))
for field, label in (("branch_phase_ms", "pipeline 16 agents shared: branch phase ms"),
                     ("total_ms", "pipeline 16 agents shared: end to end ms")):
    old = [r[field] for r in pipeline if r["binary"] == "old"]
    new = [r[field] for r in pipeline if r["binary"] == "new"]
    rows.append({"what": label, "old": med(old), "new": med(new), "new_over_old": med(new) / med(old),
                 "trials": len(old), "old_trials": old, "new_trials": new})

# serve, 16 concurrent requests
serve_texts = {}
modes = sorted({f.rsplit("-", 1)[0].split("-", 1)[1] for f in os.listdir(os.path.join(out, "serve"))
                if f.endswith(".json")})
for mode in modes:
    times = {"old": [], "new": []}
    for which in ("old", "new"):
        for t in range(1, trials + 1):
            r = json.load(open(os.path.join(out, "serve", f"{which}-{mode}-{t}.json")))
            assert all(q["status"] == 200 for q in r["requests"]), (which, mode, t)
            times[which].append(r["end_to_end_s"] * 1000)
            serve_texts[(which, mode, t)] = [q["text"] for q in r["requests"]]
    identical = None
    if mode == "exact":  # arrival order does not change an exact answer
        first = serve_texts[("old", "exact", 1)]
        identical = all(v == first for k, v in serve_texts.items() if k[1] == "exact")
    rows.append({"what": f"serve 16 concurrent, {mode}: end to end ms", "old": med(times["old"]),
                 "new": med(times["new"]), "new_over_old": med(times["new"]) / med(times["old"]),
                 "trials": trials, "old_trials": times["old"], "new_trials": times["new"],
                 "answers_identical": identical})

# serve --exact with glibc's mmap threshold fixed (command.sh: serve-fixed-mmap)
fixed = os.path.join(out, "serve-fixed-mmap")
if os.path.isdir(fixed):
    times = {w: [json.load(open(os.path.join(fixed, f)))["end_to_end_s"] * 1000
                 for f in sorted(os.listdir(fixed)) if f.startswith(w + "-")] for w in ("old", "new")}
    rows.append({"what": "serve 16 concurrent, exact, fixed mmap threshold: end to end ms",
                 "old": med(times["old"]), "new": med(times["new"]),
                 "new_over_old": med(times["new"]) / med(times["old"]), "trials": len(times["old"]),
                 "old_trials": times["old"], "new_trials": times["new"]})

# answers, once per binary
for name in ("readme-shared", "readme-host", "readme-none", "contract-review", "cluster-host"):
    old = json.load(open(os.path.join(out, "answers", f"old-{name}.json")))
    new = json.load(open(os.path.join(out, "answers", f"new-{name}.json")))
    rows.append({"what": f"answers: {name}", "old": old["total_ms"], "new": new["total_ms"],
                 "new_over_old": new["total_ms"] / old["total_ms"], "trials": 1,
                 "answers_identical": answers_of(old) == answers_of(new),
                 "all_ok": old["ok"] and new["ok"] if "ok" in old else None})

json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=2)
with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["what", "old_median_ms", "new_median_ms", "new_over_old", "trials", "answers_identical"])
    for r in rows:
        w.writerow([r["what"], f"{r['old']:.1f}", f"{r['new']:.1f}", f"{r['new_over_old']:.3f}", r["trials"],
                    r.get("answers_identical", "")])

lines = [f"# {args.title}", "",
         f"Old: {args.old}; new: this commit. {trials} alternated trials "
         "for the timed rows (order swapped every other trial), one run per binary for the answer rows. "
         f"SmolLM2-135M-Instruct F16, 2 threads, {args.setting}.", "",
         "| what | old (median) | new (median) | new / old | trials | answers identical |",
         "|---|---|---|---|---|---|"]
for r in rows:
    ident = r.get("answers_identical")
    lines.append(f"| {r['what']} | {r['old']:.0f} | {r['new']:.0f} | {r['new_over_old']:.3f} | {r['trials']} | "
                 f"{'' if ident is None else ident} |")
lines += ["", f"Reproduce: `OLD=<release build of {args.old_short}>/swarmkv {os.path.join(out, 'command.sh')}`",
          "", "![old vs new](plots/old_vs_new.png)", "", "## Reading it", ""]
if args.reading:
    lines += [open(args.reading).read()]
else:
    lines += [
          "- The pipeline rows restore the document from the snapshot store (the first run of this "
          "script published it), so end to end is the branch phase: the fork and the scheduler after "
          "the document, which is what the one-core work changed.",
          "- `serve --exact` with glibc's default malloc: both binaries run the same decode steps and "
          "prefill the same tokens (`serve/*.metrics`), the attention calls have the same shapes "
          "(checked with gdb on `ggml_compute_forward_flash_attn_ext_f16_bi`), and the answers are "
          "identical; the extra time is inside the batch-invariant attention kernel (perf: "
          "`ggml_fa_bi_block` +38 % samples on both threads, the matrix products equal). With glibc's "
          "mmap threshold fixed, which takes the process's allocation history out of where ggml's "
          "buffers land, the two binaries are equal (the row above). A bisect put the change of "
          "placement at f9995bb (the sequence table), whose allocations come before the context's; "
          "3260f4d's history happened to place the buffers where the kernel runs ~15 % faster. "
          "That sensitivity is the kernel's (a lead for the shared-prefix attention issue), not a "
          "cost of the changed code.",
          "- The answer rows are one run per binary: their times are not a comparison; their point is "
          "that every answer is identical, token for token.", ""]
open(os.path.join(out, "report.md"), "w").write("\n".join(lines))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib missing: no plot", file=sys.stderr)
    sys.exit(0)
timed = [r for r in rows if r["trials"] > 1]
fig, ax = plt.subplots(figsize=(10, 4.2))
for i, r in enumerate(timed):
    ratios = [n / med(r["old_trials"]) for n in r["new_trials"]]
    ax.scatter([i] * len(ratios), ratios, color="black", s=12, zorder=3,
               label="one new trial / old median" if i == 0 else None)
    ax.hlines(r["new_over_old"], i - 0.25, i + 0.25, color="#4c72b0", lw=3, zorder=2,
              label="new median / old median" if i == 0 else None)
    ax.text(i + 0.28, r["new_over_old"], f"{r['new_over_old']:.3f}", va="center", fontsize=8)
ax.axhline(1.0, color="grey", lw=1, ls="--")
ax.axhspan(0.95, 1.05, color="grey", alpha=0.12, label="within 5 %")
labels = ["\n".join(textwrap.fill(part, 20) for part in r["what"].split(": ")) + f"\n({r['trials']} trials)"
          for r in timed]
ax.set_xticks(range(len(timed)), labels, fontsize=7)
ax.set_xlim(-0.6, len(timed) - 0.2)
ax.set_ylabel("new / old")
ax.set_ylim(0.8, 1.25)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
ax.set_title(f"Old ({args.old_short}) vs new, alternated trials; below 1 = new faster", fontsize=9)
fig.tight_layout()
os.makedirs(os.path.join(out, "plots"), exist_ok=True)
fig.savefig(os.path.join(out, "plots", "old_vs_new.png"), dpi=110, bbox_inches="tight")
