"""Validates a `swarmkv bench` + plot_bench.py output directory (smoke test).

Fails when a file, a column or a metric is missing, or a metric is zero where
it cannot be (the seed reported SwarmKV_Prefill_Ms = 0).
usage: check_bench_output.py OUT_DIR
"""
import csv
import json
import os
import sys

out = sys.argv[1]
errors = []


def need(cond, msg):
    if not cond:
        errors.append(msg)


for f in ("best_run.json", "all_trials.csv", "report.md", "plots/end_to_end.png", "plots/activation_per_branch.png",
          "plots/breakdown.png"):
    need(os.path.isfile(os.path.join(out, f)) and os.path.getsize(os.path.join(out, f)) > 0, f"missing or empty: {f}")
if errors:
    sys.exit("\n".join(errors))

best = json.load(open(os.path.join(out, "best_run.json")))
for k in ("model", "doc_tokens", "branches", "branch_tokens", "n_predict", "threads", "trials", "arms"):
    need(k in best["params"], f"params.{k} missing")
for k in ("cpu", "cores", "engine", "model_file"):
    need(best["environment"].get(k), f"environment.{k} missing")
need("0c1e57098" in best["environment"].get("engine", "") or "unknown" in best["environment"].get("engine", ""),
     "environment.engine lacks the llama.cpp commit")
sp = best.get("speedup", {}).get("host", {})
for k in ("end_to_end", "branch2_activation"):
    need(isinstance(sp.get(k), (int, float)) and sp[k] > 0, f"speedup.host.{k} missing or not > 0")
for arm in best["params"]["arms"]:
    bt = best.get("arms", {}).get(arm, {}).get("best_trial")
    need(bt is not None, f"arms.{arm}.best_trial missing")
    if not bt:
        continue
    need(bt["ok"], f"{arm}: a branch failed")
    need(bt["end_to_end_ms"] > 0, f"{arm}: end_to_end_ms is 0")
    need(bt["prefill_ms"] > 0, f"{arm}: prefill_ms is 0 (the seed's bug)")
    need(bt["branch2_activation_ms"] > 0, f"{arm}: branch2_activation_ms is 0")
    need(bt["prefill_tokens_per_s"] > 0 and bt["generate_tokens_per_s"] > 0, f"{arm}: tokens/s is 0")
    need(bt["peak_rss_kib"] > 0, f"{arm}: peak_rss_kib is 0")
    m = bt.get("memory", {})
    for k in ("kv_cells_peak", "kv_bytes_per_cell", "kv_bytes_peak", "kv_bytes_allocated", "kv_bytes_needed"):
        need(m.get(k, 0) > 0, f"{arm}: memory.{k} missing or 0")
    need(m.get("kv_bytes_allocated", 0) >= m.get("kv_bytes_peak", 1), f"{arm}: more KV in use than allocated")
    for b in bt["branches"]:
        need(b["n_tokens"] > 0, f"{arm}/{b['name']}: no tokens generated")
        for k in ("prompt", "first_token", "generate", "total"):
            need(b["timings_ms"][k] > 0, f"{arm}/{b['name']}: timings_ms.{k} is 0")
        if arm == "host":
            need(b["timings_ms"]["fork"] > 0 and b["timings_ms"]["restore"] > 0, f"host/{b['name']}: fork or restore is 0")
            need(b["first_difference_vs_reference"] == -1, f"host/{b['name']}: answer differs from the reference (none)")
        elif arm == "shared":
            need(b["timings_ms"]["fork"] > 0, f"shared/{b['name']}: fork is 0")
            need(b["first_difference_vs_reference"] == -1 or b["first_difference_vs_reference"] >= 0,
                 f"shared/{b['name']}: first_difference_vs_reference missing")
        else:
            need(b["timings_ms"]["prefill"] > 0, f"none/{b['name']}: its own re-prefill is 0")
    if arm == "host":
        need(bt["snapshot_bytes"] > 0 and bt["export_ms"] > 0, "host: snapshot_bytes or export_ms is 0")
        need(bt["memory"]["host_buffer_bytes"] > 0, "host: host_buffer_bytes is 0")
    if arm == "shared":
        need(bt["decode_steps"] > 0, "shared: no decode steps recorded")
        need(bt["memory"]["contexts"] == 1, "shared: more than one context")
        need(len(bt["generation_step_ms_by_branches"]) > 0, "shared: no generation step timings")
        need("end_to_end_vs_host" in best["speedup"].get("shared", {}) or "host" not in best["params"]["arms"],
             "speedup.shared.end_to_end_vs_host missing")

rows = list(csv.DictReader(open(os.path.join(out, "all_trials.csv"))))
need(len(rows) == best["params"]["trials"] * len(best["params"]["arms"]), f"{len(rows)} CSV rows")
for col in ("Baseline_End_To_End_Ms", "SwarmKV_End_To_End_Ms", "SwarmKV_Prefill_Ms", "SwarmKV_AgentA_Ms",
            "SwarmKV_AgentB_Ms", "branch2_activation_ms"):
    need(rows and col in rows[0], f"CSV column {col} missing")
for r in rows:
    if r["arm"] == "none":
        need(float(r["Baseline_End_To_End_Ms"] or 0) > 0, "Baseline_End_To_End_Ms is 0")
    else:
        need(float(r["SwarmKV_Prefill_Ms"] or 0) > 0, f"{r['arm']}: SwarmKV_Prefill_Ms is 0 (the seed's bug)")
        need(float(r["SwarmKV_AgentA_Ms"] or 0) > 0 and float(r["SwarmKV_AgentB_Ms"] or 0) > 0,
             f"{r['arm']}: agent ms is 0")
    need(int(r["kv_cells_peak"] or 0) > 0, f"{r['arm']}: kv_cells_peak is 0")
report = open(os.path.join(out, "report.md")).read()
for section in ("## Method", "## Environment", "## Results", "## Limitations"):
    need(section in report, f"report.md lacks {section}")
if errors:
    sys.exit("\n".join(errors))
print(f"ok: {out}")
