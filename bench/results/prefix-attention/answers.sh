#!/usr/bin/env bash
# Issue 43's answers check on this round's kernel: the default (exact)
# shared fork against every agent re-prefilling (`--arms none,shared`), token
# for token, at 16 agents on SmolLM2 F16 and Gemma 3 Q4_K_M and at 50 agents
# on SmolLM2 (3,501-token synthetic document, 32 greedy tokens each, one
# trial: the comparison is of tokens, not time). Writes answers/<case>/ and
# answers/summary.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/prefix-attention/answers
BIN=${BIN:-build/release/swarmkv}
M=${SWARMKV_MODELS:-$HOME/.cache/swarmkv/models}
rm -rf "$out"
mkdir -p "$out"
for c in smollm2-16:SmolLM2-135M-Instruct.F16.gguf:16 gemma3-16:gemma-3-270m-q4_k_m.gguf:16 smollm2-50:SmolLM2-135M-Instruct.F16.gguf:50; do
  IFS=: read -r name model n <<<"$c"
  "$BIN" bench --model "$M/$model" --arms none,shared --branches "$n" --n-predict 32 --trials 1 \
    --out "$out/$name" >"$out/$name.log" 2>&1
  rm -f "$out/$name.log"
done
/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
L = ["# Shared fork (default, exact) against re-prefilling, token for token", "",
     "`answers.sh`: `swarmkv bench --arms none,shared --n-predict 32`, one trial.", "",
     "| case | agents | tokens compared | shared == none, every agent |", "|---|---|---|---|"]
for name in sorted(os.listdir(out)):
    p = os.path.join(out, name, "best_run.json")
    if not os.path.exists(p):
        continue
    t = json.load(open(p))["arms"]["shared"]["best_trial"]
    tokens = sum(len(b["tokens"]) for b in t["branches"])
    L.append(f"| {name} | {len(t['branches'])} | {tokens} | {t['answers_match_reference']} |")
open(os.path.join(out, "summary.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
