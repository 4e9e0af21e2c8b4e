"""Shared-prefix attention (issue 43): one batched generation step of N
agents over one shared document, on two builds of the pinned llama.cpp.

`swarmkv bench --arms shared --n-predict 32` (default settings: exact, so
flash attention through the batch-invariant kernel, q8_0 K/V; synthetic
document) at 1, 4, 16 and 50 agents over 3,501 tokens and at 16 agents over
1,024 and 7,000 tokens, plus the re-prefill reference (`--arms none`, one
agent) for the 50-agent speed-up. "before" and "after" are two builds of
llama.cpp (their lib/ folders: --before-lib, --after-lib) under the same
swarmkv binary, its RUNPATH overridden with LD_LIBRARY_PATH. Each trial
runs every point on both builds, the builds' order swapped every other
trial; medians over --trials.

The step time is the median of the run's generation steps with all N agents
decoding (`generation_step_ms_by_branches`).

Writes OUT/results.json, OUT/trials.csv, OUT/report.md, OUT/plots/ and
OUT/command.sh.

usage: /usr/bin/python3 bench/prefix_attention.py --bin build/release/swarmkv
           --before-lib DIR --after-lib DIR [--out bench/results/prefix-attention]
           [--trials 3]
"""
import json
import os
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import builds as two_builds  # noqa: E402
from swarmbench import report  # noqa: E402
from swarmbench.trials import alternate  # noqa: E402
MODEL = two_builds.MODEL
POINTS = [(1, 3501), (4, 3501), (16, 3501), (50, 3501), (16, 1024), (16, 7000)]
N_PREDICT = 32


WORK = [("none", 1, 3501)] + [("shared", n, t) for n, t in POINTS]


def measure(a):
    """Every point on both builds, alternated, --trials times: one row per run."""
    tmp = tempfile.mkdtemp(prefix="swarmkv-prefix-attention-")
    builds = [("before", a.before_lib), ("after", a.after_lib)]
    rows = []
    for trial in range(a.trials):
        for kernel, lib in alternate(builds, trial):
            for arm, n, t in WORK:
                r = two_builds.bench_run(a.bin, lib, arm, n, t, N_PREDICT, tmp)
                r.update(trial=trial, kernel=kernel, arm=arm, agents=n, doc_tokens=t)
                rows.append(r)
                step = f"step {r['step_ms']:6.1f} ms" if r["step_ms"] is not None else "step    -    "
                print(f"trial {trial} {kernel:6} {arm:6} {n:2} agents {t:4} tokens: {step}, "
                      f"prefill {r['prefill_ms']:7.0f} ms, end to end {r['end_to_end_ms']:7.0f} ms",
                      flush=True)
    return rows


def pick(rows, kernel, arm, n, t):
    return [r for r in rows if r["kernel"] == kernel and r["arm"] == arm and r["agents"] == n
            and r["doc_tokens"] == t]


def summarise(a, rows):
    """Medians per point and build, the goals' ratios; writes OUT/results.json and OUT/trials.csv."""
    def med(kernel, arm, n, t, key):
        return statistics.median(r[key] for r in pick(rows, kernel, arm, n, t))

    summary = {"points": [], "answers_equal_across_builds_and_trials": True}
    for arm, n, t in WORK:
        same = len({json.dumps(r["answers"]) for r in pick(rows, "before", arm, n, t) + pick(rows, "after", arm, n, t)}) == 1
        summary["answers_equal_across_builds_and_trials"] &= same
        p = {"arm": arm, "agents": n, "doc_tokens": t, "answers_equal": same}
        for kernel in ("before", "after"):
            p[kernel] = {k: med(kernel, arm, n, t, k) for k in
                         ("end_to_end_ms", "prefill_ms", "prefill_tokens_per_s", "branch_phase_ms", "peak_rss_kib")}
            if arm == "shared":
                p[kernel]["step_ms"] = med(kernel, arm, n, t, "step_ms")
        summary["points"].append(p)
    point = {(p["arm"], p["agents"], p["doc_tokens"]): p for p in summary["points"]}
    for kernel in ("before", "after"):
        one = point[("shared", 1, 3501)][kernel]["step_ms"]
        summary[kernel] = {
            "step_16_over_1": point[("shared", 16, 3501)][kernel]["step_ms"] / one,
            "step_50_over_1": point[("shared", 50, 3501)][kernel]["step_ms"] / one,
            "speedup_50_vs_reprefill": 50 * point[("none", 1, 3501)][kernel]["end_to_end_ms"]
            / point[("shared", 50, 3501)][kernel]["end_to_end_ms"],
        }
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"trials": a.trials, "model": os.path.basename(MODEL), "n_predict": N_PREDICT,
                   "summary": summary,
                   "runs": [{k: v for k, v in r.items() if k != "answers"} for r in rows]}, f, indent=1)
    keys = ["trial", "kernel", "arm", "agents", "doc_tokens", "step_ms", "steps", "prefill_ms",
            "prefill_tokens_per_s", "branch_phase_ms", "end_to_end_ms", "peak_rss_kib"]
    report.write_csv(os.path.join(a.out, "trials.csv"), keys, [[r[k] for k in keys] for r in rows])
    return summary, point


