#!/usr/bin/env bash
# Prints the folder of llama.cpp's common/ sources (the JSON-schema-to-grammar
# converter), taken from the pinned llama-cpp-python sdist into the cache
# when missing: what CMake's SWARMKV_LLAMA_COMMON_SOURCE wants (scripts/test.sh
# and demo.sh do this for you).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_llama_common
echo "$SWARMKV_LLAMA_COMMON_SOURCE"
