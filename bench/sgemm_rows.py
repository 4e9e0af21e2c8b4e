"""Exact mode's matmuls of up to six rows (issue 38: exact by default, no
slower than llama.cpp's stock kernels): llamafile's sgemm with
GGML_CPU_SGEMM_SINGLE_ROW=1 (which exact mode sets), on two builds of the
pinned llama.cpp, "before" (one-row and few-row products in sgemm's 4-row
tiles) and "after" (one weight row at a time against the up to six rows,
each thread a contiguous range: scripts/patches/ggml-sgemm-single-row.patch).

Two parts, each trial alternating the builds' order:
  - llama-bench tg128, flash attention off (so the step is the matmuls),
    2 threads: both builds with the switch on, and the after build with it
    off (ggml's own vec_dot: what --no-exact runs for a one-row step);
  - `swarmkv bench --arms host,shared --n-predict 32` (default settings:
    exact) at 1, 2, 4 and 8 agents over 3,501 tokens: the host fork's
    branch phase (each agent decodes alone: one-row steps) and the shared
    fork's batched step (N rows).
Answers must be equal token for token across builds: each element's
arithmetic is the same in both.

Writes OUT/results.json, OUT/trials.csv, OUT/report.md, OUT/plots/agents.png
and OUT/command.sh.

usage: /usr/bin/python3 bench/sgemm_rows.py --bin build/release/swarmkv
           --before-lib DIR --after-lib DIR --llama-bench PATH
           [--out bench/results/sgemm-rows] [--trials 3]
"""
import csv
import json
import os
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import builds as two_builds  # noqa: E402
from swarmbench.trials import alternate  # noqa: E402

MODEL = two_builds.MODEL
AGENTS = [1, 2, 4, 8]
DOC_TOKENS = 3501
N_PREDICT = 32


def llama_bench(path, lib, single_row):
    cmd = [path, "-m", MODEL, "-t", "2", "-p", "0", "-n", "128", "-fa", "0", "-r", "3", "-o", "json"]
    out = two_builds.run(cmd, lib, dict(os.environ, GGML_CPU_SGEMM_SINGLE_ROW=str(single_row)), timeout=600)
    return json.loads(out)[0]["avg_ts"]


def swarmkv_bench(binary, lib, agents, tmp):
    out = os.path.join(tmp, f"{agents}")
    cmd = [binary, "bench", "--model", MODEL, "--arms", "host,shared", "--branches", str(agents),
           "--doc-tokens", str(DOC_TOKENS), "--n-predict", str(N_PREDICT), "--trials", "1",
           "--pause-ms", "0", "--out", out]
    two_builds.run(cmd, lib)
    with open(os.path.join(out, "best_run.json")) as f:
        arms = json.load(f)["arms"]
    r = {}
    for arm in ("host", "shared"):
        t = arms[arm]["best_trial"]
        if not t["ok"]:
            sys.exit(f"{' '.join(cmd)}: the {arm} run failed")
        r[arm] = {"branch_phase_ms": t["branch_phase_ms"], "end_to_end_ms": t["end_to_end_ms"],
                  "answers": [b["tokens"] for b in t["branches"]]}
    steps = [s for s in arms["shared"]["best_trial"]["generation_step_ms_by_branches"]
             if s["branches"] == agents]
    r["shared"]["step_ms"] = steps[0]["median_ms"]
    return r


def plot(out):
    """OUT/plots/agents.png from OUT/results.json: host branch phase and shared step against agents."""
    from swarmbench import style
    with open(os.path.join(out, "results.json")) as f:
        r = json.load(f)
    points = r["summary"]["points"]
    ns = [p["agents"] for p in points]
    fig, axes = style.plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, scale, label in ((axes[0], "host_branch_phase_ms", 1000, "host branch phase (s)"),
                                  (axes[1], "shared_step_ms", 1, "shared batched step (ms)")):
        for build in ("before", "after"):
            ys = [p[build][key] / scale for p in points]
            ax.plot(ns, ys, "o-", color=style.colour(build), label=build)
            for run in r["runs"]:
                if run["build"] == build:
                    ax.plot(run["agents"], run[key] / scale, ".", color=style.colour(build), alpha=0.4)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("agents")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"{r['model']}, 2 threads, exact, {r['doc_tokens']:,}-token document: "
                 f"{r['trials']} alternated trials (dots), medians (lines)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plots", "agents.png"), dpi=110)


