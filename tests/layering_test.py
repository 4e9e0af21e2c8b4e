#!/usr/bin/env python3
"""Layers that read top-down: which layer's headers each file includes.

    layering_test.py SOURCE_DIR
    layering_test.py --self-test SOURCE_DIR   (each include in INJECTED is caught)

Each directory under src/ is a layer with a rank (RANK). A layer includes
its own headers, the private headers of the layers listed in PRIVATE, and
the public headers (include/swarmkv/) owned by a layer of lower rank: never
one above it nor a sibling of the same rank. A public header's owner is the
layer that implements it: the src/ folder holding a .cpp of the header's
name (engine.h: src/engine/engine.cpp), else the src/ folder of that name
(snapshot.h: src/snapshot/). Public headers include only each other, by the
same rule. tools/ sees the public API only. llama.cpp's headers (llama.h,
ggml*.h, gguf.h), "..." or <...>, are included in src/engine/ only, and by
the kernel tests in LLAMA_HEADERS_ALSO. docs/architecture.md ("Layers")
draws the same table.
"""
import pathlib
import re
import sys

# src/<dir> -> its rank: a layer includes the public headers of lower ranks only.
RANK = {
    "common": 0,
    "engine": 1,
    "redis": 1,
    "kv": 2,
    "snapshot": 2,
    "prefix": 3,
    "pipeline": 4,
    "run_page": 5,
    "corpus": 5,
    "cluster": 6,
    "server": 6,
}

# src/<dir> -> the src/ directories whose private headers it may include.
PRIVATE = {
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
    "corpus": {"corpus"},
}

# Files outside src/engine/ that may include llama.cpp's headers: the kernel
# tests drive ggml's kernels directly.
LLAMA_HEADERS_ALSO = {"tests/attention_kernel_test.cpp", "tests/matmul_kernel_test.cpp"}
LLAMA_HEADER = re.compile(r"(?:^|/)(?:llama[^/]*|ggml[^/]*|gguf)\.h$")

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".c")


def includes(path):
    """(quoted, name) for each #include in the file: quoted is True for "...", False for <...>."""
    return [(q == '"', name) for q, name in INCLUDE.findall(path.read_text(encoding="utf-8"))]


def sources(root, folder):
    return [p for p in sorted((root / folder).rglob("*")) if p.suffix in SOURCE_SUFFIXES]


def public_owners(root, problems):
    """include/swarmkv/<name>.h -> the src/ layer that implements it."""
    cpp_dirs = {}
    for cpp in (root / "src").rglob("*.cpp"):
        cpp_dirs.setdefault(cpp.stem, set()).add(cpp.relative_to(root / "src").parts[0])
    owners = {}
    for header in sorted((root / "include/swarmkv").glob("*.h")):
        stem = header.stem
        dirs = cpp_dirs.get(stem, set())
        if len(dirs) == 1:
            owners[header.name] = next(iter(dirs))
        elif not dirs and stem in RANK:
            owners[header.name] = stem
        else:
            where = f"src/*/{stem}.cpp in {sorted(dirs)}" if dirs else f"no src/*/{stem}.cpp, no src/{stem}/"
            problems.append(f"include/swarmkv/{header.name}: no one owning layer ({where}); name it "
                            "after the .cpp or the src/ folder that implements it")
    return owners


def check_public(inc, layer, owners, where, problems):
    """An include of swarmkv/<name>.h from a file of `layer` (for a public header: its owner's)."""
    name = inc.split("/", 1)[1]
    owner = owners.get(name)
    if owner is None:
        return  # an unknown header is the compiler's to report; an unowned one public_owners' to
    if owner != layer and RANK[owner] >= RANK[layer]:
        problems.append(f"{where} includes \"{inc}\" (owned by src/{owner}/, rank {RANK[owner]}): "
                        f"src/{layer}/ (rank {RANK[layer]}) includes public headers of lower ranks only")


def check_llama(root, problems):
    for folder in ("include", "src", "tools", "tests", "bench", "examples"):
        if not (root / folder).is_dir():
            continue
        for source in sources(root, folder):
            rel = source.relative_to(root).as_posix()
            if rel.startswith("src/engine/") or rel in LLAMA_HEADERS_ALSO:
                continue
            for quoted, inc in includes(source):
                if LLAMA_HEADER.search(inc):
                    shown = f'"{inc}"' if quoted else f"<{inc}>"
                    problems.append(f"{rel} includes {shown}: only src/engine/ includes llama.cpp's headers")


