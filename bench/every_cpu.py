"""Exact mode against llama.cpp's stock kernels (--no-exact) on the CPUs'
code paths this machine can run (issue 56): the native build (whatever this
machine has: AVX-512, or AVX2 on an AVX2-only CPU) and the portable one (SWARMKV_NATIVE=0: AVX2, FMA, F16C; the kernels' AVX2
paths), one swarmkv binary pointed at each build's lib/ folder with
LD_LIBRARY_PATH.

  prefill  the README pipeline's document (examples/pipelines/apache-license.yaml,
           2,239 tokens), one 1-token agent, store off: prefill tokens/s,
           exact vs --no-exact, per build, per weight file (--weights)
  steps    `swarmkv bench --arms shared` at 1 and 16 agents over 3,501 tokens,
           32 greedy tokens: the median step with every agent decoding, and
           whether each build's exact answers were the same in every trial
  answers  (--parts answers --answers-build BUILD, once): the README
           pipeline and the 16-agent pipeline
           (bench/results/prefill-default/sixteen-agents.yaml) under
           --fork shared, host and none, exact, for each --answers-weights
           file: are shared's and host's tokens none's, agent by agent?

Each trial runs every point on both builds (--builds: one of them alone on a
machine whose native build is the AVX2 code) in both modes, the order of the
builds and of the modes swapped every other trial; medians over --trials.
Writes OUT/results.json, OUT/trials.csv, OUT/report.md, OUT/plots/ and
OUT/answers-BUILD.{json,md}; OUT/command.sh holds the invocations.

usage: /usr/bin/python3 bench/every_cpu.py --bin build/release/swarmkv
           --native-lib DIR [--portable-lib DIR] [--builds native,portable]
           [--weights NAME=GGUF ...]
           [--out bench/results/every-cpu] [--trials 3]
           [--parts timing|answers|report] [--answers-build native|portable]
           [--answers-weights GGUF ...]
"""
import argparse
import csv
import json
import os
import statistics
import sys
import tempfile

import yaml

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import builds as two_builds  # noqa: E402
from swarmbench.trials import alternate  # noqa: E402

F16 = two_builds.MODEL
STEP_POINTS = [1, 16]
DOC_TOKENS = 3501
N_PREDICT = 32


