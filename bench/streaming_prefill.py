"""The streaming prefill's cost (issue 38, item 4): contract-review with and
without `needs`, on two builds of the attention kernel (--change says what
they differ in; by default the change that let a group of query rows keep
sharing K/V blocks past cells none of them sees).

`swarmkv run examples/pipelines/contract-review.yaml --json` (default
settings: shared fork, exact; snapshot store off), and the same pipeline
with its `needs` lines removed. "before" and "after" are two builds of the
pinned llama.cpp, the same swarmkv binary (its RUNPATH overridden with
LD_LIBRARY_PATH): --before-lib and --after-lib name their lib/ folders.
Arms alternate, --trials rounds; medians.

Writes OUT/results.json, OUT/trials.csv, OUT/report.md, OUT/plots/ and
OUT/command.sh.

usage: /usr/bin/python3 bench/streaming_prefill.py --bin build/release/swarmkv
           --before-lib DIR --after-lib DIR [--out bench/results/streaming-prefill]
           [--trials 3] [--change TEXT]
"""
import csv
import json
import os
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import builds as two_builds  # noqa: E402

ROOT = two_builds.ROOT
MODEL = two_builds.MODEL
WHOLE = ("obligations", "critique", "gaps", "verdict")  # the agents that read it all


def run(binary, pipeline, lib, env_base):
    out = two_builds.run([binary, "run", pipeline, "--model", MODEL, "--snapshot-cache", "off", "--json"],
                         lib, env_base, timeout=900)
    r = json.loads(out)
    if not r["ok"]:
        sys.exit("the run failed: " + out[-2000:])
    done = {a["name"]: a["done_at_ms"] for a in r["agents"]}
    return {"prefill_done_ms": r["prefill_done_at_ms"], "total_ms": r["total_ms"],
            "whole_done_ms": max(done[n] for n in WHOLE),
            "definitions_first_token_ms": next(a["first_token_at_ms"] for a in r["agents"]
                                               if a["name"] == "definitions"),
            "answers": {a["name"]: a["tokens"] for a in r["agents"]}}


