#!/usr/bin/env bash
# Reproduces this folder (2-core x86 VM, SmolLM2-135M-Instruct F16, exact mode, 2026-12-04).
python3 bench/cluster_job_split.py build/release/swarmkv \
  ~/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf /usr/bin/redis-server \
  bench/results/cluster-job-split --trials 3
