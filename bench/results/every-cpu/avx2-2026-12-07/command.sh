#!/bin/sh
# from the repository root, on a 2-core AMD EPYC with AVX2, FMA and F16C and
# no AVX-512 (the native build is then the kernels' AVX2 code). NATIVE: the
# lib/ folder of the pinned llama.cpp built by scripts/build-llama.sh; M: the
# models (SmolLM2's Q8_0, Q4_0 and Q4_K_M made from its F16 with that build's
# llama-quantize, bench/swarmbench/builds.py requantised()).
# before-kernel/: the patches of 3cd6565 (the AVX2 attention kernel's first
# round); after-kernel/: those of the commit that added this file (its QK
# loop and the block's softmax, second round). Same machine, an hour apart.
M=${M:-$HOME/.cache/swarmkv/models}
NATIVE=${NATIVE:-$(scripts/build-llama.sh)/lib}
OUT=${OUT:-bench/results/every-cpu/avx2-2026-12-07/after-kernel}
/usr/bin/python3 bench/every_cpu.py --bin build/release/swarmkv --native-lib "$NATIVE" --builds native --out "$OUT" --parts timing --weights F16=$M/SmolLM2-135M-Instruct.F16.gguf Q8_0=$M/SmolLM2-135M-Instruct.Q8_0.gguf Q4_0=$M/SmolLM2-135M-Instruct.Q4_0.gguf Q4_K_M=$M/SmolLM2-135M-Instruct.Q4_K_M.gguf gemma3-Q4_K_M=$M/gemma-3-270m-q4_k_m.gguf --trials 3
