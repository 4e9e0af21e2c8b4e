"""The Redis snapshot bus against the prefill it saves, in one run.

Sections (each written to OUT/results.json as soon as it is measured):

  loopback   its own redis-server on 127.0.0.1, swarmkv_bus_bench on the
             document's snapshot: publish and fetch MB/s;
  links      two network namespaces joined by a veth pair, `tc ... tbf` on
             both ends at each --links rate (plus the veth without a qdisc):
             redis-server in namespace A, swarmkv_bus_bench in namespace B;
  breakeven  `swarmkv prefill` of synthetic documents of several lengths:
             prefill time and snapshot bytes per token (the file's size),
             and each snapshot's fetch over loopback; the report divides the
             bytes by each link's measured throughput to find where fetching
             beats prefilling;
  e2e        a pipeline of --agents agents over the README's document: a
             local `swarmkv run --fork shared`, and `run --redis` with one
             worker (-t 2) and with two (-t 1 each), arms interleaved per
             trial; the workers' stores are fresh per arm, so each arm's
             first trial fetches the snapshot and the later ones find it in
             their store (--e2e-cold: every trial fetches).

Everything this script starts (redis-servers, workers, namespaces, the veth
pair) is removed at the end, on an error and on Ctrl-C / SIGTERM. Nothing
talks to an address outside loopback and the two namespaces. Needs root
(ip netns, tc) for `links`.

usage: python3 bench/cluster_transfer.py [--out bench/results/cluster-transfer]
           [--build build/release] [--trials 5] [--resume] [--quick]

The binaries are copied to a private folder first, so a rebuild of --build
during the run changes nothing. Writes OUT/results.json (every sample),
OUT/<section>.csv, OUT/command.txt; then bench/plot_cluster_transfer.py
draws OUT/plots and writes OUT/report.md.
"""
import argparse
import atexit
import csv
import hashlib
import json
import math
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

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import ROOT as REPO  # noqa: E402
from swarmbench.ports import free_port  # noqa: E402
from swarmbench.servers import NotReady, Process, redis_ping  # noqa: E402
from swarmbench.trials import alternate as order, log, median  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = ("loopback", "links", "breakeven", "e2e")

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--out", default=os.path.join("bench", "results", "cluster-transfer"))
ap.add_argument("--build", default=os.path.join("build", "release"),
                help="folder with swarmkv and bench/swarmkv_bus_bench (or both side by side)")
ap.add_argument("--model", default=os.environ.get("SWARMKV_MODEL") or os.path.expanduser(
    "~/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf"))
ap.add_argument("--trials", type=int, default=None, help="trials per arm (default 5; --quick 1)")
ap.add_argument("--slow-trials", type=int, default=2,
                help="trials on links at or below 10 Mbit/s (an ~80 MB snapshot takes ~70 s each way there)")
ap.add_argument("--quick", action="store_true",
                help="smoke sizes: 512-token snapshot, links 100mbit,1gbit, lengths 256,512, 4 agents, 1 trial")
ap.add_argument("--doc-tokens", type=int, default=None, help="the snapshot of loopback/links (default 3501)")
ap.add_argument("--links", default=None, help="tbf rates (default 10mbit,100mbit,1gbit,10gbit)")
ap.add_argument("--lengths", default=None, help="break-even document lengths (default 512,1024,2048,3501,7000)")
ap.add_argument("--agents", type=int, default=None, help="e2e agents (default 16; --quick 4)")
ap.add_argument("--max-tokens", type=int, default=None, help="e2e tokens per agent (default 32; --quick 16)")
ap.add_argument("--threads", type=int, default=2, help="threads of the local run, the coordinator and the "
                                                        "one worker (the two workers get half each)")
ap.add_argument("--e2e-cold", action="store_true",
                help="every e2e trial starts from an empty bus and empty worker stores (default: only "
                     "each arm's first)")
ap.add_argument("--kv-type", default="f16", choices=("f16", "q8_0"),
                help="the K/V type of every prefill and run (bench/cluster_q8.py runs q8_0)")
ap.add_argument("--chunk-bytes", type=int, default=0, help="bus chunk size (0 = the bus's default)")
ap.add_argument("--pipeline", default=os.path.join(REPO, "examples", "pipelines", "apache-license.yaml"))
ap.add_argument("--skip", default="", help="comma list of sections to skip: " + ",".join(SECTIONS))
ap.add_argument("--resume", action="store_true",
                help="keep the sections OUT/results.json already holds and measure only the others")
ap.add_argument("--keep-work", action="store_true", help="keep the work folder (snapshots, logs)")
ap.add_argument("--no-plot", action="store_true")
args = ap.parse_args()

