#!/bin/sh
# from the repository root, on a 2-core AMD EPYC (Zen 4: AVX-512 with VNNI and
# BF16, no AMX) on 2026-12-08, at 6dc4313 (the code of 35b3239 for what this
# measures). NATIVE and PORTABLE: the lib/ folders of the pinned llama.cpp
# built by scripts/build-llama.sh and SWARMKV_NATIVE=0 scripts/build-llama.sh;
# M: the models (SmolLM2's Q8_0, Q4_0 and Q4_K_M made from its F16 with that
# build's llama-quantize).
M=${M:-$HOME/.cache/swarmkv/models}
NATIVE=${NATIVE:-$(scripts/build-llama.sh)/lib}
PORTABLE=${PORTABLE:-$(SWARMKV_NATIVE=0 scripts/build-llama.sh)/lib}
OUT=bench/results/every-cpu/zen4-2026-12-08
/usr/bin/python3 bench/every_cpu.py --bin build/release/swarmkv --native-lib "$NATIVE" --portable-lib "$PORTABLE" --out "$OUT" --parts timing --weights F16=$M/SmolLM2-135M-Instruct.F16.gguf Q8_0=$M/SmolLM2-135M-Instruct.Q8_0.gguf Q4_0=$M/SmolLM2-135M-Instruct.Q4_0.gguf Q4_K_M=$M/SmolLM2-135M-Instruct.Q4_K_M.gguf gemma3-Q4_K_M=$M/gemma-3-270m-q4_k_m.gguf --trials 3
/usr/bin/python3 bench/every_cpu.py --bin build/release/swarmkv --native-lib "$NATIVE" --portable-lib "$PORTABLE" --out "$OUT" --parts answers --answers-build native --answers-weights $M/SmolLM2-135M-Instruct.Q4_0.gguf $M/SmolLM2-135M-Instruct.F16.gguf
