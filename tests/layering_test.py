#!/usr/bin/env python3
"""Layers that read top-down: which directory's headers each directory includes.

    layering_test.py SOURCE_DIR

Public headers (include/swarmkv/) are the library's API: anyone may include
them, and they include only each other. A directory under src/ includes its
own headers and those of the shared layers below it listed in ALLOWED; a
front-end (server/, cluster/) never reaches into pipeline/. tools/ sees the
public API only. docs/architecture.md ("Layers") draws the same table.
"""
import pathlib
import re
import sys

# src/<dir> -> the src/ directories whose headers it may include.
ALLOWED = {
    "common": set(),
    "engine": {"engine"},
    "kv": {"kv"},
    "snapshot": set(),
    "prefix": {"prefix"},
    "pipeline": {"kv", "prefix", "pipeline"},
    "redis": set(),
    "cluster": {"cluster"},
    "server": {"kv", "prefix", "server"},
    "run_page": set(),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(path):
    return INCLUDE.findall(path.read_text(encoding="utf-8"))


def main():
    root = pathlib.Path(sys.argv[1])
    problems = []
    src_dirs = {p.name for p in (root / "src").iterdir() if p.is_dir()}
    for unknown in sorted(src_dirs - ALLOWED.keys()):
        problems.append(f"src/{unknown}/ is not in the layer table (tests/layering_test.py, "
                        "docs/architecture.md)")
    for header in sorted((root / "include/swarmkv").glob("*.h")):
        for inc in includes(header):
            if not inc.startswith("swarmkv/"):
                problems.append(f"{header.relative_to(root)} includes \"{inc}\": a public "
                                "header includes only public headers")
    for source in sorted((root / "src").rglob("*")):
        if source.suffix not in (".h", ".cpp"):
            continue
        layer = source.relative_to(root / "src").parts[0]
        for inc in includes(source):
            top = inc.split("/")[0] if "/" in inc else None
            if top is None or top == "swarmkv":
                continue
            if top not in ALLOWED.get(layer, set()):
                problems.append(f"{source.relative_to(root)} includes \"{inc}\": src/{layer}/ "
                                f"may include only {sorted(ALLOWED.get(layer, set())) or 'public headers'}")
    for source in sorted((root / "tools").rglob("*")):
        if source.suffix not in (".h", ".cpp"):
            continue
        for inc in includes(source):
            top = inc.split("/")[0] if "/" in inc else None
            if top is not None and top != "swarmkv":
                problems.append(f"{source.relative_to(root)} includes \"{inc}\": tools/ sees "
                                "the public API only")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layers")
        return 1
    print("layers hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