quick = args.quick
trials = args.trials if args.trials is not None else (1 if quick else 5)
doc_tokens = args.doc_tokens or (512 if quick else 3501)
links = [x for x in (args.links or ("100mbit,1gbit" if quick else "10mbit,100mbit,1gbit,10gbit")).split(",") if x]
lengths = [int(x) for x in (args.lengths or ("256,512" if quick else "512,1024,2048,3501,7000")).split(",") if x]
n_agents = args.agents or (4 if quick else 16)
max_tokens = args.max_tokens or (16 if quick else 32)
skip = set(filter(None, args.skip.split(",")))
unknown = skip - set(SECTIONS)
if unknown:
    sys.exit(f"--skip: unknown section(s) {', '.join(sorted(unknown))}")
if trials < 1 or args.slow_trials < 1:
    sys.exit("--trials and --slow-trials must be >= 1")
if not os.path.isfile(args.model):
    sys.exit(f"no model at {args.model} (scripts/fetch-model.sh smollm2-f16, or --model / $SWARMKV_MODEL)")

PID = os.getpid()
NS_A, NS_B = f"swkv-a-{PID}", f"swkv-b-{PID}"
VETH_A, VETH_B = f"swkva{PID}", f"swkvb{PID}"  # at most 15 characters
ADDR_A, ADDR_B = "10.213.0.1", "10.213.0.2"


# ---------------------------------------------------------------- resources
class Resources:
    """Every process and namespace this run made; cleanup() removes them all, once."""

    def __init__(self):
        self.procs = []  # (Popen, name, log path)
        self.netns = []
        self.work = None
        self.done = False

    def spawn(self, cmd, name, log_path, env=None):
        # Own session: a terminal's Ctrl-C reaches this script only, and the
        # cleanup stops the children in order (workers get SIGTERM and drain).
        p = Process(cmd, log_path, env=env, new_session=True, name=name)
        self.procs.append((p, name, log_path))
        return p

    def stop(self, p, timeout=30.0, sig=signal.SIGTERM):
        """Signal p and wait; SIGKILL after timeout. Returns (exit status, seconds, killed)."""
        t = time.time()
        rc, killed = p.stop(timeout, sig)
        self.procs = [x for x in self.procs if x[0] is not p]
        return rc, time.time() - t, killed

    def cleanup(self):
        if self.done:
            return
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            for p, name, _ in reversed(list(self.procs)):
                rc, _, killed = self.stop(p, timeout=15)
                log(f"cleanup: stopped {name} (pid {p.pid}, exit {rc}{', killed' if killed else ''})")
            for ns in list(self.netns):
                delete_netns(ns)
            for link in (VETH_A, VETH_B):  # only there if a step failed between creating and moving it
                if quiet(["ip", "link", "show", link]).returncode == 0:
                    quiet(["ip", "link", "del", link])
            left = [n for n in quiet(["ip", "netns", "list"]).stdout.split() if n in (NS_A, NS_B)]
            if left:
                log(f"warning: namespace(s) {', '.join(left)} still there; remove with: ip netns del NAME")
            if self.work and not args.keep_work:
                shutil.rmtree(self.work, ignore_errors=True)
            elif self.work:
                log(f"work folder kept: {self.work}")
            self.done = True
        finally:
            for s, h in old.items():
                signal.signal(s, h)


R = Resources()
atexit.register(R.cleanup)


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# SIGINT too: a shell starts a background job with SIGINT ignored, and Python then keeps it ignored.
for _s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_s, on_signal)


def delete_netns(ns):
    pids = quiet(["ip", "netns", "pids", ns]).stdout.split()
    for pid in pids:  # only processes this script started live in its namespaces
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    quiet(["ip", "netns", "del", ns])
    if ns in R.netns:
        R.netns.remove(ns)
    log(f"cleanup: namespace {ns} deleted")


