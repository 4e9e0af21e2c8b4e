#!/usr/bin/env bash
# Issue 59 ("no speed lost"): OLD is a release build of d05c815 (before the
# one step executor), NEW this tree's; the parts of
# ../one-core-old-vs-new/command.sh: 16 agents shared over ~3,500 tokens,
# 16 concurrent `serve` requests exact (the default) and --no-exact, 5
# alternated trials (this folder: TRIALS=3); the README pipeline (shared, host, none),
# contract-review and the README pipeline on two workers, answers compared.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/one-loop-old-vs-new
OUT=$out SERVE_ARMS="exact= no-exact=--no-exact" SUMMARIZE=0 PARTS="${PARTS:-pipeline serve answers}" \
  bench/results/one-core-old-vs-new/command.sh
/usr/bin/python3 bench/results/one-core-old-vs-new/summarize.py "$out" "${TRIALS:-5}" \
  --title "One step loop: old vs new binary, back to back" \
  --old "release build of d05c815 (before issue 59's step executor)" --old-short d05c815 \
  --setting "${SETTING:-2-core AMD EPYC, AVX2 only (not the AVX-512 machines of earlier results), nothing else running}" --reading "$out/reading.md"
