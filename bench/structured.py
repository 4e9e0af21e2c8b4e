#!/usr/bin/env python3
"""The cost of constraining answers (issue 57): 16 agents over the ~3,500-token bench document, shared
fork, greedy, once with free-text answers and once with a JSON schema per agent (the answer sampled
under the grammar made from it), alternated for TRIALS trials. Compares the agents' phase (after the
prefill): ms per decode step and end to end (total_ms), by medians.

  /usr/bin/python3 bench/structured.py SWARMKV_BIN MODEL OUT_DIR [--trials 3] [--max-tokens 48]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from swarmbench import ROOT, report, trials  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("binary")
ap.add_argument("model")
ap.add_argument("out")
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--branches", type=int, default=16)
ap.add_argument("--max-tokens", type=int, default=48)
ap.add_argument("--replot", action="store_true", help="redraw the report from OUT_DIR/results.json")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
if not args.replot:
    report.write_command(args.out)

docs = os.path.join(ROOT, "examples", "documents")
doc = (open(os.path.join(docs, "apache-2.0.txt")).read() + "\n\n" +
       open(os.path.join(docs, "mpl-2.0.txt")).read())[:17080]  # bench/old_vs_new.py's document
schema = {"type": "object", "properties": {"clause": {"type": "integer"},
                                           "summary": {"type": "string", "maxLength": 100}},
          "required": ["clause", "summary"]}
for arm in ("free", "schema"):
    agents = [{"name": f"branch{i}", "prompt": f"Question {i + 1}: summarise clause {i + 1} of the licence "
               "as JSON with its number and a summary.", "max_tokens": args.max_tokens}
              for i in range(args.branches)]
    if arm == "schema":
        for a in agents:
            a["json_schema"] = schema
    with open(os.path.join(args.out, f"pipeline-{arm}.json"), "w") as f:
        json.dump({"name": f"structured-{arm}", "document": {"text": doc}, "agents": agents, "threads": 2},
                  f, indent=1)

rows = json.load(open(os.path.join(args.out, "results.json"))) if args.replot else []
for trial in range(0 if args.replot else args.trials):
    for arm in trials.alternate(["free", "schema"], trial):
        cmd = [args.binary, "run", os.path.join(args.out, f"pipeline-{arm}.json"), "--model", args.model,
               "--snapshot-cache", "off", "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if p.returncode not in (0, 1):  # 1: some agent failed (an incomplete answer); the result says which
            sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
        d = json.loads(p.stdout)
        phase = d["total_ms"] - d["prefill_ms"]
        tokens = sum(len(a["tokens"]) for a in d["agents"])
        row = {"trial": trial + 1, "arm": arm, "prefix_tokens": d["prefix_tokens"], "total_ms": d["total_ms"],
               "prefill_ms": d["prefill_ms"], "agents_phase_ms": phase, "decode_steps": d["decode_steps"],
               "ms_per_step": phase / max(d["decode_steps"], 1), "generated_tokens": tokens,
               "ms_per_token": phase / max(tokens, 1),
               "complete_json": sum(1 for a in d["agents"] if a.get("answer_json") is not None),
               "failed": sum(1 for a in d["agents"] if a["status"] != "ok")}
        rows.append(row)
        trials.log(json.dumps(row))
report.write_json(os.path.join(args.out, "results.json"), rows)
report.write_csv(os.path.join(args.out, "results.csv"), list(rows[0]), rows)

med = {arm: {k: trials.median([r[k] for r in rows if r["arm"] == arm])
             for k in ("total_ms", "agents_phase_ms", "ms_per_step", "ms_per_token", "decode_steps",
                       "generated_tokens", "complete_json", "failed")} for arm in ("free", "schema")}
lines = [f"# The cost of a JSON schema per agent ({args.branches} agents, shared fork, greedy)", "",
         f"Document of {rows[0]['prefix_tokens']} tokens, max_tokens {args.max_tokens}, {args.trials} alternated "
         "trials, snapshot store off (every run prefills); medians.", ""]
head = ["", "end to end (ms)", "agents' phase (ms)", "ms / step", "ms / generated token", "steps",
        "generated tokens", "complete JSON answers", "failed agents"]
lines += report.md_table(head, [[arm] + [f"{med[arm][k]:.1f}" if isinstance(med[arm][k], float) else med[arm][k]
                                         for k in ("total_ms", "agents_phase_ms", "ms_per_step", "ms_per_token",
                                                   "decode_steps", "generated_tokens", "complete_json", "failed")]
                                 for arm in ("free", "schema")])
lines += ["", "schema / free: end to end {:.2f}x, ms per step {:.2f}x, ms per generated token {:.2f}x".format(
    med["schema"]["total_ms"] / med["free"]["total_ms"], med["schema"]["ms_per_step"] / med["free"]["ms_per_step"],
    med["schema"]["ms_per_token"] / med["free"]["ms_per_token"]), ""]
from swarmbench import style  # noqa: E402  (matplotlib: only once the runs are done)

fig, axes = style.figure(1, 2, width=9.0)
for ax, key, name in ((axes[0][0], "ms_per_step", "ms per decode step (16 agents)"),
                      (axes[0][1], "total_ms", "end to end, ms (prefill included)")):
    style.grouped(ax, ["16 agents"], ["free", "schema"], lambda g, arm: med[arm][key],
                  lambda g, arm: [r[key] for r in rows if r["arm"] == arm], value_fmt=lambda v: f"{v:.0f}")
    style.panel_title(ax, name)
style.arm_legend(axes[0][1], ["free", "schema"], dots="a trial",
                 names={"free": "free text", "schema": "JSON schema"})
style.title(fig, f"A JSON schema per agent: {args.trials} alternated trials (dots), medians (bars)")
style.save(fig, os.path.join(args.out, "structured.png"))
lines += ["![ms per step and end to end, free vs schema](structured.png)", ""]
lines += report.reproduce(args.out, "command.sh")
with open(os.path.join(args.out, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