# ---------------------------------------------------------------- helpers
def quiet(cmd, timeout=30):
    """A short command whose failure is not an error (cleanup, probes): its CompletedProcess, or one with
    returncode -1 when it timed out."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -1, "", "timed out")


def run(cmd, timeout, what=None, check=True):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                       env=ENV)
    shown = what or " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))
    if check and p.returncode != 0:
        raise RuntimeError(f"{shown} exited {p.returncode}:\n{p.stderr[-3000:]}{p.stdout[-1000:]}")
    log(f"[{time.time() - t:6.1f} s] {shown}")
    return p


BUSY = 0.25  # cores busy with other processes above which a measurement is flagged


def busy_cores(window=0.5):
    """Cores busy over `window` seconds while this script waits (nothing of its own runs): other processes'
    load, from /proc/stat."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v[:8]), idle
    t0, i0 = sample()
    time.sleep(window)
    t1, i1 = sample()
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(1, t1 - t0))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Resp:
    """Just enough of a Redis client for setup and checks (loopback only)."""

    def __init__(self, port, db=0, timeout=10):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.f = self.s.makefile("rb")
        if db:
            self.cmd("SELECT", db)

    def cmd(self, *words):
        out = [f"*{len(words)}\r\n".encode()]
        for w in words:
            b = w if isinstance(w, bytes) else str(w).encode()
            out += [f"${len(b)}\r\n".encode(), b, b"\r\n"]
        self.s.sendall(b"".join(out))
        return self._read()

    def _read(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError(f"redis: unexpected reply {line!r}")

    def close(self):
        self.f.close()
        self.s.close()


def start_redis(name, bind, port, netns=None):
    d = os.path.join(R.work, name)
    os.makedirs(d, exist_ok=True)
    cmd = ["redis-server", "--bind", bind, "--port", str(port), "--save", "", "--appendonly", "no",
           "--daemonize", "no", "--dir", d, "--logfile", ""]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd + ["--protected-mode", "no"]
    log_path = os.path.join(d, "redis.log")
    p = R.spawn(cmd, f"redis-server {name}", log_path, env=ENV)

    def ready():
        if not netns:
            return redis_ping(port)()
        try:
            return subprocess.run(["ip", "netns", "exec", NS_B, "redis-cli", "-h", bind, "-p", str(port), "ping"],
                                  capture_output=True, text=True, timeout=5).stdout.strip() == "PONG"
        except subprocess.TimeoutExpired:
            return False
    try:
        p.wait_ready(ready, 20)
    except NotReady as e:
        raise RuntimeError(f"{e}:\n{tail(log_path)}") from None
    log(f"redis-server {name} (pid {p.pid}) ready at {bind}:{port}{' in ' + netns if netns else ''}")
    return p


def tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def bus_bench(url, file, n, netns=None, expect_mb_s=None):
    cmd = [BUS_BENCH, "--redis", url, "--file", file, "--trials", str(n)]
    if args.chunk_bytes:
        cmd += ["--chunk-bytes", str(args.chunk_bytes)]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    size = os.path.getsize(file)
    # Both directions of every trial at the expected rate, three times over, plus a minute.
    timeout = 60 + (3 * 2 * n * size / 1e6 / expect_mb_s if expect_mb_s else 60 * n)
    p = run(cmd, timeout=timeout, what=f"swarmkv_bus_bench {url} {os.path.basename(file)} x{n}"
                                       + (f" (in {netns})" if netns else ""))
    return json.loads(p.stdout)


# ---------------------------------------------------------------- documents and snapshots
WORDS = "The quick brown fox jumps over the lazy dog".split()


def units(n):
    """n pieces of the seed's phrase that are one SmolLM2 token each: 'The', ' quick', ..., ' dog', '.'."""
    out = []
    while len(out) < n:
        for w in WORDS:
            out.append(("" if not out else " ") + w)
        out.append(".")
    return "".join(out[:n])


OVERHEAD = None  # prefix tokens that are not the document's: system prompt, chat template


def prefill(doc_path, snap_path):
    """swarmkv prefill of a plain document (default system prompt, chat template), snapshot store off."""
    p = run([SWARMKV, "prefill", doc_path, "--model", args.model, "--out", snap_path, "--snapshot-cache", "off",
             "--json", "-t", str(args.threads), "--kv-type", args.kv_type], timeout=1800)
    r = json.loads(p.stdout)
    return {"prefill_ms": r["prefill_ms"], "prefix_tokens": r["prefix_tokens"], "export_ms": r.get("export_ms"),
            "write_ms": r.get("write_ms"), "file_bytes": os.path.getsize(snap_path),
            "snapshot_bytes": r["snapshot"]["bytes"]}


def make_document(tokens, name):
    """A synthetic document whose prefill has exactly `tokens` prefix tokens; its first prefill."""
    global OVERHEAD
    doc = os.path.join(R.work, f"{name}.txt")
    snap = os.path.join(R.work, f"{name}.swkv")
    if OVERHEAD is None:
        open(doc, "w").write(units(16))
        OVERHEAD = prefill(doc, snap)["prefix_tokens"] - 16
    n = max(1, tokens - OVERHEAD)
    for _ in range(4):
        open(doc, "w").write(units(n))
        r = prefill(doc, snap)
        if r["prefix_tokens"] == tokens or tokens - OVERHEAD < 1:
            break
        n += tokens - r["prefix_tokens"]
    if r["prefix_tokens"] != tokens:
        log(f"warning: the document for {tokens} tokens has {r['prefix_tokens']} prefix tokens")
    return doc, snap, r


# ---------------------------------------------------------------- setup
os.makedirs(args.out, exist_ok=True)
results_path = os.path.join(args.out, "results.json")
results = {}
if args.resume and os.path.exists(results_path):
    results = json.load(open(results_path))
    skip |= {k for k in SECTIONS if k in results and results[k].get("complete", True)}
    log(f"resume: keeping {', '.join(k for k in SECTIONS if k in results and k in skip) or 'nothing'}")


def keep():
    """results.json after every section (and every link): a failure later loses nothing measured."""
    tmp = results_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, results_path)


