#!/bin/sh
# from the repository root, after scripts/test.sh (or scripts/demo.sh) built
# build/release and the pinned llama.cpp; the models (random weights in the
# shapes of Llama-3.2-1B/3B and Llama-3.1-8B) are made on first use into
# ~/.cache/swarmkv/models/real-sizes (about 25 GB, 20 minutes).
# This run: 2026-12-06, main at 804baef + issue 60's branch (no kernel change).
. scripts/lib.sh && ensure_llama
nice -n -15 /usr/bin/python3 bench/real_sizes.py --bin build/release/swarmkv --lib "$SWARMKV_LLAMA_PREFIX/lib" \
  --doc-tokens 3501 --doc-tokens-for llama-3.2-3b=1024 --doc-tokens-for llama-3.1-8b=512 \
  --weights-for llama-3.1-8b=Q4_K_M --stock-steps llama-3.2-1b --n-predict 8 --trials 1