def check_src(root, owners, problems):
    for source in sources(root, "src"):
        layer = source.relative_to(root / "src").parts[0]
        if layer not in RANK:
            continue  # reported once as a layer missing from the table
        where = source.relative_to(root).as_posix()
        for quoted, inc in includes(source):
            if not quoted or "/" not in inc:
                continue
            top = inc.split("/")[0]
            if top == "swarmkv":
                check_public(inc, layer, owners, where, problems)
            elif top not in PRIVATE[layer]:
                problems.append(f"{where} includes \"{inc}\": src/{layer}/ may include only "
                                f"{sorted(PRIVATE[layer]) or 'public headers'}")


def check(root):
    """Every include against the layers: a list of problems, one line each."""
    problems = []
    for layer, others in PRIVATE.items():
        for other in sorted(others - {layer}):
            if RANK[other] >= RANK[layer]:
                problems.append(f"tests/layering_test.py: PRIVATE lets src/{layer}/ include src/{other}/, "
                                "which is not below it in RANK")
    src_dirs = {p.name for p in (root / "src").iterdir() if p.is_dir()}
    for unknown in sorted(src_dirs - RANK.keys()):
        problems.append(f"src/{unknown}/ is not in the layer table (tests/layering_test.py, "
                        "docs/architecture.md)")
    owners = public_owners(root, problems)
    for header in sorted((root / "include/swarmkv").glob("*.h")):
        for quoted, inc in includes(header):
            if not quoted:
                continue
            if not inc.startswith("swarmkv/"):
                problems.append(f"{header.relative_to(root)} includes \"{inc}\": a public "
                                "header includes only public headers")
            elif header.name in owners:
                check_public(inc, owners[header.name], owners, header.relative_to(root).as_posix(), problems)
    check_src(root, owners, problems)
    for source in sources(root, "tools"):
        for quoted, inc in includes(source):
            top = inc.split("/")[0] if quoted and "/" in inc else None
            if top is not None and top != "swarmkv":
                problems.append(f"{source.relative_to(root)} includes \"{inc}\": tools/ sees "
                                "the public API only")
    check_llama(root, problems)
    return problems, owners


# (file, line added at its top, what the report must then say): each must be caught.
INJECTED = [
    ("src/kv/step_composer.cpp", '#include "swarmkv/pipeline.h"',
     'src/kv/step_composer.cpp includes "swarmkv/pipeline.h" (owned by src/pipeline/'),
    ("src/server/server.cpp", '#include "swarmkv/cluster.h"',
     'src/server/server.cpp includes "swarmkv/cluster.h" (owned by src/cluster/'),
    ("include/swarmkv/snapshot.h", '#include "swarmkv/pipeline.h"',
     'include/swarmkv/snapshot.h includes "swarmkv/pipeline.h" (owned by src/pipeline/'),
    ("src/pipeline/pipeline.cpp", "#include <llama.h>",
     "src/pipeline/pipeline.cpp includes <llama.h>: only src/engine/"),
    ("tools/swarmkv/cli.cpp", '#include "llama.h"', 'tools/swarmkv/cli.cpp includes "llama.h": only src/engine/'),
    ("include/swarmkv/engine.h", "#include <ggml-cpu.h>", "include/swarmkv/engine.h includes <ggml-cpu.h>"),
    ("include/swarmkv/unowned.h", "#pragma once", "include/swarmkv/unowned.h: no one owning layer"),
]


def self_test(root):
    """Copies the tree's sources to a scratch folder and injects each of INJECTED in turn: the
    check must report it (beside whatever the tree itself already breaks)."""
    import shutil
    import tempfile
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = pathlib.Path(tmp)
        for folder in ("include", "src", "tools", "tests"):
            shutil.copytree(root / folder, scratch / folder,
                            ignore=lambda d, names: [n for n in names if (pathlib.Path(d) / n).is_file()
                                                     and not n.endswith(SOURCE_SUFFIXES)])
        before = set(check(scratch)[0])
        for rel, line, expected in INJECTED:
            path = scratch / rel
            original = path.read_text(encoding="utf-8") if path.exists() else None
            path.write_text(line + "\n" + (original or ""), encoding="utf-8")
            found = [p for p in check(scratch)[0] if p not in before]
            if original is None:
                path.unlink()
            else:
                path.write_text(original, encoding="utf-8")
            if any(expected in p for p in found):
                print(f"caught: {rel} + {line}: {found[0]}")
            else:
                failed += 1
                print(f"MISSED: {rel} + {line}: expected \"{expected}...\", got {found}")
    print(f"{len(INJECTED) - failed} of {len(INJECTED)} injected includes caught")
    return 1 if failed else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        return self_test(pathlib.Path(sys.argv[2]))
    problems, owners = check(pathlib.Path(sys.argv[1]))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layers")
        return 1
    print(f"layers hold ({len(owners)} public headers, each owned by one layer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