def find_binary(name):
    for sub in ("", "bench"):
        p = os.path.join(args.build, sub, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    sys.exit(f"no {name} under {args.build} (build it: cmake --build --preset release)")


R.work = tempfile.mkdtemp(prefix=f"swarmkv-cluster-bench-{PID}-")
bindir = os.path.join(R.work, "bin")
os.makedirs(bindir)
binaries = {}
for b in ("swarmkv", "swarmkv_bus_bench"):
    src = find_binary(b)
    shutil.copy2(src, os.path.join(bindir, b))
    binaries[b] = {"from": os.path.abspath(src), "sha256": sha256(src)}
SWARMKV = os.path.join(bindir, "swarmkv")
BUS_BENCH = os.path.join(bindir, "swarmkv_bus_bench")
ENV = dict(os.environ, SWARMKV_MODEL=args.model, SWARMKV_CACHE=os.path.join(R.work, "cache"))
ENV.pop("SWARMKV_REDIS", None)
ENV.pop("SWARMKV_LOG_LEVEL", None)


def rate_bits(rate):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)?bit", rate.lower())
    if not m:
        raise SystemExit(f"--links: '{rate}' is not a tc rate like 100mbit")
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


for r_ in links:
    rate_bits(r_)

params = {"trials": trials, "slow_trials": args.slow_trials, "quick": quick, "doc_tokens": doc_tokens,
          "links": links, "lengths": lengths, "agents": n_agents, "max_tokens": max_tokens,
          "threads": args.threads, "kv_type": args.kv_type, "e2e_cold": args.e2e_cold,
          "chunk_bytes": args.chunk_bytes or None,
          "model": args.model, "pipeline": os.path.relpath(args.pipeline, REPO)}


def main():
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               "unknown")
    info = json.loads(run([SWARMKV, "info", "--model", args.model], timeout=120).stdout)
    redis_version = quiet(["redis-server", "--version"]).stdout.strip()
    results.setdefault("runs", []).append({"params": params, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                           "binaries": binaries})
    results["params"] = params
    busy = busy_cores(1.0)
    if busy > BUSY:
        log(f"warning: {busy:.2f} cores busy before the run (other processes): they share these cores and skew "
            "every timing (2 threads on 2 busy cores can run 10x slower)")
    results["environment"] = {"cpu": cpu, "cores": os.cpu_count(), "kernel": os.uname().release,
                              "busy_cores_at_start": busy,
                              "engine": info["engine"], "model_file": os.path.basename(args.model),
                              "model_bytes": os.path.getsize(args.model), "redis": redis_version}
    keep()
    todo = [s for s in SECTIONS if s not in skip]
    log(f"sections: {', '.join(todo) or 'none'}; {trials} trial(s); work folder {R.work}")

    snap = None
    if {"loopback", "links"} & set(todo):
        _, snap, made = make_document(doc_tokens, f"doc-{doc_tokens}")
        results["snapshot"] = {"doc_tokens": made["prefix_tokens"], "file_bytes": made["file_bytes"],
                               "bytes_per_token": made["file_bytes"] / made["prefix_tokens"],
                               "prefill_ms": made["prefill_ms"]}
        log(f"snapshot: {made['prefix_tokens']} tokens, {made['file_bytes'] / 1e6:.1f} MB")
        keep()

    port = free_port()
    need_loopback = {"loopback", "breakeven", "e2e"} & set(todo)
    if need_loopback:
        start_redis("loopback", "127.0.0.1", port)

    if "loopback" in todo:
        Resp(port).cmd("FLUSHALL")
        b = bus_bench(f"redis://127.0.0.1:{port}", snap, trials)
        results["loopback"] = {"url": "redis://127.0.0.1", "bench": b, "trials": trials, "complete": True}
        keep()
        write_csvs()
        log(f"loopback: publish {b['publish_mb_s']:.0f} MB/s, fetch {b['fetch_mb_s']:.0f} MB/s")

    if "links" in todo:
        links_section(snap)
    if "breakeven" in todo:
        breakeven_section(port)
    if "e2e" in todo:
        e2e_section(port)


# ---------------------------------------------------------------- links
def ns(netns, *cmd, timeout=30):
    return run(["ip", "netns", "exec", netns] + list(cmd), timeout=timeout, what=f"{netns}: {' '.join(cmd)}")


