"""Slow clients against `swarmkv serve`: do they hold the server? (issues 40 and 60)

Arms, each against a fresh `swarmkv serve` on loopback (SmolLM2, 2 threads):

  c48     48 slow clients, --max-concurrent 8
  c100    100 slow clients, the default --max-concurrent
  hog300  300 slow clients from one address (127.0.0.1), more than the
          256-connection cap, each reconnecting a second after the server
          closes it; the prober is another client (127.0.0.2)
  flood300  the same, reconnecting at once: a connection flood (thousands
          a second) from a load generator on the same two cores

A slow client connects and sends a request head one byte per second, never
finishing it; when the server closes the connection (408 or otherwise) it
connects again. In each arm, first idle (no slow clients) and then for
--seconds under the slow clients, one prober measures --probes times,
spread over the window, each on a fresh connection: GET /health, and a
1-token chat completion. Each probe may take --probe-timeout seconds; one
that does not answer in time is counted as failed and recorded at that
timeout. Arms run for every binary given (--binary NAME=PATH, e.g. the
commit before the fix and the one after), back to back in this one run.

Writes OUT/results.json, OUT/latencies.csv, OUT/report.md, OUT/plots/ and
OUT/command.sh.

usage: /usr/bin/python3 bench/slow_clients.py --binary new=build/release/swarmkv
           [--binary old=/tmp/old/swarmkv] [--out bench/results/slow-clients]
           [--seconds 30] [--probes 10]
Needs Debian's python3-matplotlib for the plot.
"""
import argparse
import faulthandler
import signal
import http.client
import json
import os
import socket
import statistics
import sys
import threading
import time

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import MODEL, report, servers  # noqa: E402

# arm: (slow clients, serve flags, the prober's source address or None, seconds a slow
# client waits before it reconnects)
ARMS = {"c48": (48, ["--max-concurrent", "8"], None, 0), "c100": (100, [], None, 0),
        "hog300": (300, [], "127.0.0.2", 1.0), "flood300": (300, [], "127.0.0.2", 0)}
HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000


class SlowClient(threading.Thread):
    """One header byte a second; reconnects whenever the server closes."""

    def __init__(self, port, stop, pause=0):
        super().__init__(daemon=True)
        self.port, self.stop, self.pause = port, stop, pause
        self.connects = self.closed_by_server = self.answered_408 = 0

    def run(self):
        while not self.stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                time.sleep(1)
                continue
            self.connects += 1
            try:
                for i in range(len(HEAD)):
                    if self.stop.is_set():
                        break
                    s.sendall(HEAD[i:i + 1])
                    s.settimeout(1.0)
                    try:
                        got = s.recv(4096)
                    except socket.timeout:
                        continue
                    self.closed_by_server += 1
                    if got.startswith(b"HTTP/1.1 408"):
                        self.answered_408 += 1
                    break
            except OSError:
                self.closed_by_server += 1
            finally:
                s.close()
            if self.pause:
                self.stop.wait(self.pause)


