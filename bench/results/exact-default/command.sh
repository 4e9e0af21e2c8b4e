#!/usr/bin/env bash
# Exact mode as the default (issue 38): the new default (exact) against
# today's former default (--no-exact: llama.cpp's stock kernels), one
# binary, back to back on one machine; nothing else runs meanwhile.
#   agents/    shared fork at 1, 4, 16 and 50 agents, host at 1, 4, 16 and
#              none at 1 (the re-prefill reference, x 50 for the 50-agent
#              speed-up), ~3,500-token document, 32 greedy tokens each
#              (bench/old_vs_new.py: "old" = --no-exact, "new" = default),
#              TRIALS alternated trials
#   prefill/   the README pipeline's document (2,239 tokens), store off:
#              prefill tokens/s, default vs --no-exact, TRIALS alternated
#              trials per weight file (SmolLM2 F16, Q4_1, Q4_0, Gemma 3
#              Q4_K_M), and llama-bench's prompt processing (-fa 1, same
#              threads and depth) on F16 in the same run
#   gemma3/    the agents part on Gemma 3 270M Q4_K_M: shared and host at
#              1, 4 and 16 agents
#   answers/   default runs: the README pipeline, contract-review and the
#              16-agent synthetic pipeline (../prefill-default/sixteen-agents.yaml)
#              under shared, host and none on SmolLM2 and Gemma 3;
#              contract-review without needs (its whole-document agents'
#              done_at_ms)
# summarize.py writes report.md, summary.json, summary.csv and plots/.
# PARTS (default "agents gemma3 prefill answers") reruns some of them only.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/exact-default
BIN=${BIN:-build/release/swarmkv}
M=${SWARMKV_MODELS:-$HOME/.cache/swarmkv/models}
LLAMA_BENCH=${LLAMA_BENCH:-$(scripts/build-llama.sh)/bin/llama-bench}
TRIALS=${TRIALS:-3}
PY=/usr/bin/python3  # Debian's, with python3-matplotlib (scripts/lib.sh)
PARTS=${PARTS:-agents gemma3 prefill answers}
part() { [[ " $PARTS " == *" $1 "* ]]; }
F16=$M/SmolLM2-135M-Instruct.F16.gguf
GEMMA=$M/gemma-3-270m-q4_k_m.gguf
Q4_0=$M/SmolLM2-135M-Instruct.Q4_0.gguf
[ -f "$Q4_0" ] || "$(dirname "$LLAMA_BENCH")/llama-quantize" "$F16" "$Q4_0" Q4_0 >/dev/null 2>&1

# Each arm as a binary of its own for old_vs_new.py ("old" = the former
# default, --no-exact; "new" = the default), the snapshot store off so that
# every run prefills its document.
stock=$(mktemp) exact=$(mktemp)
trap 'rm -f "$stock" "$exact"' EXIT
printf '#!/bin/sh\nexec %q "$@" --snapshot-cache off --no-exact\n' "$(realpath "$BIN")" >"$stock"
printf '#!/bin/sh\nexec %q "$@" --snapshot-cache off\n' "$(realpath "$BIN")" >"$exact"
chmod +x "$stock" "$exact"

if part agents; then
  rm -rf "$out/agents"
  "$PY" bench/old_vs_new.py "$stock" "$exact" "$F16" "$out/agents/shared" --trials "$TRIALS" --branches 1,4,16,50 --forks shared
  "$PY" bench/old_vs_new.py "$stock" "$exact" "$F16" "$out/agents/host" --trials "$TRIALS" --branches 1,4,16 --forks host
  # The reference for 50 agents: one agent re-prefilling (x 50).
  "$PY" bench/old_vs_new.py "$stock" "$exact" "$F16" "$out/agents/none" --trials "$TRIALS" --branches 1 --forks none
fi

if part gemma3; then
  rm -rf "$out/gemma3"
  "$PY" bench/old_vs_new.py "$stock" "$exact" "$GEMMA" "$out/gemma3/shared" --trials "$TRIALS" --branches 1,4,16 --forks shared
  "$PY" bench/old_vs_new.py "$stock" "$exact" "$GEMMA" "$out/gemma3/host" --trials "$TRIALS" --branches 1,4,16 --forks host
fi

if part prefill; then
  rm -rf "$out/prefill"
  mkdir -p "$out/prefill"
  p=$out/prefill/readme-one-agent.yaml  # the README document, one 1-token agent: the prefill alone
  sed -e 's|file: ../documents/|file: ../../../../examples/documents/|' examples/pipelines/apache-license.yaml |
    "$PY" -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); d["agents"] = [{"name": "one", "prompt": "Hi", "max_tokens": 1}]; d.pop("model", None); print(yaml.safe_dump(d))' >"$p"
  for t in $(seq "$TRIALS"); do
    for model in F16:$F16 Q4_1:$M/SmolLM2-135M-Instruct.Q4_1.gguf Q4_0:$Q4_0 Q4_K_M:$GEMMA; do
      order=(stock exact); [ $((t % 2)) -eq 0 ] && order=(exact stock)
      for arm in "${order[@]}"; do
        flag=(); [ "$arm" = stock ] && flag=(--no-exact)
        "$BIN" run "$p" --model "${model#*:}" --snapshot-cache off -t 2 --json "${flag[@]}" \
          >"$out/prefill/${model%%:*}-$arm-$t.json" 2>/dev/null
      done
    done
    n=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefix_tokens"])' "$out/prefill/F16-exact-$t.json")
    "$LLAMA_BENCH" -m "$F16" -p "$n" -n 0 -fa 1 -t 2 -r 1 -o json >"$out/prefill/llama-bench-fa1-$t.json" 2>/dev/null
    "$LLAMA_BENCH" -m "$F16" -p "$n" -n 0 -fa 0 -t 2 -r 1 -o json >"$out/prefill/llama-bench-fa0-$t.json" 2>/dev/null
  done
fi

if part answers; then
  rm -rf "$out/answers"
  mkdir -p "$out/answers"
  nn=$out/answers/contract-review-without-needs.yaml
  sed -e '/^    needs:/d' -e 's|file: ../documents/|file: ../../../../examples/documents/|' \
    examples/pipelines/contract-review.yaml >"$nn"
  for model in smollm2:$F16 gemma3:$GEMMA; do
    for pipe in examples/pipelines/apache-license.yaml examples/pipelines/contract-review.yaml; do
      for fork in shared host none; do
        "$BIN" run "$pipe" --model "${model#*:}" --fork "$fork" --snapshot-cache off -t 2 --json \
          >"$out/answers/${model%%:*}-$(basename "$pipe" .yaml)-$fork.json" 2>/dev/null
      done
    done
  done
  "$BIN" run "$nn" --model "$F16" --snapshot-cache off -t 2 --json >"$out/answers/smollm2-contract-review-without-needs-shared.json" 2>/dev/null
  for model in smollm2:$F16 gemma3:$GEMMA; do
    for fork in shared host none; do
      "$BIN" run bench/results/prefill-default/sixteen-agents.yaml --model "${model#*:}" --fork "$fork" \
        --snapshot-cache off -t 2 --json >"$out/answers/${model%%:*}-sixteen-agents-$fork.json" 2>/dev/null
    done
  done
fi

"$PY" "$out/summarize.py" "$out"
