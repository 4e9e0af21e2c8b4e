"""`swarmkv run` on the README pipeline with the default fork (shared), cold
and then warm from a fresh snapshot store (writing its page, --html, which
`swarmkv report` of the saved result writes again), and with --fork host
without the store: every agent ok with a non-empty answer and real timings, the warm run
restoring the cold run's snapshot (no document token prefilled) and
answering identically, `swarmkv prefill` and `swarmkv snapshot ls|verify|rm`
on that store, and every shared answer equal to host's: both are exact by
default, so both equal a full re-prefill (ExactForkTest checks that against
--fork none on two documents and both architectures).

usage: run_readme_pipeline.py SWARMKV_BINARY PIPELINE MODEL
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

binary, pipeline, model = sys.argv[1:4]
store = tempfile.mkdtemp(prefix="swarmkv-readme-store-")
atexit.register(shutil.rmtree, store, True)


def cli(*args, check=True):
    cmd = [binary, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr}")
    return proc


def run(*extra):
    return json.loads(cli("run", pipeline, "--model", model, "--json", "--cache-dir", store,
                          *extra).stdout)


shared = run()
page = os.path.join(store, "run.html")
again = run("--html", page)
host = run("--fork", "host", "--snapshot-cache", "off")
errors = []
cold, warm = shared["snapshot"], again["snapshot"]
if cold["source"] != "prefill" or not cold["published"] or cold["prefilled_tokens"] != shared["prefix_tokens"]:
    errors.append(f"cold run: snapshot {cold}")
if warm["source"] != "cache" or warm["prefilled_tokens"] != 0 or warm["reused_tokens"] != again["prefix_tokens"]:
    errors.append(f"warm run: snapshot {warm}")
if again["prefill_ms"] != 0 or again["document_prefills"] != 0:
    errors.append(f"warm run prefilled: prefill_ms {again['prefill_ms']}, {again['document_prefills']} prefills")
if host["snapshot"]["source"] != "prefill" or host["snapshot"]["published"]:
    errors.append(f"--snapshot-cache off used the store: {host['snapshot']}")
for r in (shared, again, host):
    for a in r["agents"]:
        if not a["first_token_at_ms"] > 0:
            errors.append(f"{a['name']}: first_token_at_ms = {a['first_token_at_ms']}")
listed = json.loads(cli("snapshot", "ls", "--json", "--cache-dir", store).stdout)
if [e["key"] for e in listed] != [cold["key"]] or listed[0]["error"] is not None:
    errors.append(f"snapshot ls: {listed}")
verified = json.loads(cli("snapshot", "verify", "--json", "--cache-dir", store, cold["key"][:8]).stdout)
if not verified[0]["ok"]:
    errors.append(f"snapshot verify: {verified}")
prefill = json.loads(cli("prefill", pipeline, "--model", model, "--json", "--cache-dir", store).stdout)
if prefill["snapshot"]["source"] != "cache" or prefill["snapshot"]["prefilled_tokens"] != 0:
    errors.append(f"prefill of a stored document prefilled: {prefill['snapshot']}")
cli("snapshot", "rm", "--all", "--cache-dir", store)
if json.loads(cli("snapshot", "ls", "--json", "--cache-dir", store).stdout):
    errors.append("snapshot rm --all left entries")
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
        errors.append(f"{a['name']}: shared answers differ cold vs warm:\n  {a['answer']!r}\n  {b['answer']!r}")
if not (shared["exact"] and host["exact"]):
    errors.append(f"not exact by default: shared {shared['exact']}, host {host['exact']}")
for a, h in zip(shared["agents"], host["agents"]):
    if a["tokens"] != h["tokens"]:
        errors.append(f"{a['name']}: shared and host answer differently:\n  {a['answer']!r}\n  {h['answer']!r}")
# The run's page: every agent in the graph, the timeline and the texts, and
# `report` of the saved result draws the same (its header names the file).
with open(page) as f:
    html = f.read()
for i, a in enumerate(again["agents"]):
    for anchor in (f'id="node-{i}"', f'id="bar-{i}"', f'id="agent-{i}"'):
        if anchor not in html:
            errors.append(f"the page lacks {anchor} ({a['name']})")
saved = os.path.join(store, "run.json")
with open(saved, "w") as f:
    json.dump(again, f)
cli("report", saved, "--html", page + ".again")
with open(page + ".again") as f:
    again_html = f.read()
if again_html.replace(f"<dt>result from</dt><dd>{saved}</dd>\n", "") != html:
    errors.append("report of the saved result draws another page than run --html")
nowhere = cli("run", pipeline, "--model", model, "--html", "/nonexistent-dir/run.html", check=False)
if nowhere.returncode != 2 or "--html /nonexistent-dir/run.html: the folder /nonexistent-dir does " \
        "not exist" not in nowhere.stderr:
    errors.append(f"run --html into a missing folder: exit {nowhere.returncode}: {nowhere.stderr}")
bad = cli("report", pipeline, "--html", page, check=False)
if bad.returncode != 1 or "is not JSON (a `swarmkv run --json` result?)" not in bad.stderr:
    errors.append(f"report of a YAML file: exit {bad.returncode}: {bad.stderr}")
if errors:
    sys.exit("\n".join(errors))
print(f"ok: {len(shared['agents'])} agents, shared cold == warm (load {warm['load_ms']:.0f} ms vs "
      f"prefill {shared['prefill_ms']:.0f} ms), every answer identical to host's; "
      f"end-to-end shared {shared['total_ms']:.0f} ms vs host {host['total_ms']:.0f} ms "
      f"({host['total_ms'] / shared['total_ms']:.2f}x)")
