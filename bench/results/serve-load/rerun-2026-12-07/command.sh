#!/bin/sh
# from the repository root. This run: 2026-12-07, main at 4dc9846 (after the
# "waiting slot is a prefix source" fix of issue 59), a 2-core AMD EPYC with
# AVX2 and no AVX-512, nothing else running; one trial per arm (the first
# run, in the folder above: 3 trials on the Intel AVX-512 machine of that day).
/usr/bin/python3 bench/serve_load.py --bin build/release/swarmkv --trials 1 --out bench/results/serve-load/rerun-2026-12-07
# the report and plot again from results.json:
# /usr/bin/python3 bench/serve_load.py --bin build/release/swarmkv --out bench/results/serve-load/rerun-2026-12-07 --report-only