def main():
    ap = two_builds.arguments("sgemm-rows")
    ap.add_argument("--llama-bench", required=True, help="llama-bench of either build")
    a = ap.parse_args()
    two_builds.start(a)

    tmp = tempfile.mkdtemp(prefix="swarmkv-sgemm-rows-")
    builds = [("before", a.before_lib), ("after", a.after_lib)]
    tg = []    # (trial, arm, tokens/s)
    runs = []  # (trial, build, agents, result)
    for trial in range(a.trials):
        order = alternate(builds, trial)
        arms = [(k, lib, 1) for k, lib in order] + [("stock vec_dot", a.after_lib, 0)]
        for name, lib, single_row in alternate(arms, trial):
            ts = llama_bench(a.llama_bench, lib, single_row)
            tg.append((trial, name, ts))
            print(f"trial {trial} tg128 {name:13} {ts:6.1f} tokens/s", flush=True)
        for build, lib in order:
            for n in AGENTS:
                r = swarmkv_bench(a.bin, lib, n, tmp)
                runs.append((trial, build, n, r))
                print(f"trial {trial} {build:6} {n} agents: host branch phase "
                      f"{r['host']['branch_phase_ms']:7.0f} ms, shared step "
                      f"{r['shared']['step_ms']:6.1f} ms", flush=True)

    def tg_median(name):
        return statistics.median(ts for _, k, ts in tg if k == name)

    def med(build, n, arm, key):
        return statistics.median(r[arm][key] for _, b, m, r in runs if b == build and m == n)

    summary = {"tg128_tokens_per_s": {k: tg_median(k) for k in ("before", "after", "stock vec_dot")},
               "points": [], "answers_equal_across_builds_and_trials": True}
    for n in AGENTS:
        p = {"agents": n}
        for arm in ("host", "shared"):
            same = len({json.dumps(r[arm]["answers"]) for _, _, m, r in runs if m == n}) == 1
            p[f"{arm}_answers_equal"] = same
            summary["answers_equal_across_builds_and_trials"] &= same
        for build in ("before", "after"):
            p[build] = {"host_branch_phase_ms": med(build, n, "host", "branch_phase_ms"),
                        "shared_step_ms": med(build, n, "shared", "step_ms"),
                        "shared_branch_phase_ms": med(build, n, "shared", "branch_phase_ms")}
        summary["points"].append(p)

    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"trials": a.trials, "model": os.path.basename(MODEL), "doc_tokens": DOC_TOKENS,
                   "n_predict": N_PREDICT, "summary": summary,
                   "tg128": [{"trial": t, "arm": k, "tokens_per_s": ts} for t, k, ts in tg],
                   "runs": [{"trial": t, "build": b, "agents": n,
                             **{f"{arm}_{key}": r[arm][key] for arm in ("host", "shared")
                                for key in ("branch_phase_ms", "end_to_end_ms")},
                             "shared_step_ms": r["shared"]["step_ms"]} for t, b, n, r in runs]},
                  f, indent=1)
    with open(os.path.join(a.out, "trials.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "build", "agents", "host_branch_phase_ms", "shared_step_ms",
                    "shared_branch_phase_ms"])
        for t, b, n, r in runs:
            w.writerow([t, b, n, r["host"]["branch_phase_ms"], r["shared"]["step_ms"],
                        r["shared"]["branch_phase_ms"]])

    plot(a.out)
    t = summary["tg128_tokens_per_s"]
    with open(os.path.join(a.out, "report.md"), "w") as out:
        out.write(f"""# Exact mode's few-row matmuls (issue 38)

{os.path.basename(MODEL)}, 2 threads, {a.trials} alternated trials, medians. "before" and
"after": two builds of `scripts/patches/ggml-sgemm-single-row.patch` under one swarmkv
binary. Command: `command.sh`.

**One-token steps, `llama-bench` tg128, flash attention off** (the step is the matmuls):
`GGML_CPU_SGEMM_SINGLE_ROW=1` (exact mode's switch) before {t['before']:.1f} tokens/s
({1000 / t['before']:.1f} ms a token), after **{t['after']:.1f}** ({1000 / t['after']:.1f} ms);
ggml's own `vec_dot` (the switch off, what `--no-exact` runs) {t['stock vec_dot']:.1f}
({1000 / t['stock vec_dot']:.1f} ms).

**Agents over {DOC_TOKENS:,} tokens, {N_PREDICT} tokens each, default settings (exact):**

| agents | host branch phase, before | after | after / before | shared step, before | after | after / before | answers equal (host, shared) |
|---|---|---|---|---|---|---|---|
""")
        for p in summary["points"]:
            b, f_ = p["before"], p["after"]
            out.write(f"| {p['agents']} | {b['host_branch_phase_ms'] / 1000:.2f} s | "
                      f"{f_['host_branch_phase_ms'] / 1000:.2f} s | "
                      f"{f_['host_branch_phase_ms'] / b['host_branch_phase_ms']:.2f} | "
                      f"{b['shared_step_ms']:.1f} ms | {f_['shared_step_ms']:.1f} ms | "
                      f"{f_['shared_step_ms'] / b['shared_step_ms']:.2f} | "
                      f"{p['host_answers_equal']}, {p['shared_answers_equal']} |\n")
        out.write(f"""
The host fork decodes each agent alone (one-row steps at every agent count);
the shared fork's step has one row per agent. Answers token for token equal
across builds and trials at every point:
{summary['answers_equal_across_builds_and_trials']}.

![agents](plots/agents.png)
""")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
