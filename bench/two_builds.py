"""What the benches that time one swarmkv binary on two builds of llama.cpp
share (bench/prefix_attention.py, bench/streaming_prefill.py): their common
arguments, the command.sh that reproduces a run, and the environment that
points the binary at one build's lib/ folder (its RUNPATH overridden with
LD_LIBRARY_PATH).
"""
import argparse
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def arguments(default_out):
    """--bin, --before-lib, --after-lib, --out (default bench/results/DEFAULT_OUT), --trials."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--before-lib", required=True)
    ap.add_argument("--after-lib", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", default_out))
    ap.add_argument("--trials", type=int, default=3)
    return ap


def start(a):
    """OUT/plots/, and OUT/command.sh: this run's command line, from the repository root."""
    os.makedirs(os.path.join(a.out, "plots"), exist_ok=True)
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    with open(os.path.join(a.out, "command.sh"), "w") as f:
        f.write(f"#!/bin/sh\n# from the repository root\n/usr/bin/python3 {script} "
                + " ".join(shlex.quote(x) for x in sys.argv[1:]) + "\n")


def environment(lib, base=None):
    """`base` (default: this process's environment) with the build in `lib` first."""
    return dict(os.environ if base is None else base, LD_LIBRARY_PATH=lib)