def tbf_args(rate):
    bits = rate_bits(rate)
    burst = max(64 * 1024, math.ceil(bits / 8 / 250))  # rate / 250 bytes, at least 64 KiB
    return burst, ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def links_section(snap):
    if os.geteuid() != 0:
        raise RuntimeError("links needs root (ip netns, tc); --skip links otherwise")
    for n in (NS_A, NS_B):
        run(["ip", "netns", "add", n], timeout=30)
        R.netns.append(n)
    # The veth pair is created with its ends already inside the namespaces: it never exists outside them.
    run(["ip", "link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns", NS_B],
        timeout=30)
    for n, dev, addr in ((NS_A, VETH_A, ADDR_A), (NS_B, VETH_B, ADDR_B)):
        run(["ip", "-n", n, "addr", "add", f"{addr}/30", "dev", dev], timeout=30)
        run(["ip", "-n", n, "link", "set", dev, "up"], timeout=30)
        run(["ip", "-n", n, "link", "set", "lo", "up"], timeout=30)
    port = 6379 + PID % 1000  # a fresh namespace: nothing else listens there
    start_redis("netns", ADDR_A, port, netns=NS_A)
    url = f"redis://{ADDR_A}:{port}"
    out = {"trials": trials, "slow_trials": args.slow_trials, "namespaces": [NS_A, NS_B],
           "addresses": [ADDR_A, ADDR_B], "mtu": None, "rates": [], "complete": False}
    out["mtu"] = int(re.search(r"mtu (\d+)", run(["ip", "-n", NS_A, "link", "show", VETH_A], timeout=30)
                               .stdout).group(1))
    results["links"] = out
    for rate in links + ["unlimited"]:
        shaped = rate != "unlimited"
        qdiscs = {}
        for n, dev in ((NS_A, VETH_A), (NS_B, VETH_B)):
            if shaped:
                burst, tbf = tbf_args(rate)
                run(["ip", "netns", "exec", n, "tc", "qdisc", "replace", "dev", dev, "root"] + tbf, timeout=30)
            else:
                run(["ip", "netns", "exec", n, "tc", "qdisc", "del", "dev", dev, "root"], timeout=30, check=False)
            qdiscs[n] = run(["ip", "netns", "exec", n, "tc", "qdisc", "show", "dev", dev], timeout=30).stdout.strip()
        bits = rate_bits(rate) if shaped else None
        n_trials = args.slow_trials if shaped and bits <= 10e6 else trials
        expect = bits / 8e6 * 0.5 if shaped else 50.0  # MB/s, for the timeout only
        b = bus_bench(url, snap, n_trials, netns=NS_B, expect_mb_s=expect)
        row = {"rate": rate, "rate_bits": bits, "burst_bytes": tbf_args(rate)[0] if shaped else None,
               "latency": "50ms" if shaped else None, "trials": n_trials, "qdisc": qdiscs, "bench": b}
        if shaped:
            row["fetch_of_nominal"] = b["fetch_mb_s"] * 8e6 / bits
            row["publish_of_nominal"] = b["publish_mb_s"] * 8e6 / bits
        out["rates"].append(row)
        keep()
        log(f"link {rate}: publish {b['publish_mb_s']:.2f} MB/s, fetch {b['fetch_mb_s']:.2f} MB/s"
            + (f" ({row['fetch_of_nominal'] * 100:.0f} % of nominal)" if shaped else ""))
    # Checks: a shaped link at or below 100 Mbit/s must deliver close to its rate (the shaping works).
    out["checks"] = []
    for row in out["rates"]:
        if row["rate_bits"] and row["rate_bits"] <= 100e6:
            ok = 0.80 <= row["fetch_of_nominal"] <= 1.05 and 0.80 <= row["publish_of_nominal"] <= 1.05
            out["checks"].append({"rate": row["rate"], "fetch_of_nominal": row["fetch_of_nominal"],
                                  "publish_of_nominal": row["publish_of_nominal"], "ok": ok})
            if not ok:
                log(f"warning: {row['rate']} delivered {row['fetch_of_nominal'] * 100:.0f} % (fetch) / "
                    f"{row['publish_of_nominal'] * 100:.0f} % (publish) of its nominal rate")
    out["complete"] = True
    keep()
    write_csvs()
    for p, name, _ in list(R.procs):
        if name == "redis-server netns":
            R.stop(p)
    delete_netns(NS_A)
    delete_netns(NS_B)


# ---------------------------------------------------------------- breakeven
def breakeven_section(port):
    docs = {}
    for L in lengths:
        doc, snap, made = make_document(L, f"len-{L}")  # also the warm-up of each length
        docs[L] = (doc, snap, made["prefix_tokens"])
    rows = {L: {"prefix_tokens": docs[L][2], "prefill_ms": [], "file_bytes": [], "fetch": None} for L in lengths}
    for t in range(trials):
        for L in order(lengths, t):
            rows[L].setdefault("busy_cores_before", []).append(busy_cores())
            r = prefill(docs[L][0], docs[L][1])
            rows[L]["prefill_ms"].append(r["prefill_ms"])
            rows[L]["file_bytes"].append(r["file_bytes"])
            rows[L]["prefix_tokens"] = r["prefix_tokens"]
    Resp(port).cmd("FLUSHALL")
    for L in lengths:  # the same snapshots over loopback: is the transfer time linear in the bytes?
        b = bus_bench(f"redis://127.0.0.1:{port}", docs[L][1], max(3, trials))
        rows[L]["fetch"] = b
    results["breakeven"] = {"trials": trials, "lengths": [rows[L] for L in lengths], "complete": True,
                            "how": "swarmkv prefill DOC --out FILE --snapshot-cache off -t "
                                   f"{args.threads} (engine defaults); bytes = the file's size"}
    keep()
    write_csvs()
    for L in lengths:
        x = rows[L]
        log(f"length {x['prefix_tokens']}: prefill {median(x['prefill_ms']):.0f} ms, "
            f"{median(x['file_bytes']) / x['prefix_tokens']:.0f} bytes/token")


