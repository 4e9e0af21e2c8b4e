"""What a bench writes: the command that reproduces it, JSON, CSV and Markdown tables."""
import argparse
import csv
import json
import os
import re
import shlex
import sys

from . import ROOT


def invocation(python="/usr/bin/python3", argv=None):
    """This run's command line, from the repository root: python, the script, its arguments
    (argv, default sys.argv[1:]), each quoted for the shell."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return shlex.join([python, script, *(sys.argv[1:] if argv is None else argv)])


def write_command(out, name="command.sh", note="from the repository root", python="/usr/bin/python3",
                  argv=None):
    """OUT/name: a shell script (a `#` note, then invocation()) that reproduces this run. A name
    ending in .txt gets the command line alone. Returns the command line."""
    line = invocation(python, argv)
    with open(os.path.join(out, name), "w") as f:
        f.write(line + "\n" if name.endswith(".txt") else f"#!/bin/sh\n# {note}\n{line}\n")
    return line


def results_arguments():
    """A report script's command line, OUT_DIR [--notes ANALYSIS.md]: (the parsed arguments,
    OUT_DIR/results.json read)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--notes", default="")
    args = ap.parse_args()
    with open(os.path.join(args.out, "results.json")) as f:
        return args, json.load(f)


def write_json(path, obj, indent=1):
    """obj as JSON at path, written whole or not at all (a temporary file renamed over it), so that
    an interrupted run leaves the last complete results."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)
    os.replace(tmp, path)


def write_csv(path, header, rows):
    """A CSV file: the header row, then rows (lists, or dicts keyed by the header's names)."""
    with open(path, "w", newline="") as f:
        if rows and isinstance(rows[0], dict):
            w = csv.DictWriter(f, fieldnames=list(header))
            w.writeheader()
        else:
            w = csv.writer(f)
            w.writerow(header)
        w.writerows(rows)


def md_table(head, rows):
    """A Markdown table: head's cells, then one row per list of cells; as a list of lines."""
    return (["| " + " | ".join(str(h) for h in head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def reproduce(out, name="command.txt"):
    """A report's "Reproduce:" block: OUT/name (the command line write_command wrote) as a shell code
    block; as a list of lines, none when there is no such file."""
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return ["Reproduce:", "", "```sh", f.read().strip(), "```", ""]


def prometheus(text, name):
    """The value of the metric `name` (any labels) in Prometheus text, or None."""
    for line in text.splitlines():
        m = re.match(re.escape(name) + r"(?:\{[^}]*\})? ([0-9.e+]+)$", line.strip())
        if m:
            return float(m.group(1))
    return None
