#!/bin/sh
# from the repository root
/usr/bin/python3 bench/prefix_attention.py --bin build/release/swarmkv --before-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-pc5ecc5379fcd-cpu10925ebed585/install/lib --after-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-p74b1dab9c712-cpu10925ebed585/install/lib --out bench/results/prefix-attention/avx512-2026-12-07 --trials 3