# ---------------------------------------------------------------- e2e
QUESTIONS = [
    "Summarise the licence in one sentence.", "What may a licensee do with the Work?",
    "What must a redistributor keep in the source?", "What does the NOTICE file have to contain?",
    "When does the patent licence terminate?", "What is a Contribution?", "Who is a Contributor?",
    "What does the licence say about trademarks?", "What warranty does the licence give?",
    "What limits the Contributors' liability?", "May a licensee offer support for a fee?",
    "What is a Derivative Work?", "How is the licence applied to a new work?",
    "What is the Source form of a work?", "What counts as Object form?", "What is a Legal Entity?"]


def write_pipeline(path):
    text = open(args.pipeline).read()
    system = re.search(r"^system:\s*(.+)$", text, re.M).group(1).strip()
    doc = re.search(r"^document:\s*\n\s+file:\s*(\S+)", text, re.M).group(1)
    doc = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(args.pipeline)), doc),
                          os.path.dirname(os.path.abspath(path)))
    n_batch = re.search(r"^n_batch:\s*(\d+)", text, re.M)
    qs = [QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (part {i // len(QUESTIONS) + 1})")
          for i in range(n_agents)]
    lines = [f"# Generated by bench/cluster_transfer.py from {os.path.relpath(args.pipeline, REPO)}: the same "
             f"document and system prompt, {n_agents} agents.",
             f"name: agents-{n_agents}", f"n_batch: {n_batch.group(1) if n_batch else 512}", "fork: shared",
             f"system: {json.dumps(system)}", f"document: {{file: {json.dumps(doc)}}}",
             f"defaults: {{max_tokens: {max_tokens}, temperature: 0}}", "agents:"]
    lines += [f"  - {{name: a{i:02d}, prompt: {json.dumps(q)}}}" for i, q in enumerate(qs)]
    open(path, "w").write("\n".join(lines) + "\n")


ARMS = ["local", "redis-1-worker", "redis-2-workers"]


def worker_specs(arm):
    if arm == "redis-1-worker":
        return [("w1", args.threads)]
    return [("w1", max(1, args.threads // 2)), ("w2", max(1, args.threads // 2))]


def start_workers(arm, port, db):
    procs = []
    for name, threads in worker_specs(arm):
        full = f"{arm}-{name}-{PID}"
        store = os.path.join(R.work, "e2e", arm, name, "store")
        os.makedirs(store, exist_ok=True)
        log_path = os.path.join(R.work, "e2e", arm, name, "worker.log")
        p = R.spawn([SWARMKV, "worker", "--redis", f"redis://127.0.0.1:{port}/{db}", "--model", args.model,
                     "--name", full, "-t", str(threads), "--cache-dir", store], f"worker {full}", log_path, env=ENV)
        procs.append((p, full, log_path, threads))
    c = Resp(port, db)
    deadline = time.time() + 120
    try:
        while True:
            live = set()
            cursor = "0"
            while True:
                cursor, found = c.cmd("SCAN", cursor, "MATCH", "swarmkv:worker:*", "COUNT", 1000)
                live |= {k.rsplit(":", 1)[-1] for k in found}
                if cursor == "0":
                    break
            if all(full in live for _, full, _, _ in procs):
                return procs
            for p, full, lp, _ in procs:
                if not p.alive():
                    raise RuntimeError(f"worker {full} exited {p.proc.returncode} before it was live:\n{tail(lp)}")
            if time.time() > deadline:
                raise RuntimeError(f"workers of {arm} not live after 120 s")
            time.sleep(0.1)
    finally:
        c.close()


def stop_workers(procs):
    out = []
    for p, full, lp, threads in procs:
        rc, secs, killed = R.stop(p, timeout=60)
        m = re.search(r"swarmkv worker: (\d+) job\(s\), (\d+) agent\(s\), (\d+) taken over.*?, (\d+) snapshot fetch",
                      tail(lp, 2000))
        row = {"name": full, "threads": threads, "exit": rc, "stop_s": secs, "killed": killed,
               "jobs": int(m.group(1)) if m else None, "agents": int(m.group(2)) if m else None,
               "snapshot_fetches": int(m.group(4)) if m else None}
        fetched = re.findall(r"fetched snapshot \S+ \(([\d.]+) MiB in (\d+) ms", tail(lp, 20000))
        row["fetch_log"] = [{"mib": float(a), "ms": float(b)} for a, b in fetched]
        if rc != 0 or killed:
            log(f"warning: worker {full} exited {rc}{' (killed)' if killed else ''} on SIGTERM:\n{tail(lp, 1500)}")
        out.append(row)
    return out


def e2e_run(arm, pipeline, port, db):
    cmd = [SWARMKV, "run", pipeline, "--model", args.model, "--fork", "shared", "-t", str(args.threads),
           "--kv-type", args.kv_type, "--snapshot-cache", "off", "--json",
           "--cache-dir", os.path.join(R.work, "e2e", "coordinator-store")]
    workers = []
    if arm != "local":
        cmd += ["--redis", f"redis://127.0.0.1:{port}/{db}", "--timeout", "1200"]
        workers = start_workers(arm, port, db)
    try:
        t = time.time()
        p = run(cmd, timeout=1500, what=f"swarmkv run {os.path.basename(pipeline)} ({arm})", check=False)
        wall = (time.time() - t) * 1000
    finally:
        stopped = stop_workers(workers)
    if p.returncode != 0:
        raise RuntimeError(f"{arm}: swarmkv run exited {p.returncode}:\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout)
    agents = r["agents"]
    tr = r.get("transfer")
    snap = r.get("snapshot") or {}
    row = {"arm": arm, "wall_ms": wall, "total_ms": r["total_ms"], "load_ms": r.get("load_ms"),
           "prefill_ms": r["prefill_ms"], "snapshot_source": snap.get("source"),
           "snapshot_bytes": snap.get("bytes") or r.get("snapshot_bytes"), "prefix_tokens": r["prefix_tokens"],
           "transfer": tr, "snapshot_fetched": bool(tr and tr.get("fetches", 0) > 0) if arm != "local" else None,
           "ok": r["ok"], "agents": len(agents), "agents_ok": sum(a["status"] == "ok" for a in agents),
           "agent_errors": {a["name"]: a.get("error") for a in agents if a["status"] != "ok"},
           "answers": {a["name"]: a.get("answer") for a in agents},
           "n_tokens": {a["name"]: a.get("n_tokens") for a in agents},
           "agent_worker": {a["name"]: a.get("worker") for a in agents},
           "workers": stopped}
    if not r["ok"] or row["agents_ok"] != len(agents):
        raise RuntimeError(f"{arm}: {len(agents) - row['agents_ok']} agent(s) not ok: {row['agent_errors']}")
    bad = [w for w in stopped if w["exit"] != 0 or w["killed"]]
    if bad:
        raise RuntimeError(f"{arm}: worker(s) did not exit 0 on SIGTERM: {bad}")
    return row


def e2e_section(port):
    pipeline = os.path.join(args.out, f"agents-{n_agents}.yaml")
    write_pipeline(pipeline)
    dbs = {"redis-1-worker": 1, "redis-2-workers": 2}  # one database each: its own job stream and bus
    c = Resp(port)
    c.cmd("FLUSHALL")
    c.close()
    shutil.rmtree(os.path.join(R.work, "e2e"), ignore_errors=True)
    runs = {a: [] for a in ARMS}
    results["e2e"] = {"pipeline": os.path.relpath(pipeline, args.out), "agents": n_agents, "max_tokens": max_tokens,
                      "trials": trials, "cold_every_trial": args.e2e_cold, "arms": runs, "complete": False,
                      "workers": {a: [{"name": n, "threads": t} for n, t in worker_specs(a)] for a in dbs}}
    for t in range(trials):
        for arm in order(ARMS, t):
            if arm != "local" and args.e2e_cold and t > 0:
                c = Resp(port, dbs[arm])
                c.cmd("FLUSHDB")
                c.close()
                shutil.rmtree(os.path.join(R.work, "e2e", arm), ignore_errors=True)
            busy = busy_cores()
            row = e2e_run(arm, pipeline, port, dbs.get(arm, 0))
            row["trial"] = t
            row["busy_cores_before"] = busy
            runs[arm].append(row)
            keep()
            tr = row["transfer"] or {}
            log(f"e2e {arm} trial {t + 1}: total {row['total_ms']:.0f} ms, prefill {row['prefill_ms']:.0f} ms"
                + (f", fetch {tr.get('fetch_ms', 0):.0f} ms ({tr.get('fetches')} fetch(es)), "
                   f"publish {tr.get('publish_ms', 0):.0f} ms" if arm != "local" else ""))
    results["e2e"]["complete"] = True
    keep()
    write_csvs()


# ---------------------------------------------------------------- CSV
def write_csvs():
    def w(name, head, rows):
        with open(os.path.join(args.out, name), "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(head)
            wr.writerows(rows)

    def samples(xs):
        return " ".join(f"{x:.1f}" for x in xs)

    if "loopback" in results:
        b = results["loopback"]["bench"]
        w("loopback.csv", ["bytes", "trials", "publish_ms_median", "fetch_ms_median", "publish_mb_s", "fetch_mb_s",
                           "publish_ms_samples", "fetch_ms_samples"],
          [[b["bytes"], len(b["trials"]), f"{b['publish_ms_median']:.1f}", f"{b['fetch_ms_median']:.1f}",
            f"{b['publish_mb_s']:.1f}", f"{b['fetch_mb_s']:.1f}", samples(x["publish_ms"] for x in b["trials"]),
            samples(x["fetch_ms"] for x in b["trials"])]])
    if "links" in results:
        w("links.csv", ["rate", "nominal_mb_s", "burst_bytes", "trials", "bytes", "publish_mb_s", "fetch_mb_s",
                        "fetch_of_nominal", "publish_ms_samples", "fetch_ms_samples"],
          [[x["rate"], f"{x['rate_bits'] / 8e6:.3f}" if x["rate_bits"] else "", x["burst_bytes"] or "", x["trials"],
            x["bench"]["bytes"], f"{x['bench']['publish_mb_s']:.2f}", f"{x['bench']['fetch_mb_s']:.2f}",
            f"{x['fetch_of_nominal']:.3f}" if x.get("fetch_of_nominal") else "",
            samples(t["publish_ms"] for t in x["bench"]["trials"]), samples(t["fetch_ms"] for t in x["bench"]["trials"])]
           for x in results["links"]["rates"]])
    if "breakeven" in results:
        rates = results.get("links", {}).get("rates", [])
        head = ["prefix_tokens", "trials", "prefill_median_ms", "prefill_tok_s", "file_bytes", "bytes_per_token",
                "loopback_fetch_median_ms"] + [f"transfer_ms_{x['rate']}" for x in rates] + ["prefill_ms_samples"]
        rows = []
        for x in results["breakeven"]["lengths"]:
            pm, fb = median(x["prefill_ms"]), median(x["file_bytes"])
            rows.append([x["prefix_tokens"], len(x["prefill_ms"]), f"{pm:.0f}", f"{x['prefix_tokens'] / pm * 1000:.1f}",
                         int(fb), f"{fb / x['prefix_tokens']:.1f}",
                         f"{x['fetch']['fetch_ms_median']:.1f}" if x.get("fetch") else ""]
                        + [f"{fb / 1e3 / r['bench']['fetch_mb_s']:.0f}" for r in rates]
                        + [samples(x["prefill_ms"])])
        w("breakeven.csv", head, rows)
    if "e2e" in results:
        rows = []
        for arm, rs in results["e2e"]["arms"].items():
            for x in rs:
                tr = x["transfer"] or {}
                rows.append([arm, x["trial"] + 1, f"{x['wall_ms']:.0f}", f"{x['total_ms']:.0f}", f"{x['prefill_ms']:.0f}",
                             x["snapshot_source"], "" if x["snapshot_fetched"] is None else x["snapshot_fetched"],
                             tr.get("bytes", ""), f"{tr['publish_ms']:.0f}" if tr else "",
                             f"{tr['fetch_ms']:.0f}" if tr else "", tr.get("fetches", ""),
                             f"{x['agents_ok']}/{x['agents']}",
                             " ".join(f"{w_['name']}:{w_['exit']}" for w_ in x["workers"])])
        w("e2e.csv", ["arm", "trial", "wall_ms", "total_ms", "prefill_ms", "snapshot_source", "snapshot_fetched",
                      "transfer_bytes", "publish_ms", "fetch_ms", "fetches", "agents_ok", "worker_exit"], rows)


# ---------------------------------------------------------------- run
status = 0
try:
    main()
except KeyboardInterrupt as e:
    log(f"interrupted ({e or 'Ctrl-C'}); the sections finished so far are in {results_path}")
    status = 130
except (RuntimeError, subprocess.TimeoutExpired, OSError, json.JSONDecodeError) as e:
    log(f"error: {e}")
    status = 1
finally:
    R.cleanup()
    if results:
        keep()
        write_csvs()
    line = "python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    cmd_path = os.path.join(args.out, "command.txt")
    if args.resume and os.path.exists(cmd_path):
        with open(cmd_path, "a") as f:
            f.write(f"# resumed ({'interrupted' if status else 'completed'}):\n{line}\n")
    else:
        with open(cmd_path, "w") as f:
            f.write(line + "\n" if status == 0 else f"# {'interrupted' if status == 130 else 'failed'}:\n{line}\n")

if status == 0 and not args.no_plot:
    py = sys.executable
    if quiet([py, "-c", "import matplotlib"]).returncode != 0 and \
            os.path.exists("/usr/bin/python3"):
        py = "/usr/bin/python3"
    p = subprocess.run([py, os.path.join(HERE, "plot_cluster_transfer.py"), args.out], timeout=600)
    if p.returncode != 0:
        log("plotting failed; run bench/plot_cluster_transfer.py OUT again")
        status = 1
log(f"results in {args.out}")
sys.exit(status)
