#!/usr/bin/env bash
# Exact (the default) against --no-exact (llama.cpp's stock kernels) on the
# attention kernel of this round (issue 38 items 3 and the prefill goal),
# one binary, back to back on one machine; nothing else runs meanwhile.
#   exact-vs-stock/host/  the host fork at 1, 4 and 16 agents (bench/old_vs_new.py:
#                         "old" = --no-exact, "new" = the default), ~3,500-token
#                         document, 32 greedy tokens each, TRIALS alternated trials
#   exact-vs-stock/prefill/  the README pipeline's document (2,239 tokens), store
#                         off, one 1-token agent: prefill tokens/s, default vs
#                         --no-exact, and llama-bench -fa 1 (same threads and
#                         depth), TRIALS alternated trials, SmolLM2 F16
# Then exact-vs-stock/report.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/prefix-attention/exact-vs-stock
BIN=${BIN:-build/release/swarmkv}
M=${SWARMKV_MODELS:-$HOME/.cache/swarmkv/models}
LLAMA_BENCH=${LLAMA_BENCH:-$(scripts/build-llama.sh)/bin/llama-bench}
TRIALS=${TRIALS:-3}
PY=/usr/bin/python3
F16=$M/SmolLM2-135M-Instruct.F16.gguf

stock=$(mktemp) exact=$(mktemp)
trap 'rm -f "$stock" "$exact"' EXIT
printf '#!/bin/sh\nexec %q "$@" --snapshot-cache off --no-exact\n' "$(realpath "$BIN")" >"$stock"
printf '#!/bin/sh\nexec %q "$@" --snapshot-cache off\n' "$(realpath "$BIN")" >"$exact"
chmod +x "$stock" "$exact"

rm -rf "$out"
mkdir -p "$out/prefill"
"$PY" bench/old_vs_new.py "$stock" "$exact" "$F16" "$out/host" --trials "$TRIALS" --branches 1,4,16 --forks host

p=$out/prefill/readme-one-agent.yaml
sed -e 's|file: ../documents/|file: ../../../../../examples/documents/|' examples/pipelines/apache-license.yaml |
  "$PY" -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); d["agents"] = [{"name": "one", "prompt": "Hi", "max_tokens": 1}]; d.pop("model", None); print(yaml.safe_dump(d))' >"$p"
for t in $(seq "$TRIALS"); do
  order=(stock exact); [ $((t % 2)) -eq 0 ] && order=(exact stock)
  for arm in "${order[@]}"; do
    flag=(); [ "$arm" = stock ] && flag=(--no-exact)
    "$BIN" run "$p" --model "$F16" --snapshot-cache off -t 2 --json "${flag[@]}" >"$out/prefill/$arm-$t.json" 2>/dev/null
  done
  n=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefix_tokens"])' "$out/prefill/exact-$t.json")
  "$LLAMA_BENCH" -m "$F16" -p "$n" -n 0 -fa 1 -t 2 -r 1 -o json >"$out/prefill/llama-bench-fa1-$t.json" 2>/dev/null
done

"$PY" - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
med = statistics.median
rows = json.load(open(os.path.join(out, "host", "rows.json")))
L = ["# Exact against --no-exact, this round's kernel", "",
     "`exact-vs-stock.sh` (SmolLM2 F16, 2 threads, store off; alternated trials, medians).", "",
     "## Host fork, branch phase (total − prefill), 32 tokens per agent", "",
     "| agents | --no-exact | exact | exact / --no-exact | trials |", "|---|---|---|---|---|"]
for n in sorted({r["branches"] for r in rows}):
    old = [r["branch_phase_ms"] for r in rows if r["branches"] == n and r["binary"] == "old"]
    new = [r["branch_phase_ms"] for r in rows if r["branches"] == n and r["binary"] == "new"]
    L.append(f"| {n} | {med(old)/1000:.2f} s | {med(new)/1000:.2f} s | {med(new)/med(old):.3f} | {len(new)} |")
pre = os.path.join(out, "prefill")
rate = lambda arm: [d["prefix_tokens"] / d["prefill_ms"] * 1000 for d in  # noqa: E731
                    (json.load(open(p)) for p in sorted(glob.glob(os.path.join(pre, f"{arm}-*.json"))))]
lb = [json.load(open(p))[0]["avg_ts"] for p in sorted(glob.glob(os.path.join(pre, "llama-bench-fa1-*.json")))]
n = json.load(open(sorted(glob.glob(os.path.join(pre, "exact-*.json")))[0]))["prefix_tokens"]
L += ["", f"## README document prefill ({n} tokens, one 1-token agent)", "",
      "| arm | tokens/s (median) | trials |", "|---|---|---|",
      f"| --no-exact | {med(rate('stock')):.0f} | {len(rate('stock'))} |",
      f"| exact (default) | {med(rate('exact')):.0f} | {len(rate('exact'))} |",
      f"| llama-bench -fa 1 (ggml's tiled CPU kernel), pp{n} | {med(lb):.0f} | {len(lb)} |", "",
      f"exact / --no-exact: {med(rate('exact')) / med(rate('stock')):.3f}×; "
      f"exact / llama-bench -fa 1: {med(rate('exact')) / med(lb):.3f}×.", ""]
open(os.path.join(out, "report.md"), "w").write("\n".join(L))
print("\n".join(L))
PY
