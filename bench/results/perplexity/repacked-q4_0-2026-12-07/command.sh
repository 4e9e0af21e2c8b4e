#!/bin/sh
# from the repository root
/usr/bin/python3 bench/perplexity.py --weights SmolLM2-135M:F16,SmolLM2-135M:Q4_0 --arms exact,stock --out bench/results/perplexity/repacked-q4_0-2026-12-07