def plot(a, rows, point):
    """OUT/plots/step-time.png: the step against the agents and against the document's length."""
    from swarmbench import style
    fig, axes = style.plt.subplots(1, 2, figsize=(11, 4))
    ns = [1, 4, 16, 50]
    ax = axes[0]
    for kernel in ("before", "after"):
        ys = [point[("shared", n, 3501)][kernel]["step_ms"] for n in ns]
        ax.plot(ns, ys, "o-", color=style.colour(kernel), label=kernel)
        for n in ns:
            ax.plot([n] * a.trials, [r["step_ms"] for r in pick(rows, kernel, "shared", n, 3501)], ".",
                    color=style.colour(kernel), alpha=0.4)
        for n, y in zip(ns, ys):
            ax.annotate(f"{y:.0f}", (n, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    one = point[("shared", 1, 3501)]["after"]["step_ms"]
    ax.plot([16, 50], [2 * one, 3 * one], "k_", markersize=18, label="goal (2× / 3× one agent's, after)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("agents decoding together")
    ax.set_ylabel("batched step (ms, median)")
    ax.set_title("one generation step, 3,501-token document")
    ax.legend(fontsize=8)
    ax = axes[1]
    ts = [1024, 3501, 7000]
    for kernel in ("before", "after"):
        ys = [point[("shared", 16, t)][kernel]["step_ms"] for t in ts]
        ax.plot(ts, ys, "o-", color=style.colour(kernel), label=kernel)
        for t, y in zip(ts, ys):
            ax.annotate(f"{y:.0f}", (t, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xlabel("document tokens")
    ax.set_ylabel("batched step (ms, median)")
    ax.set_title("16 agents: step against the document's length")
    ax.legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M F16, 2 threads, exact (q8_0 K/V): {a.trials} alternated trials, dots: trials")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "plots", "step-time.png"), dpi=110)


def write_report(a, summary):
    with open(os.path.join(a.out, "report.md"), "w") as out:
        out.write(f"""# Shared-prefix attention (issue 43)

One batched generation step of N agents over one shared document:
`swarmkv bench --arms shared --n-predict {N_PREDICT}` (default settings:
shared fork, exact, q8_0 K/V, synthetic document), {os.path.basename(MODEL)},
2 threads; {a.trials} alternated trials, medians. "before" and "after" are
two builds of the attention patch (`scripts/patches/ggml-fa-batch-invariant.patch`)
under one swarmkv binary. Command: `command.sh`.

| agents | document | before: step | after: step | after / before | before: prefill | after: prefill | before: end to end | after: end to end | peak RSS before / after | answers equal |
|---|---|---|---|---|---|---|---|---|---|---|
""")
        for p in summary["points"]:
            b, f_ = p["before"], p["after"]
            if p["arm"] == "shared":
                step = f"{b['step_ms']:.1f} ms | {f_['step_ms']:.1f} ms | {f_['step_ms'] / b['step_ms']:.2f}"
                who = str(p["agents"])
            else:
                step = "– | – | –"
                who = "re-prefill, 1"
            out.write(f"| {who} | {p['doc_tokens']:,} | {step} | {b['prefill_ms'] / 1000:.2f} s | "
                      f"{f_['prefill_ms'] / 1000:.2f} s | {b['end_to_end_ms'] / 1000:.2f} s | "
                      f"{f_['end_to_end_ms'] / 1000:.2f} s | {b['peak_rss_kib'] / 1024:.0f} / "
                      f"{f_['peak_rss_kib'] / 1024:.0f} MiB | {p['answers_equal']} |\n")
        b, f_ = summary["before"], summary["after"]
        out.write(f"""
16-agent step / 1-agent step: before {b['step_16_over_1']:.1f}×, after
{f_['step_16_over_1']:.1f}× (goal ≤ 2×); 50 / 1: before
{b['step_50_over_1']:.1f}×, after {f_['step_50_over_1']:.1f}× (goal ≤ 3×).
50 agents end to end against 50 re-prefills (50 × the measured one-agent
`none` run, same build and trials): before {b['speedup_50_vs_reprefill']:.1f}×,
after {f_['speedup_50_vs_reprefill']:.1f}× (goal ≥ 40×). Answers token for
token equal across builds and trials at every point:
{summary['answers_equal_across_builds_and_trials']}.

![step time](plots/step-time.png)
""")


def main():
    a = two_builds.arguments("prefix-attention").parse_args()
    two_builds.start(a)
    rows = measure(a)
    summary, point = summarise(a, rows)
    plot(a, rows, point)
    write_report(a, summary)
    print(json.dumps(summary, indent=1))

if __name__ == "__main__":
    main()