def probe(port, kind, timeout, source=None):
    """Seconds one request took (fresh connection, from `source` when given), or None when it
    failed or timed out."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                   source_address=(source, 0) if source else None)
    start = time.perf_counter()
    try:
        if kind == "health":
            c.request("GET", "/health")
        else:
            body = json.dumps({"messages": [{"role": "user", "content": "Say hello."}],
                               "max_tokens": 1})
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        ok = r.status == 200
    except (OSError, http.client.HTTPException):
        ok = False
    finally:
        c.close()
    return time.perf_counter() - start if ok else None


def probes(port, n, spread_s, timeout, source=None):
    """n probes of each kind, started spread_s / n apart."""
    out = {"health": [], "completion": []}
    gap = spread_s / n
    for i in range(n):
        t0 = time.perf_counter()
        for kind in out:
            out[kind].append(probe(port, kind, timeout, source))
        left = gap - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
    return out


def run_arm(binary, arm, args):
    clients, extra, source, pause = ARMS[arm]
    p = servers.serve(binary, None, ["-t", "2", *extra])
    port = p.port
    try:
        probe(port, "completion", 60, source)  # warm: the first decode allocates
        idle = probes(port, args.probes, 2.0, args.probe_timeout, source)
        stop = threading.Event()
        slow = [SlowClient(port, stop, pause) for _ in range(clients)]
        for c in slow:
            c.start()
        time.sleep(3)  # all connected and trickling
        start = time.perf_counter()
        loaded = probes(port, args.probes, args.seconds - 3, args.probe_timeout, source)
        window = time.perf_counter() - start + 3
        stop.set()
        for c in slow:
            c.join(timeout=10)
        return {
            "binary": binary, "slow_clients": clients, "serve_flags": extra, "prober": source,
            "idle": idle, "loaded": loaded, "window_s": round(window, 1),
            "connects": sum(c.connects for c in slow),
            "closed_by_server": sum(c.closed_by_server for c in slow),
            "answered_408": sum(c.answered_408 for c in slow),
        }
    finally:
        p.stop(timeout=60)


def summarize(out, res, args):
    from swarmbench import style as ps

    med = statistics.median
    rows, lines = [], []
    with open(os.path.join(out, "latencies.csv"), "w") as f:
        f.write("binary,arm,phase,kind,trial,seconds,ok\n")
        for key, r in res["runs"].items():
            name, arm = key.split("/")
            for phase in ("idle", "loaded"):
                for kind, vals in r[phase].items():
                    for i, v in enumerate(vals):
                        f.write(f"{name},{arm},{phase},{kind},{i},"
                                f"{v if v is not None else args.probe_timeout},{int(v is not None)}\n")

    def stat(vals):
        got = [v if v is not None else args.probe_timeout for v in vals]
        return med(got) * 1000, sum(v is None for v in vals)

    lines.append("# Slow clients against `swarmkv serve`\n")
    lines.append(f"Command: see `command.sh`. {args.probes} probes of each kind per phase, each on a "
                 f"fresh connection; a probe that got no answer within {args.probe_timeout:g} s "
                 f"counts at {args.probe_timeout:g} s and as failed. Load window: "
                 f"{args.seconds:g} s of slow clients (one header byte a second, reconnecting "
                 f"when closed). Goal (issues 40 and 60): loaded median < 2x idle median. "
                 f"hog300: the slow clients all come from 127.0.0.1, the prober from "
                 f"127.0.0.2.\n")
    if res.get("note"):
        lines.append(res["note"] + "\n")
    lines.append("| binary | arm | slow clients | kind | idle median ms | loaded median ms | "
                 "loaded / idle | failed (loaded) | slow-client connects | 408s |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for key, r in res["runs"].items():
        name, arm = key.split("/")
        for kind in ("health", "completion"):
            i_ms, _ = stat(r["idle"][kind])
            l_ms, failed = stat(r["loaded"][kind])
            ratio = l_ms / i_ms
            rows.append((name, arm, kind, i_ms, l_ms, ratio))
            # A median that is a timeout is a bound, not a measurement.
            timed_out = failed * 2 >= len(r["loaded"][kind])
            loaded = f"> {l_ms:.0f} (no answer)" if timed_out else f"{l_ms:.1f}"
            shown = f"> {ratio:.0f}" if timed_out else f"{ratio:.2f}"
            lines.append(f"| {name} | {arm} | {r['slow_clients']} | {kind} | {i_ms:.1f} | "
                         f"{loaded} | **{shown}** | {failed}/{len(r['loaded'][kind])} | "
                         f"{r['connects']} | {r['answered_408']} |")
    open(os.path.join(out, "report.md"), "w").write("\n".join(lines) + "\n")

    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    names = list(dict.fromkeys(k.split("/")[0] for k in res["runs"]))  # as given
    fig, axes = ps.figure(rows=1, cols=2, width=10)
    for ax, kind in zip(axes[0], ("health", "completion")):
        groups = [a for a in ARMS if any(k.endswith("/" + a) for k in res["runs"])]
        arms = [f"{n} {ph}" for n in names for ph in ("idle", "loaded")]

        def vals(g, a):
            n, ph = a.split(" ")
            r = res["runs"].get(f"{n}/{g}")
            return [1000 * (v if v is not None else args.probe_timeout) for v in r[ph][kind]] if r else [0]

        bars = ps.grouped(ax, groups, arms, lambda g, a: med(vals(g, a)), trials=vals,
                          labels=[f"{g}: {ARMS[g][0]} slow" for g in groups], suffix=" ms")
        ps.panel_title(ax, f"{'GET /health' if kind == 'health' else '1-token completion'} (ms)")
    ps.arm_legend(axes[0][-1], [f"{n} {ph}" for n in names for ph in ("idle", "loaded")],
                  dots="one probe", points=not bars)
    ps.title(fig, "Latency idle and under slow clients (median of the probes; lower is better; "
                  f"a probe unanswered in {args.probe_timeout:g} s is drawn at {args.probe_timeout:g} s)")
    ps.save(fig, os.path.join(out, "plots", "latency.png"))
    return rows


def main():
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", action="append", required=True, help="NAME=PATH of swarmkv")
    ap.add_argument("--out", default="bench/results/slow-clients")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--probe-timeout", type=float, default=30)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--note", default="", help="what the binaries are, for the report")
    ap.add_argument("--report-only", action="store_true",
                    help="write the report and plot from OUT/results.json, measuring nothing")
    args = ap.parse_args()
    if args.report_only:
        summarize(args.out, json.load(open(os.path.join(args.out, "results.json"))), args)
        return
    os.makedirs(args.out, exist_ok=True)
    report.write_command(args.out, note="what produced this directory")
    res = {"model": os.path.basename(MODEL), "seconds": args.seconds, "probes": args.probes,
           "probe_timeout_s": args.probe_timeout, "note": args.note, "runs": {}}
    for arm in args.arms.split(","):
        for spec in args.binary:
            name, path = spec.split("=", 1)
            print(f"{name}/{arm} ...", flush=True)
            res["runs"][f"{name}/{arm}"] = run_arm(path, arm, args)
            json.dump(res, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    for row in summarize(args.out, res, args):
        print("{} {} {}: idle {:.1f} ms, loaded {:.1f} ms ({:.2f}x)".format(*row))


if __name__ == "__main__":
    main()
