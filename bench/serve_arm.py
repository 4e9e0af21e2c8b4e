"""One server arm of a results folder's command.sh (bench/results/serve/,
serve-exact/, one-core-old-vs-new/): starts the server command given after
`--` (it must listen on --port), waits until its /health answers, runs
bench/results/serve/client.py against it (its JSON to OUT.json), with
--metrics saves its /metrics to OUT.metrics, then stops it (SIGTERM).

usage: /usr/bin/python3 bench/serve_arm.py --port PORT --out OUT [--log LOG]
           [--metrics] -- SERVER COMMAND...
"""
import argparse
import os
import subprocess
import sys
import urllib.request

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import ROOT, servers  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True, help="the port the server command listens on")
    ap.add_argument("--out", required=True, help="OUT.json (the client's), OUT.metrics with --metrics")
    ap.add_argument("--log", help="the server's output (default: discarded)")
    ap.add_argument("--metrics", action="store_true", help="save the server's /metrics")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command line")
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("no server command after --")
    with servers.Process(command, a.log) as server:
        server.wait_ready(servers.http_ready(a.port), a.timeout, interval=0.5)
        with open(a.out + ".json", "w") as f:
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "results", "serve", "client.py"),
                            "--port", str(a.port)], stdout=f, check=True)
        if a.metrics:
            with urllib.request.urlopen(f"http://127.0.0.1:{a.port}/metrics", timeout=60) as r, \
                    open(a.out + ".metrics", "wb") as f:
                f.write(r.read())


if __name__ == "__main__":
    main()