def main():
    ap = two_builds.arguments("streaming-prefill")
    ap.add_argument("--change", default=(
        '"before": the attention patch whose row groups stopped sharing K/V blocks at the first '
        'cell some of their rows did not see; "after": they pass over cells none of them sees '
        "(a branch's own cells among the document's)."),
                    help="what the two builds differ in, for the report")
    a = ap.parse_args()
    two_builds.start(a)

    src = os.path.join(ROOT, "examples", "pipelines", "contract-review.yaml")
    with open(src) as f:
        text = f.read()
    tmp = tempfile.mkdtemp(prefix="swarmkv-streaming-")
    no_needs = os.path.join(os.path.dirname(src), ".contract-review-no-needs.yaml")
    lines = [l for l in text.splitlines(keepends=True) if not l.strip().startswith("needs:")]
    if len(lines) == len(text.splitlines()):
        sys.exit("contract-review.yaml has no needs: line to remove")
    with open(no_needs, "w") as f:
        f.write("".join(lines))
    env = dict(os.environ, SWARMKV_CACHE=os.path.join(tmp, "cache"))
    arms = [(k, lib, needs) for k, lib in (("before", a.before_lib), ("after", a.after_lib))
            for needs in (True, False)]
    rows = []
    try:
        for t in range(a.trials):
            for kernel, lib, needs in arms:
                r = run(a.bin, src if needs else no_needs, lib, env)
                r.update(trial=t, kernel=kernel, needs=needs)
                rows.append(r)
                print(f"trial {t} {kernel:6} needs={needs!s:5} prefill {r['prefill_done_ms']:7.0f} "
                      f"whole-document agents done {r['whole_done_ms']:7.0f} total "
                      f"{r['total_ms']:7.0f} ms", flush=True)
    finally:
        os.remove(no_needs)

    def med(kernel, needs, key):
        return statistics.median(r[key] for r in rows if r["kernel"] == kernel and r["needs"] == needs)

    summary = {}
    for kernel in ("before", "after"):
        s = {}
        for needs in (True, False):
            s["needs" if needs else "no_needs"] = {
                k: med(kernel, needs, k) for k in ("prefill_done_ms", "whole_done_ms", "total_ms",
                                                   "definitions_first_token_ms")}
        s["whole_done_ratio"] = s["needs"]["whole_done_ms"] / s["no_needs"]["whole_done_ms"]
        s["prefill_ratio"] = s["needs"]["prefill_done_ms"] / s["no_needs"]["prefill_done_ms"]
        summary[kernel] = s
    same = all(r["answers"] == next(x for x in rows if x["needs"] == r["needs"])["answers"]
               for r in rows)
    summary["answers_equal_across_kernels_and_trials"] = same
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"trials": a.trials, "model": os.path.basename(MODEL), "summary": summary,
                   "runs": [{k: v for k, v in r.items() if k != "answers"} for r in rows]},
                  f, indent=1)
    with open(os.path.join(a.out, "trials.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "kernel", "needs", "prefill_done_ms", "whole_done_ms", "total_ms",
                    "definitions_first_token_ms"])
        for r in rows:
            w.writerow([r["trial"], r["kernel"], r["needs"], f"{r['prefill_done_ms']:.0f}",
                        f"{r['whole_done_ms']:.0f}", f"{r['total_ms']:.0f}",
                        f"{r['definitions_first_token_ms']:.0f}"])

    from swarmbench import style
    fig, ax = style.plt.subplots(figsize=(7, 4))
    labels, values = [], []
    for kernel in ("before", "after"):
        for needs in ("needs", "no_needs"):
            labels.append(f"{kernel}\n{needs.replace('_', ' ')}")
            values.append(summary[kernel][needs]["whole_done_ms"] / 1000)
    bars = ax.bar(labels, values, color=[style.colour(k if n == "needs" else "no needs") for k in ("before", "after")
                                          for n in ("needs", "no_needs")], edgecolor="#222",
                  hatch=["//", "", "//", ""])
    ax.bar_label(bars, fmt="%.1f s")
    ax.set_ylabel("whole-document agents done (s, median)")
    ax.set_title(f"contract-review, shared fork, exact: with and without needs ({a.trials} trials)")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "plots", "whole-document-agents-done.png"), dpi=110)

    b, f_ = summary["before"], summary["after"]
    with open(os.path.join(a.out, "report.md"), "w") as out:
        out.write(f"""# The streaming prefill's cost (issue 38, item 4)

contract-review (3,693-token MPL 2.0, five agents, `definitions` needs
section 1), `swarmkv run --json`, default settings (shared fork, exact),
snapshot store off, {os.path.basename(MODEL)}, 2 threads; {a.trials}
alternated trials of four arms, medians. {a.change} Command: `command.sh`.

| kernel | needs | prefill done | whole-document agents done | total | `definitions` first token |
|---|---|---|---|---|---|
| before | yes | {b['needs']['prefill_done_ms']/1000:.1f} s | {b['needs']['whole_done_ms']/1000:.1f} s | {b['needs']['total_ms']/1000:.1f} s | {b['needs']['definitions_first_token_ms']/1000:.1f} s |
| before | no | {b['no_needs']['prefill_done_ms']/1000:.1f} s | {b['no_needs']['whole_done_ms']/1000:.1f} s | {b['no_needs']['total_ms']/1000:.1f} s | {b['no_needs']['definitions_first_token_ms']/1000:.1f} s |
| after | yes | {f_['needs']['prefill_done_ms']/1000:.1f} s | {f_['needs']['whole_done_ms']/1000:.1f} s | {f_['needs']['total_ms']/1000:.1f} s | {f_['needs']['definitions_first_token_ms']/1000:.1f} s |
| after | no | {f_['no_needs']['prefill_done_ms']/1000:.1f} s | {f_['no_needs']['whole_done_ms']/1000:.1f} s | {f_['no_needs']['total_ms']/1000:.1f} s | {f_['no_needs']['definitions_first_token_ms']/1000:.1f} s |

With `needs` / without, whole-document agents done: before
{b['whole_done_ratio']:.2f}×, after {f_['whole_done_ratio']:.2f}× (goal ≤ 1.05×);
prefill: before {b['prefill_ratio']:.2f}×, after {f_['prefill_ratio']:.2f}×.
Answers token for token equal across kernels and trials (per arm with or
without needs): {same}.

![whole-document agents done](plots/whole-document-agents-done.png)
""")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