def readme_one_agent(tmp):
    """The README pipeline with one 1-token agent: its run is the prefill."""
    src = os.path.join(two_builds.ROOT, "examples", "pipelines", "apache-license.yaml")
    with open(src) as f:
        d = yaml.safe_load(f)
    d["document"]["file"] = os.path.join(os.path.dirname(src), d["document"]["file"])
    d["agents"] = [{"name": "one", "prompt": "Hi", "max_tokens": 1}]
    d.pop("model", None)
    path = os.path.join(tmp, "readme-one-agent.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(d, f)
    return path


def run(cmd, lib):
    return two_builds.run(cmd, lib)


def prefill(binary, lib, exact, pipeline, model):
    cmd = [binary, "run", pipeline, "--model", model, "--snapshot-cache", "off", "-t", "2", "--json"]
    if not exact:
        cmd.append("--no-exact")
    r = json.loads(run(cmd, lib))
    if r.get("exact") != exact:
        sys.exit(f"{' '.join(cmd)}: exact is {r.get('exact')} ({r.get('exact_unavailable')})")
    return {"prefill_tok_s": r["prefix_tokens"] / r["prefill_ms"] * 1000, "prefill_ms": r["prefill_ms"]}


ANSWER_PIPELINES = [os.path.join("examples", "pipelines", "apache-license.yaml"),
                    os.path.join("bench", "results", "prefill-default", "sixteen-agents.yaml")]


def answers(binary, lib, model):
    """Each answer pipeline under each fork; the agents whose tokens differ from none's."""
    rows = []
    for pipe in ANSWER_PIPELINES:
        tokens = {}
        for fork in ("shared", "host", "none"):
            r = json.loads(run([binary, "run", os.path.join(two_builds.ROOT, pipe), "--model", model,
                                "--fork", fork, "--snapshot-cache", "off", "-t", "2", "--json"], lib))
            if not r["ok"] or not r["exact"]:
                sys.exit(f"{pipe} --fork {fork}: ok {r['ok']}, exact {r['exact']}")
            tokens[fork] = {a["name"]: a["tokens"] for a in r["agents"]}
        for fork in ("shared", "host"):
            differ = sorted(n for n in tokens["none"] if tokens[fork].get(n) != tokens["none"][n])
            rows.append({"pipeline": os.path.basename(pipe), "weights": os.path.basename(model), "fork": fork,
                         "agents": len(tokens["none"]), "equal": len(tokens["none"]) - len(differ),
                         "differ": differ})
            print(f"answers {rows[-1]['pipeline']} {rows[-1]['weights']} {fork}: "
                  f"{rows[-1]['equal']}/{rows[-1]['agents']} agents equal none's", flush=True)
    return rows


def plot(out, rows, builds, weights):
    """OUT/plots/exact-over-stock.png: exact's speed over --no-exact's per trial and median, the
    prefill per weight file and the step per agent count, one arm per build."""
    from swarmbench import style as ps
    fig, axes = ps.figure(1, 2, width=11.0)
    for ax, part, groups, labels, name in (
            (axes[0][0], "prefill", weights, [w.replace("-", "\n") for w in weights],
             "prefill, README document: exact tok/s / --no-exact tok/s"),
            (axes[0][1], "step", STEP_POINTS, [f"{n} agents" for n in STEP_POINTS],
             f"shared step over {DOC_TOKENS} tokens: --no-exact ms / exact ms")):
        drawn = ps.grouped_points(ax, groups, builds, lambda g, b: statistics.median(ratios(rows, part, b, g)),
                                  trials=lambda g, b: ratios(rows, part, b, g), labels=labels,
                                  value_fmt=lambda v: f"{v:.2f}×")
        ps.value_scale(ax, drawn + [1.0], bars=False)
        line = ps.reference_line(ax, label="1× = as fast as --no-exact", legend=False)
        ps.panel_title(ax, name)
    ps.arm_legend(axes[0][1], builds, dots="one trial", points=True, extra=[line])
    ps.title(fig, "Exact mode against --no-exact, " + " and ".join(builds) + " build" + ("s" if len(builds) > 1 else ""))
    ps.save(fig, os.path.join(out, "plots", "exact-over-stock.png"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--native-lib", required=True)
    ap.add_argument("--portable-lib")
    ap.add_argument("--builds", default="native,portable",
                    help="comma-separated: native, portable (default both; portable needs --portable-lib)")
    ap.add_argument("--weights", nargs="*", default=[f"F16={F16}"],
                    help="NAME=GGUF for the prefill part (default: SmolLM2 F16)")
    ap.add_argument("--out", default=os.path.join(two_builds.ROOT, "bench", "results", "every-cpu"))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--answers-build", choices=["native", "portable"])
    ap.add_argument("--answers-weights", nargs="*", default=[F16])
    ap.add_argument("--parts", default="timing",
                    help="comma-separated: timing (prefill and steps, then report), answers (needs "
                         "--answers-build), report (report.md, trials.csv and the plot again from results.json)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    a.builds = [b for b in a.builds.split(",") if b]
    if not a.builds or set(a.builds) - {"native", "portable"}:
        ap.error(f"--builds: native and/or portable (got {','.join(a.builds)!r})")
    if "portable" in a.builds and not a.portable_lib:
        ap.error("--builds portable needs --portable-lib")
    if parts - {"timing", "answers", "report"}:
        ap.error(f"unknown part(s): {', '.join(sorted(parts - {'timing', 'answers', 'report'}))}")
    if "answers" in parts and not a.answers_build:
        ap.error("--parts answers needs --answers-build native or portable")
    # OUT/command.sh is written by hand: the run takes two invocations (timing, answers)
    os.makedirs(os.path.join(a.out, "plots"), exist_ok=True)

    tmp = tempfile.mkdtemp(prefix="swarmkv-every-cpu-")
    if "answers" in parts:
        lib = a.native_lib if a.answers_build == "native" else a.portable_lib
        rows = []
        for model in a.answers_weights:
            rows += answers(a.bin, lib, model)
        with open(os.path.join(a.out, f"answers-{a.answers_build}.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(a.out, f"answers-{a.answers_build}.md"), "w") as f:
            f.write(f"# Exact answers on the {a.answers_build} build: shared and host against none\n\n"
                    "| pipeline | weights | fork | agents equal to none's |\n|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['pipeline']} | {r['weights']} | {r['fork']} | {r['equal']}/{r['agents']} |\n")
    if "timing" in parts:
        timing(a, tmp)
    if "report" in parts:
        report(a.out)


def timing(a, tmp):
    weights = [w.split("=", 1) for w in a.weights]
    pipeline = readme_one_agent(tmp)
    libs = {"native": a.native_lib, "portable": a.portable_lib}
    builds = [(b, libs[b]) for b in a.builds]
    modes = [True, False]
    rows = []
    for trial in range(a.trials):
        for build, lib in alternate(builds, trial):
            for exact in alternate(modes, trial):
                mode = "exact" if exact else "stock"
                for name, model in weights:
                    r = prefill(a.bin, lib, exact, pipeline, model)
                    r.update(trial=trial, build=build, mode=mode, part="prefill", weights=name, agents=None)
                    rows.append(r)
                    print(f"trial {trial} {build:8} {mode:5} prefill {name:7}: {r['prefill_tok_s']:6.1f} tok/s",
                          flush=True)
                for n in STEP_POINTS:
                    r = two_builds.bench_run(a.bin, lib, "shared", n, DOC_TOKENS, N_PREDICT, tmp,
                                             () if exact else ("--no-exact",))
                    r["prefill_tok_s"] = r.pop("prefill_tokens_per_s")
                    r.update(trial=trial, build=build, mode=mode, part="step", weights="F16", agents=n)
                    rows.append(r)
                    print(f"trial {trial} {build:8} {mode:5} {n:2} agents: step {r['step_ms']:6.1f} ms",
                          flush=True)

    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"cpu": two_builds.cpu(), "trials": rows}, f, indent=1)
    report(a.out)


def ratios(rows, part, build, group):
    """Per trial (paired: the same trial's two modes), exact's speed over --no-exact's."""
    got = []
    for t in sorted({r["trial"] for r in rows}):
        pick = {r["mode"]: r for r in rows if r["part"] == part and r["build"] == build and r["trial"] == t
                and (r["weights"] if part == "prefill" else r["agents"]) == group}
        if part == "prefill":
            got.append(pick["exact"]["prefill_tok_s"] / pick["stock"]["prefill_tok_s"])
        else:
            got.append(pick["stock"]["step_ms"] / pick["exact"]["step_ms"])
    return got


def report(out):
    """OUT/results.json's summary, OUT/report.md, OUT/trials.csv and the plot, from its trials."""
    path = os.path.join(out, "results.json")
    with open(path) as f:
        saved = json.load(f)
    rows = saved["trials"]
    machine = saved.get("cpu", "not recorded")
    builds = [b for b in ("native", "portable") if any(r["build"] == b for r in rows)]
    weights = list(dict.fromkeys(r["weights"] for r in rows if r["part"] == "prefill"))
    trials = len({r["trial"] for r in rows})

    def med(part, build, mode, key, group):
        return statistics.median(r[key] for r in rows if r["part"] == part and r["build"] == build
                                 and r["mode"] == mode and (r["weights"] if part == "prefill" else r["agents"]) == group)

    def answer_sets(build, mode, n):
        return {json.dumps(r["answers"]) for r in rows
                if r["part"] == "step" and r["build"] == build and r["mode"] == mode and r["agents"] == n}

    summary = {"trials": trials, "doc_tokens": DOC_TOKENS, "n_predict": N_PREDICT, "prefill": [], "steps": []}
    for build in builds:
        for name in weights:
            summary["prefill"].append({
                "build": build, "weights": name,
                "exact_tok_s": med("prefill", build, "exact", "prefill_tok_s", name),
                "stock_tok_s": med("prefill", build, "stock", "prefill_tok_s", name),
                "exact_over_stock": statistics.median(ratios(rows, "prefill", build, name))})
        for n in STEP_POINTS:
            summary["steps"].append({
                "build": build, "agents": n, "exact_step_ms": med("step", build, "exact", "step_ms", n),
                "stock_step_ms": med("step", build, "stock", "step_ms", n),
                "stock_over_exact": statistics.median(ratios(rows, "step", build, n)),
                # one set of answers over every trial of the mode on this build
                "exact_answers_stable": len(answer_sets(build, "exact", n)) == 1})
    if len(builds) == 2:
        summary["exact_answers_equal_across_builds"] = {
            str(n): answer_sets("native", "exact", n) == answer_sets("portable", "exact", n) for n in STEP_POINTS}

    with open(path, "w") as f:
        json.dump({"cpu": machine, "summary": summary, "trials": rows}, f, indent=1)
    with open(os.path.join(out, "trials.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "build", "mode", "part", "weights", "agents", "prefill_tok_s", "step_ms"])
        for r in rows:
            w.writerow([r["trial"], r["build"], r["mode"], r["part"], r["weights"], r["agents"],
                        round(r["prefill_tok_s"], 1), round(r["step_ms"], 2) if "step_ms" in r else ""])
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(f"# Exact mode vs --no-exact on the {' and the '.join(builds)} build\n\n"
                f"CPU: {machine}.\n\n"
                f"One swarmkv binary on {len(builds)} build(s) of the pinned llama.cpp, {trials} alternated trials, "
                "2 threads (command.sh). Speeds are medians; ratios the median of the trials' own "
                "ratios (each trial ran both modes back to back). Plot: plots/exact-over-stock.png.\n\n"
                "## Prefill, README pipeline document (2,239 tokens)\n\n"
                "| build | weights | exact tok/s | --no-exact tok/s | exact / --no-exact |\n|---|---|---|---|---|\n")
        for p in summary["prefill"]:
            f.write(f"| {p['build']} | {p['weights']} | {p['exact_tok_s']:.0f} | {p['stock_tok_s']:.0f} | "
                    f"{p['exact_over_stock']:.2f}x |\n")
        f.write(f"\n## Shared fork, one generation step over {DOC_TOKENS} tokens (SmolLM2 F16)\n\n"
                "| build | agents | exact ms | --no-exact ms | --no-exact / exact | exact answers the same every trial |\n"
                "|---|---|---|---|---|---|\n")
        for s in summary["steps"]:
            f.write(f"| {s['build']} | {s['agents']} | {s['exact_step_ms']:.1f} | {s['stock_step_ms']:.1f} | "
                    f"{s['stock_over_exact']:.2f}x | {'yes' if s['exact_answers_stable'] else 'NO'} |\n")
        if "exact_answers_equal_across_builds" in summary:
            f.write("\nExact answers equal across the two builds: "
                    + ", ".join(f"{n} agents: {'yes' if v else 'no'}"
                                for n, v in summary["exact_answers_equal_across_builds"].items())
                    + " (not promised: exact mode's answers are those of the same build's re-prefill).\n")
    plot(out, rows, builds, weights)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
