#!/bin/sh
# from the repository root, after scripts/test.sh (or scripts/demo.sh) built
# build/release and the pinned llama.cpp; the models (random weights in the
# shapes of Llama-3.2-1B/3B and Llama-3.1-8B) are made on first use into
# ~/.cache/swarmkv/models/real-sizes (about 25 GB, 20 minutes).
# This run: 2026-12-07, main at 68e3fca, a 2-core AMD EPYC with AVX2 and no
# AVX-512 (the native build is the AVX2 one), nothing else running.
. scripts/lib.sh && ensure_llama
nice -n -15 /usr/bin/python3 bench/real_sizes.py --bin build/release/swarmkv --lib "$SWARMKV_LLAMA_PREFIX/lib" \
  --doc-tokens 3501 --doc-tokens-for llama-3.2-3b=1024 --doc-tokens-for llama-3.1-8b=512 \
  --weights-for llama-3.1-8b=Q4_K_M --stock-steps llama-3.2-1b,llama-3.2-3b,llama-3.1-8b \
  --n-predict 8 --trials 1 --out bench/results/real-sizes/avx2-2026-12-07
