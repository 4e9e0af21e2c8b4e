#!/usr/bin/env bash
# Prints the folder of hiredis 1.5.0's sources (TLS to Redis), fetched from
# PyPI's hiredis sdist into the cache when missing: what CMake's
# SWARMKV_HIREDIS_SOURCE wants (scripts/test.sh and demo.sh do this for you).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_hiredis
echo "$SWARMKV_HIREDIS_SOURCE"
