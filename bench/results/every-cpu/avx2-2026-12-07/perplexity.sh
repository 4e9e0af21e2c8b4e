#!/bin/bash
# exact arm of bench/results/perplexity (new AVX2 kernel): SmolLM2 F16 and Gemma 3 Q4_K_M on GPL-3 and MPL-2.0
P=$(scripts/build-llama.sh)  # from the repository root
for m in ${M:-$HOME/.cache/swarmkv/models}/SmolLM2-135M-Instruct.F16.gguf ${M:-$HOME/.cache/swarmkv/models}/gemma-3-270m-q4_k_m.gguf; do
  for t in /usr/share/common-licenses/GPL-3 examples/documents/mpl-2.0.txt; do
    v=$(GGML_CPU_SGEMM_SINGLE_ROW=1 GGML_CPU_FA_BATCH_INVARIANT=1 $P/bin/llama-perplexity -m $m -f $t -c 512 -t 2 -fa on -ctk q8_0 -ctv q8_0 --no-repack 2>&1 | grep -o "Final estimate: PPL = [0-9.]* +/- [0-9.]*")
    echo "$(basename $m) $(basename $t): $v"
  done
done
