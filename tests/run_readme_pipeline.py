"""`swarmkv run` on the README pipeline with the default fork (shared), twice,
and with --fork host: every agent ok with a non-empty answer and real
timings, the shared answers identical run to run (batch composition is
deterministic), and the count of shared answers equal to host's (host is
bit-exact against a full re-prefill: PipelineModelTest covers that).

usage: run_readme_pipeline.py SWARMKV_BINARY PIPELINE MODEL
"""
import json
import subprocess
import sys

binary, pipeline, model = sys.argv[1:4]


def run(*extra):
    cmd = [binary, "run", pipeline, "--model", model, "--json", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr}")
    return json.loads(proc.stdout)


shared = run()
again = run()
host = run("--fork", "host")
errors = []
if shared["fork"] != "shared":
    errors.append(f"the default fork is {shared['fork']!r}, not 'shared'")
if len(shared["agents"]) < 4:
    errors.append(f"only {len(shared['agents'])} agents")
for name, r in (("shared", shared), ("host", host)):
    if not r["prefill_ms"] > 0:
        errors.append(f"{name}: prefill_ms = {r['prefill_ms']} (the seed's bug: it is never 0)")
    if not r["memory"]["kv_cells_peak"] > r["prefix_tokens"]:
        errors.append(f"{name}: kv_cells_peak {r['memory']['kv_cells_peak']} <= prefix_tokens")
    for a in r["agents"]:
        if a["status"] != "ok":
            errors.append(f"{name}/{a['name']}: status {a['status']}: {a['error']}")
        if not a["answer"].strip():
            errors.append(f"{name}/{a['name']}: empty answer")
        keys = ("fork", "prompt", "generate", "total") + (("restore",) if name == "host" else ())
        for key in keys:
            if not a["timings_ms"][key] > 0:
                errors.append(f"{name}/{a['name']}: timings_ms.{key} = {a['timings_ms'][key]}")
if shared["memory"]["contexts"] != 1 or shared["decode_steps"] < 1:
    errors.append(f"shared: {shared['memory']['contexts']} contexts, {shared['decode_steps']} steps")
for a, b in zip(shared["agents"], again["agents"]):
    if a["answer"] != b["answer"]:
        errors.append(f"{a['name']}: shared answers differ run to run:\n  {a['answer']!r}\n  {b['answer']!r}")
if errors:
    sys.exit("\n".join(errors))
same = sum(a["answer"] == h["answer"] for a, h in zip(shared["agents"], host["agents"]))
print(f"ok: {len(shared['agents'])} agents, shared deterministic, {same} answers identical to host; "
      f"end-to-end shared {shared['total_ms']:.0f} ms vs host {host['total_ms']:.0f} ms "
      f"({host['total_ms'] / shared['total_ms']:.2f}x)")
