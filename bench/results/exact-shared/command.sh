#!/usr/bin/env bash
# Exact vs inexact shared fork, back to back on one machine (issue 15):
# 4, 8 and 16 agents over a 3,501-token document, 32 greedy tokens each,
# SmolLM2-135M F16 (the default model), 2 threads, one trial per arm.
# Each run's reference is `none` with the same settings.
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${SWARMKV:-build/release/swarmkv}
common=(--arms none,shared,host --sweep branches=4,8,16 --doc-tokens 3501 --branch-tokens 6
        --n-predict 32 --trials 1 --threads 2)
"$B" bench "${common[@]}" --exact -o bench/results/exact-shared/exact
"$B" bench "${common[@]}" -o bench/results/exact-shared/inexact
/usr/bin/python3 bench/results/exact-shared/summarize.py bench/results/exact-shared
