#!/usr/bin/env bash
# The main job, with all of its own set-up (idempotent, cached): Debian
# packages, the pinned llama.cpp, the default model, a release build; then the
# README pipeline: four agents over the Apache License 2.0, the document
# prefilled once and every agent forked from its KV snapshot.
#
# Extra arguments go to `swarmkv run`, e.g. `--fork none` (the reference: every agent re-prefills) or
# `--json`. Set SWARMKV_MODEL to use another GGUF.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

setup_release
model=$SWARMKV_RUN_MODEL
exec "$SWARMKV_ROOT/build/release/swarmkv" run "$SWARMKV_ROOT/examples/pipelines/apache-license.yaml" \
  --model "$model" "$@"
