#!/usr/bin/env bash
# The main job, with all of its own set-up (idempotent, cached): Debian
# packages, the pinned llama.cpp, the default model, a release build; then a
# real answer from the default model. Extra arguments go to `swarmkv generate`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_system_packages
ensure_llama
model=$("$SWARMKV_ROOT/scripts/fetch-model.sh" smollm2)
configure_and_build release
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-p "In two sentences: why does a multi-agent pipeline that shares one long document benefit from computing the document's KV cache only once?")
exec "$SWARMKV_ROOT/build/release/swarmkv" generate --model "${SWARMKV_MODEL:-$model}" "${args[@]}"
