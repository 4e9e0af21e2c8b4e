#!/bin/sh
# from the repository root. NATIVE and PORTABLE: the lib/ folders of the
# pinned llama.cpp built by scripts/build-llama.sh and by
# SWARMKV_NATIVE=0 scripts/build-llama.sh; M: the models (the SmolLM2
# Q8_0, Q4_0 and Q4_K_M files made from its F16 with that build's
# llama-quantize). Timing measured with the builds of the patches at 6d0cf0d;
# answers-portable.* with those of 9004537.
M=${M:-$HOME/.cache/swarmkv/models}
NATIVE=${NATIVE:-$(scripts/build-llama.sh)/lib}
PORTABLE=${PORTABLE:-$(SWARMKV_NATIVE=0 scripts/build-llama.sh)/lib}
# timing: prefill per weight file and the 1- and 16-agent steps, both builds, both modes
/usr/bin/python3 bench/every_cpu.py --bin build/release/swarmkv --native-lib "$NATIVE" --portable-lib "$PORTABLE" --parts timing --weights F16=$M/SmolLM2-135M-Instruct.F16.gguf Q8_0=$M/SmolLM2-135M-Instruct.Q8_0.gguf Q4_0=$M/SmolLM2-135M-Instruct.Q4_0.gguf Q4_K_M=$M/SmolLM2-135M-Instruct.Q4_K_M.gguf gemma3-Q4_K_M=$M/gemma-3-270m-q4_k_m.gguf --trials 3
# answers: shared and host against none on the portable build
/usr/bin/python3 bench/every_cpu.py --bin build/release/swarmkv --native-lib "$NATIVE" --portable-lib "$PORTABLE" --parts answers --answers-build portable --answers-weights $M/SmolLM2-135M-Instruct.F16.gguf $M/gemma-3-270m-q4_k_m.gguf
