"""Every shell command of README.md runs, in order, as written.

The fenced ```sh and ```bash blocks of the README run as one bash session
(`set -euo pipefail`; a later block may use what an earlier one made or
exported) with the repository as working directory, in a clean temporary
HOME whose ~/.cache/swarmkv/models holds symlinks to the models already in
the real cache ($SWARMKV_CACHE, else $XDG_CACHE_HOME/swarmkv, else
~/.cache/swarmkv, as scripts/lib.sh finds it). No SWARMKV_* variable of the
caller's reaches the blocks. The test fails when a command fails; the
message names the block and its README line.

A block may carry one marker on the line right before its fence, visible in
the README's source:

  <!-- readme-test: skip (REASON) -->   the block does not run here (it
      installs system packages, takes too long, needs another machine);
      the test prints it with its reason.
  <!-- readme-test: env NAME=VALUE ... --> the block runs with these
      variables exported; VALUE `free-port` is a free loopback TCP port.
      The README's commands read them with a default (${PORT:-8080}), so
      they stay copy-pasteable.
  <!-- readme-test: save PATH -->        on a non-shell block (a pipeline
      file the text asks the reader to save): written to PATH (~ is the
      temporary HOME) at its place in the sequence.

Any other marker, or a marker on a block it does not fit, is an error.
Everything the blocks start is stopped at the end (a trap in the session,
then the whole process group); every wait is bounded (the session's
timeout, and the blocks' own).

usage: readme_blocks_test.py SOURCE_DIR [README] [--timeout SECONDS]
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MARKER = re.compile(r"^<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
SHELLS = {"sh", "bash"}


class Block:
    def __init__(self, index, line, lang, text, marker):
        self.index, self.line, self.lang, self.text, self.marker = index, line, lang, text, marker

    def where(self):
        return f"README block {self.index} (line {self.line}, {self.lang or 'no language'})"


def parse(readme_path):
    """The README's fenced blocks with the marker on the line before each."""
    with open(readme_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            sys.exit(f"{readme_path}:{start + 1}: a ``` fence that never closes")
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        blocks.append(Block(len(blocks) + 1, start + 1, lang, "\n".join(lines[start + 1:j]),
                            (marker.group(1), marker.group(2)) if marker else None))
        i = j + 1
    attached = {b.line - 1 for b in blocks if b.marker}
    for n, text in enumerate(lines, 1):
        if "readme-test" in text and not MARKER.match(text):
            sys.exit(f"{readme_path}:{n}: a readme-test marker this test does not read: {text!r}")
        if MARKER.match(text) and n not in attached:
            sys.exit(f"{readme_path}:{n}: a readme-test marker not on the line right before a fence")
    return blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script_for(blocks):
    """One bash script: every runnable block in order, with its env and a banner."""
    out = [
        "set -euo pipefail",
        "readme_where='the set-up'",
        "trap 'echo \"readme-test: $readme_where failed (exit status $?)\" >&2' ERR",
        "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
    ]
    skipped, ports = [], set()
    for b in blocks:
        kind, arg = b.marker if b.marker else (None, "")
        if kind not in (None, "skip", "env", "save"):
            sys.exit(f"{b.where()}: unknown marker 'readme-test: {kind}'")
        if b.lang not in SHELLS:
            if kind == "save":
                if not re.fullmatch(r"~?[\w./-]+", arg):
                    sys.exit(f"{b.where()}: save needs one plain path, not {arg!r}")
                delim = "README_TEST_EOF"
                if delim in b.text:
                    sys.exit(f"{b.where()}: the block holds {delim}")
                where = f"{b.where()}, saved to {arg}"
                out += [f"readme_where={shlex.quote(where)}",
                        f"echo {shlex.quote('### ' + where)}",
                        f"mkdir -p \"$(dirname {arg})\"",
                        f"cat >{arg} <<'{delim}'", b.text, delim]
            elif kind is not None:
                sys.exit(f"{b.where()}: 'readme-test: {kind}' on a block that is not sh/bash")
            continue
        if kind == "save":
            sys.exit(f"{b.where()}: 'readme-test: save' on a shell block")
        if kind == "skip":
            reason = re.fullmatch(r"\((.+)\)", arg)
            if not reason:
                sys.exit(f"{b.where()}: skip needs a reason in brackets, not {arg!r}")
            skipped.append((b, reason.group(1)))
            continue
        env = []
        if kind == "env":
            for pair in arg.split():
                name, sep, value = pair.partition("=")
                if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
                    sys.exit(f"{b.where()}: env wants NAME=VALUE pairs, not {pair!r}")
                if value == "free-port":
                    port = free_port()
                    while port in ports:
                        port = free_port()
                    ports.add(port)
                    value = str(port)
                env.append(f"export {name}={shlex.quote(value)}")
        where = b.where()
        out += [f"readme_where={shlex.quote(where)}",
                f"echo {shlex.quote('### ' + where)}" + (f" {shlex.quote('with ' + ' '.join(e[7:] for e in env))}"
                                                         if env else ""),
                "readme_t0=${EPOCHREALTIME//[.,]/}", *env, b.text,
                "readme_dt=$(( ${EPOCHREALTIME//[.,]/} - readme_t0 ))",
                f"echo \"### {where}: done in $((readme_dt / 1000000)).$((readme_dt / 100000 % 10)) s\""]
    out.append("echo '### every README block ran'")
    return "\n".join(out) + "\n", skipped


def real_cache():
    if os.environ.get("SWARMKV_CACHE"):
        return os.environ["SWARMKV_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "swarmkv")


def clean_env(home):
    real_local_bin = os.path.join(os.path.expanduser("~"), ".local", "bin")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWARMKV_", "XDG_", "OPENAI_")) and k not in ("PORT", "REDIS_PORT")}
    env["HOME"] = home
    # A pyenv python3 on PATH finds its versions under $PYENV_ROOT, by
    # default in the real HOME: the machine's Python, not the user's state.
    pyenv = os.path.join(os.path.expanduser("~"), ".pyenv")
    if "PYENV_ROOT" not in env and os.path.isdir(pyenv):
        env["PYENV_ROOT"] = pyenv
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                  if p and os.path.realpath(p) != os.path.realpath(real_local_bin))
    return env


def stop_group(proc):
    """SIGTERM to everything the session started, SIGKILL what is left after 15 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("readme", nargs="?")
    ap.add_argument("--timeout", type=float, default=540)
    args = ap.parse_args()
    source = os.path.abspath(args.source)
    readme = os.path.abspath(args.readme or os.path.join(source, "README.md"))

    blocks = parse(readme)
    script, skipped = script_for(blocks)
    for b, reason in skipped:
        first = b.text.strip().split("\n")[0]
        print(f"skipped: {b.where()}: {reason}\n    {first}")

    models = os.path.join(real_cache(), "models")
    if not os.path.isfile(os.path.join(models, "SmolLM2-135M-Instruct.F16.gguf")):
        sys.exit(f"no default model in {models}: run scripts/fetch-model.sh first")
    home = tempfile.mkdtemp(prefix="swarmkv-readme-home-")
    t0 = time.monotonic()
    try:
        cache_models = os.path.join(home, ".cache", "swarmkv", "models")
        os.makedirs(cache_models)
        for name in os.listdir(models):
            if name.endswith(".gguf"):
                os.symlink(os.path.realpath(os.path.join(models, name)), os.path.join(cache_models, name))
        script_path = os.path.join(home, "readme-blocks.sh")
        with open(script_path, "w", encoding="utf-8") as f:
            f.write(script)
        proc = subprocess.Popen(["bash", "--noprofile", "--norc", script_path], cwd=source,
                                env=clean_env(home), stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            ended = time.monotonic()
            stop_group(proc)
            proc.wait()
            print(f"readme-test: the session ended after {ended - t0:.1f} s; "
                  f"what it left running stopped in {time.monotonic() - ended:.1f} s")
    finally:
        removing = time.monotonic()
        shutil.rmtree(home, ignore_errors=True)  # the venv's thousands of files: seconds on a slow disk
        print(f"readme-test: removed the temporary HOME in {time.monotonic() - removing:.1f} s")
    took = time.monotonic() - t0
    if rc is None:
        sys.exit(f"FAIL: the README's blocks did not finish within {args.timeout:.0f} s")
    if rc != 0:
        sys.exit(f"FAIL: a README command failed (exit status {rc}; the block is named above), "
                 f"after {took:.1f} s")
    print(f"PASS: {len(blocks)} blocks, {len(skipped)} skipped, in {took:.1f} s")


if __name__ == "__main__":
    main()
