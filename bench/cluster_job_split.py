#!/usr/bin/env python3
"""Jobs cut by count against jobs cut by cost, on two workers (issue 41, item 3).

    cluster_job_split.py SWARMKV MODEL REDIS_SERVER OUT [--trials N]

A skewed pipeline: 8 agents over the Apache License's first 3,000
characters, the first two asked for long answers (max_tokens 160), the other
six for short ones (max_tokens 8). Two workers with one thread each (`-t 1`,
2 cores), one Redis on loopback. Arms, alternated per trial:
`count` = `--agents-per-job 4` (the old split: in pipeline order, so the
first job holds both long answers) and `cost` = the default (one job per
worker of about equal prompt + max_tokens). Per run: each worker's busy time
(the sum of its jobs' times, from its log), their difference, the longest
agent's own decode time, and the run's end to end. Writes OUT/results.json,
OUT/trials.csv and OUT/report.md.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import ROOT as source, report, servers  # noqa: E402
from swarmbench.trials import alternate  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("swarmkv")
ap.add_argument("model")
ap.add_argument("redis_server")
ap.add_argument("out")
ap.add_argument("--trials", type=int, default=3)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
tmp = tempfile.mkdtemp(prefix="swarmkv-job-split-")

with open(os.path.join(source, "examples", "documents", "apache-2.0.txt")) as f:
    document = f.read()[:3000]
with open(os.path.join(tmp, "doc.txt"), "w") as f:
    f.write(document)
LONG = ["Retell, clause by clause and at length, everything this licence text says.",
        "Explain in full detail every definition in the text, one paragraph per term."]
SHORT = ["Name the licence.", "Who is the Licensor?", "What is a Contribution?", "Is it free?",
         "Who may grant patents?", "What is the Work?"]
lines = ["name: skewed", f"document: {{file: {os.path.join(tmp, 'doc.txt')}}}",
         "defaults: {temperature: 0}", "agents:"]
for i, p in enumerate(LONG):
    lines.append(f"  - {{name: long{i + 1}, prompt: {json.dumps(p)}, max_tokens: 160}}")
for i, p in enumerate(SHORT):
    lines.append(f"  - {{name: short{i + 1}, prompt: {json.dumps(p)}, max_tokens: 8}}")
pipeline = os.path.join(tmp, "skewed.yaml")
with open(pipeline, "w") as f:
    f.write("\n".join(lines) + "\n")

env = dict(os.environ, SWARMKV_CACHE=os.path.join(tmp, "cache"), SWARMKV_MODEL=args.model)
env.pop("SWARMKV_LOG_LEVEL", None)
children = [servers.redis(binary=args.redis_server)]
url = f"redis://127.0.0.1:{children[0].port}"
logs = {}
for w in ("w1", "w2"):
    logs[w] = os.path.join(tmp, f"{w}.log")
    children.append(servers.Process([args.swarmkv, "worker", "--redis", url, "--name", w, "-t", "1",
                                     "--cache-dir", os.path.join(tmp, f"store-{w}")], logs[w], env=env))
for c in children[1:]:
    c.wait_ready(servers.log_says(c, "serving model"), 60)

DONE = re.compile(r"job (\S+) done: (\d+) result\(s\) in (\d+) ms")


def one_run(arm):
    sizes = {w: os.path.getsize(logs[w]) for w in logs}
    extra = ["--agents-per-job", "4"] if arm == "count" else []
    t0 = time.monotonic()
    p = subprocess.run([args.swarmkv, "run", pipeline, "--redis", url, "--json", "--threads", "1", *extra],
                       env=env, capture_output=True, text=True, timeout=900)
    wall = (time.monotonic() - t0) * 1000
    if p.returncode != 0:
        sys.exit(f"run ({arm}) failed: {p.stderr}")
    r = json.loads(p.stdout)
    busy = {}
    for w in logs:
        with open(logs[w]) as f:
            f.seek(sizes[w])
            busy[w] = sum(int(m.group(3)) for m in DONE.finditer(f.read()))
    longest = max(a["timings_ms"]["total"] for a in r["agents"])
    by_worker = {}
    for a in r["agents"]:
        by_worker.setdefault(a["worker"], []).append(a["name"])
    return {"arm": arm, "busy_w1_ms": busy["w1"], "busy_w2_ms": busy["w2"],
            "busy_difference_ms": abs(busy["w1"] - busy["w2"]), "longest_agent_ms": longest,
            "end_to_end_ms": wall, "tokens": {a["name"]: len(a["tokens"]) for a in r["agents"]},
            "agents_by_worker": by_worker, "answers": {a["name"]: a["tokens"] for a in r["agents"]}}


trials = []
try:
    one_run("cost")  # warm-up: both workers fetch the snapshot once
    for t in range(args.trials):
        for arm in alternate(["count", "cost"], t):
            row = one_run(arm)
            row["trial"] = t + 1
            trials.append(row)
            print(f"trial {t + 1} {arm:5}: busy {row['busy_w1_ms']} / {row['busy_w2_ms']} ms, "
                  f"difference {row['busy_difference_ms']} ms, longest agent "
                  f"{row['longest_agent_ms']:.0f} ms, end to end {row['end_to_end_ms']:.0f} ms", flush=True)
finally:
    for c in children:
        c.stop(30)

summary = {}
for arm in ("count", "cost"):
    rows = [r for r in trials if r["arm"] == arm]
    summary[arm] = {k: statistics.median(r[k] for r in rows)
                    for k in ("busy_difference_ms", "longest_agent_ms", "end_to_end_ms")}
answers_equal = all(r["answers"] == trials[0]["answers"] for r in trials)
with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"pipeline": open(pipeline).read(), "trials": trials, "median": summary,
               "answers_equal_across_arms": answers_equal}, f, indent=1)
report.write_csv(os.path.join(args.out, "trials.csv"),
                 ["trial", "arm", "busy_w1_ms", "busy_w2_ms", "busy_difference_ms", "longest_agent_ms",
                  "end_to_end_ms"],
                 [[r["trial"], r["arm"], r["busy_w1_ms"], r["busy_w2_ms"], r["busy_difference_ms"],
                   f"{r['longest_agent_ms']:.0f}", f"{r['end_to_end_ms']:.0f}"] for r in trials])
print(json.dumps(summary), "answers equal across arms:", answers_equal)
