"""`swarmkv run` on a pipeline: every agent ok with a non-empty answer, and
`--fork host` answers identical to `--fork none` (the full re-prefill).

usage: run_host_vs_none.py SWARMKV_BINARY PIPELINE MODEL
"""
import json
import subprocess
import sys

binary, pipeline, model = sys.argv[1:4]


def run(fork):
    proc = subprocess.run([binary, "run", pipeline, "--model", model, "--fork", fork, "--json"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"--fork {fork} exited {proc.returncode}: {proc.stderr}")
    return json.loads(proc.stdout)


host = run("host")
none = run("none")
errors = []
for h, n in zip(host["agents"], none["agents"]):
    if h["status"] != "ok" or n["status"] != "ok":
        errors.append(f"{h['name']}: status host={h['status']} none={n['status']}")
    if not h["answer"].strip():
        errors.append(f"{h['name']}: empty answer")
    if h["answer"] != n["answer"]:
        errors.append(f"{h['name']}: host and none differ:\n  host: {h['answer']!r}\n  none: {n['answer']!r}")
    for key in ("fork", "restore", "prompt", "generate", "total"):
        if not h["timings_ms"][key] > 0:
            errors.append(f"{h['name']}: timings_ms.{key} = {h['timings_ms'][key]} (must be > 0 with --fork host)")
if not host["prefill_ms"] > 0:
    errors.append(f"prefill_ms = {host['prefill_ms']} (the seed's bug: it is never 0)")
if len(host["agents"]) < 4:
    errors.append(f"only {len(host['agents'])} agents")
if errors:
    sys.exit("\n".join(errors))
print(f"ok: {len(host['agents'])} agents identical; end-to-end host {host['total_ms']:.0f} ms vs none "
      f"{none['total_ms']:.0f} ms ({none['total_ms'] / host['total_ms']:.2f}x)")
