#!/bin/sh
# from the repository root
/usr/bin/python3 bench/structured.py build/release/swarmkv /root/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf bench/results/structured --trials 3
