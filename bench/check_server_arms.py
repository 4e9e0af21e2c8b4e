"""Checks the llama-server peer arms of a tiny `swarmkv bench` run (CTest label
`server`): every request answered, the server's greedy answers equal the
the reference's (none) token for token, its own timings recorded, and every server it
started is gone (no process left behind).

usage: check_server_arms.py OUT_DIR
"""
import json
import os
import sys

out = sys.argv[1]
best = json.load(open(os.path.join(out, "best_run.json")))
errors = []


def need(cond, msg):
    if not cond:
        errors.append(msg)


for arm in ("server-concurrent", "server-sequential"):
    bt = best["arms"].get(arm, {}).get("best_trial")
    need(bt is not None, f"{arm}: no result")
    if not bt:
        continue
    need(bt["ok"], f"{arm}: a request failed: {[b for b in bt['branches'] if b['status'] != 'ok']}")
    need(bt["end_to_end_ms"] > 0, f"{arm}: end_to_end_ms is 0")
    server = bt["extra"]["server"]
    need(len(server["requests"]) == best["params"]["branches"], f"{arm}: {len(server['requests'])} requests")
    for b in bt["branches"]:
        need(b["n_tokens"] > 0, f"{arm}/{b['name']}: no tokens")
        need(b["first_difference_vs_reference"] == -1,
             f"{arm}/{b['name']}: the server's answer differs from the reference (none) at token {b['first_difference_vs_reference']}")
        need(b["timings_ms"]["first_token"] > 0 and b["timings_ms"]["total"] >= b["timings_ms"]["first_token"], f"{arm}/{b['name']}: bad timings")
    for r in server["requests"]:
        need(r["prompt_n"] > 0 and r["prompt_ms"] > 0 and r["predicted_n"] > 0, f"{arm}/{r['name']}: server timings missing: {r}")
        need(not r["error"], f"{arm}/{r['name']}: {r['error']}")
    if arm == "server-sequential":
        later = server["requests"][1:]
        need(all(r["cache_n"] > 0 for r in later), f"server-sequential: later requests reused nothing: {later}")
        need(bt["branch_phase_ms"] is not None and bt["branch_phase_ms"] > 0, "server-sequential: no branch phase")
    need(server["pid"] > 0, f"{arm}: no pid recorded")
    try:
        os.kill(server["pid"], 0)
        errors.append(f"{arm}: llama-server pid {server['pid']} is still running")
    except ProcessLookupError:
        pass
sp = best["speedup"].get("shared", {})
for k in ("end_to_end_vs_server-concurrent", "end_to_end_vs_server-sequential", "branch_phase_vs_server-sequential"):
    need(isinstance(sp.get(k), (int, float)) and sp[k] > 0, f"speedup.shared.{k} missing")
if errors:
    sys.exit("\n".join(errors))
print(f"ok: {out}")
