"""Trials: the arms' order, medians and percentiles, and commands that must succeed."""
import os
import statistics
import subprocess
import sys
import time


def alternate(items, trial):
    """items in their order on even trials, reversed on odd ones: no arm always runs first."""
    return list(items) if trial % 2 == 0 else list(reversed(items))


def median(xs):
    """The median of the values that are not None; None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(xs, q):
    """The q-th percentile (0..100) of xs, linearly interpolated between the two nearest ranks."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def log(msg):
    """msg on stderr with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def shown(cmd, n=None):
    """cmd for a log line: the program's base name, then (the first n of) its arguments."""
    return " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd[:n]))


def run(cmd, timeout=3600, env=None, quiet=False):
    """Runs cmd (output captured, text); exits the script with its stderr's tail when it fails.
    Logs its time unless quiet. Returns the CompletedProcess."""
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    if not quiet:
        log(f"{time.time() - t:6.1f} s  {shown(cmd, 6)}")
    return p
