"""Validates the JSON written by swarmkv_prefill_bench (used by the smoke test)."""
import json
import sys

with open(sys.argv[1]) as f:
    doc = json.load(f)

errors = []
params = doc.get("params", {})
for key in ("model", "doc_tokens", "n_batch", "trials", "threads"):
    if key not in params:
        errors.append(f"params.{key} missing")
if not doc.get("environment", {}).get("engine"):
    errors.append("environment.engine missing")
results = doc.get("results", [])
if len(results) != len(params.get("n_batch", [])):
    errors.append(f"{len(results)} results for {len(params.get('n_batch', []))} n_batch values")
for r in results:
    if len(r.get("prefill_ms", [])) != params.get("trials"):
        errors.append(f"n_batch {r.get('n_batch')}: {len(r.get('prefill_ms', []))} trials recorded")
    for key in ("median_ms", "tokens_per_s"):
        if not (isinstance(r.get(key), (int, float)) and r[key] > 0):
            errors.append(f"n_batch {r.get('n_batch')}: {key} must be > 0, got {r.get(key)!r}")
    if r.get("top1_matches_first") is not True:
        errors.append(f"n_batch {r.get('n_batch')}: next token differs from the first n_batch's")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"ok: {len(results)} n_batch values")
