#!/usr/bin/env bash
# Exact vs inexact shared fork, back to back on one machine (issue 15):
# 4, 8 and 16 agents over a 3,501-token document, 32 greedy tokens each,
# SmolLM2-135M F16 (the default model), 2 threads, one trial per arm.
# Three modes, one process each (ggml reads its kernel switches once):
#   exact-patched  --exact with our flash-attention row kernel
#                  (scripts/patches/ggml-fa-batch-invariant.patch)
#   exact-api      --exact without it (GGML_CPU_FA_BATCH_INVARIANT=0: the
#                  public-API measures only, one-row steps on one thread)
#   inexact        today's default settings (flash attention off)
# Each run's reference is `none` with the same settings.
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${SWARMKV:-build/release/swarmkv}
out=bench/results/exact-shared
common=(--arms none,shared,host --sweep branches=4,8,16 --doc-tokens 3501 --branch-tokens 6
        --n-predict 32 --trials 1 --threads 2)
GGML_CPU_FA_BATCH_INVARIANT=1 "$B" bench "${common[@]}" --exact -o "$out/exact-patched"
GGML_CPU_FA_BATCH_INVARIANT=0 "$B" bench "${common[@]}" --exact -o "$out/exact-api"
"$B" bench "${common[@]}" -o "$out/inexact"
/usr/bin/python3 "$out/summarize.py" "$out"
