#!/usr/bin/env bash
# Reproduces bench/results/gpu-check on a GPU machine (2026-12-04: one NVIDIA
# H200, 16 CPU cores, CUDA 13.0, driver 580.159.04). Here, after
# scripts/demo.sh:
scripts/gpu-check.sh pack .gpu-check
# carry .gpu-check and the repository to the GPU machine, then there:
scripts/gpu-check.sh run .gpu-check /tmp/gc-out
# back here, for each point:
for p in seed agents16; do /usr/bin/python3 bench/plot_bench.py bench/results/gpu-check/$p \
  --command "scripts/gpu-check.sh run (bench/results/gpu-check/command.sh)"; done
