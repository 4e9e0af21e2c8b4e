"""`swarmkv serve` under sustained load (issue 38): exact (the default)
against --no-exact, so that the cost of never reusing a cell while the
cache lasts is known.

REQUESTS chat completions over 4 documents (the Apache and Mozilla licences
of examples/documents/ and two synthetic texts), CONCURRENCY at a time from
a queue (a client thread takes the next request when its last one is
answered), request j: document j % 4, question (j // 4) % 10, greedy,
--max-tokens each, not streamed. Each arm is a fresh `serve` (-t 2,
snapshot store off, -c N_CTX); arms alternate, --trials rounds. Measured:
wall time, requests/s, completion tokens/s, per-request latency, and the
server's own counters (/metrics: swarmkv_kv_resets_total, prefilled,
reused and completion tokens, decode steps).

Answers: each arm's are compared with its own reference, the (document,
question) pairs each sent alone (--max-live 1, one at a time) to a fresh
server of that arm: under exact mode all must be equal.

Writes OUT/results.json, OUT/trials.csv, OUT/report.md, OUT/plots/ and
OUT/command.sh.

usage: /usr/bin/python3 bench/serve_load.py --bin build/release/swarmkv
           [--out bench/results/serve-load] [--trials 3] [--requests 200]
           [--concurrency 8] [--n-ctx 16384] [--max-tokens 32]
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import MODEL, ROOT, report, servers, trials  # noqa: E402
QUESTIONS = [
    "Summarise the text above in one line.",
    "Who are the parties named in the text above?",
    "What does the text above ask of the reader?",
    "Name one obligation the text above sets.",
    "What is the first thing the text above says?",
    "Is anything forbidden by the text above?",
    "What happens at the end of the text above?",
    "Give the text above a short title.",
    "Which words does the text above repeat most?",
    "What would a lawyer check first in the text above?",
]
COUNTERS = ("swarmkv_kv_resets_total", "swarmkv_prefilled_tokens_total",
            "swarmkv_reused_tokens_total", "swarmkv_restored_tokens_total",
            "swarmkv_completion_tokens_total", "swarmkv_decode_steps_total",
            "swarmkv_requests_total")


def documents():
    docs = []
    for name in ("apache-2.0.txt", "mpl-2.0.txt"):
        with open(os.path.join(ROOT, "examples", "documents", name)) as f:
            docs.append(f.read())
    docs.append("The quick brown fox jumps over the lazy dog. " * 200)
    docs.append("".join(f"Section {i}. The tenant of unit {i} pays {100 + 7 * i} pounds on day "
                        f"{1 + i % 28} of each month and keeps the stairs of floor {i % 9} clean. "
                        for i in range(1, 101)))
    return docs


class Server:
    """One `swarmkv serve` on a free loopback port (-t 2, snapshot store off); stopped with SIGTERM."""

    def __init__(self, binary, n_ctx, flags, log):
        self.p = servers.serve(binary, log, ["-c", str(n_ctx), "-t", "2", "--snapshot-cache", "off", *flags])
        self.port = self.p.port

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        return {name: v for name in COUNTERS if (v := report.prometheus(text, name)) is not None}

    def stop(self):
        self.p.stop(timeout=120)


def complete(port, doc, question, max_tokens):
    body = json.dumps({"model": "swarmkv", "temperature": 0, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": f"{doc}\n\n{question}"}]})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    data = resp.read()
    seconds = time.monotonic() - t0
    if resp.status != 200:
        sys.exit(f"HTTP {resp.status}: {data[:500]!r}")
    r = json.loads(data)
    return {"latency_s": seconds, "text": r["choices"][0]["message"]["content"],
            "completion_tokens": r["usage"]["completion_tokens"]}


def load(port, work, concurrency, max_tokens):
    """work: (request, doc, question) in queue order; CONCURRENCY client threads."""
    results = [None] * len(work)
    lock = threading.Lock()
    queue = list(range(len(work)))

    def client():
        while True:
            with lock:
                if not queue:
                    return
                j = queue.pop(0)
            _, doc, q = work[j]
            results[j] = complete(port, doc, q, max_tokens)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0, results


def write_report(a, summary, runs):
    """plots/latency.png and report.md from the summary and each run's
    latencies (`runs`: {"arm", "latency_s"}), as results.json keeps them."""
    from swarmbench import style
    fig, ax = style.plt.subplots(figsize=(7, 4))
    for name in ("exact", "no-exact"):
        for i, r in enumerate(x for x in runs if x["arm"] == name):
            lat = sorted(r["latency_s"])
            ax.plot(lat, [(k + 1) / len(lat) for k in range(len(lat))], color=style.colour(name), alpha=0.7,
                    label=name if i == 0 else None)
    ax.set_xlabel("request latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{a.requests} requests over 4 documents, {a.concurrency} at a time "
                 f"({a.trials} trials each)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "plots", "latency.png"), dpi=110)

    e, n = summary["exact"], summary["no-exact"]
    with open(os.path.join(a.out, "report.md"), "w") as out:
        out.write(f"""# `swarmkv serve` under sustained load: exact against `--no-exact`

{a.requests} chat completions over 4 documents (Apache 2.0, Mozilla 2.0, two synthetic
texts), {a.concurrency} at a time, {a.max_tokens} greedy tokens each, not streamed;
`serve -c {a.n_ctx} -t 2 --snapshot-cache off`, {os.path.basename(MODEL)}; {a.trials}
alternated trials per arm, medians. Command: `command.sh`.

| | exact (default) | `--no-exact` | exact / no-exact |
|---|---|---|---|
| wall time | {e['wall_s']:.1f} s | {n['wall_s']:.1f} s | {e['wall_s'] / n['wall_s']:.2f} |
| requests/s | {e['requests_per_s']:.2f} | {n['requests_per_s']:.2f} | {e['requests_per_s'] / n['requests_per_s']:.2f} |
| completion tokens/s | {e['completion_tokens_per_s']:.1f} | {n['completion_tokens_per_s']:.1f} | {e['completion_tokens_per_s'] / n['completion_tokens_per_s']:.2f} |
| latency p50 / p95 | {e['latency_p50_s']:.2f} / {e['latency_p95_s']:.2f} s | {n['latency_p50_s']:.2f} / {n['latency_p95_s']:.2f} s | |
| cache resets (`swarmkv_kv_resets_total`) | {e['kv_resets']:.0f} | {n['kv_resets']:.0f} | |
| tokens prefilled | {e['prefilled_tokens']:.0f} | {n['prefilled_tokens']:.0f} | |
| prompt tokens reused from the cache | {e['reused_tokens']:.0f} | {n['reused_tokens']:.0f} | |
| decode steps | {e['decode_steps']:.0f} | {n['decode_steps']:.0f} | |
| answers equal to the pair's sent alone (same arm) | {e['answers_equal_reference'][0]}/{e['answers_equal_reference'][1]} | {n['answers_equal_reference'][0]}/{n['answers_equal_reference'][1]} | |

Exact mode never reuses a cell while the cache lasts: when its cells are all
handed out, new requests wait for the live ones, then the cache starts over
and every document is prefilled again (the resets above, and the extra
tokens prefilled). `--no-exact` reuses freed cells, so its cache never
starts over, but a request's answer depends on which requests shared its
batches.

![latency](plots/latency.png)
""")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "serve-load"))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=16384)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--report-only", action="store_true",
                    help="write plots/ and report.md again from --out's results.json, run nothing")
    a = ap.parse_args()
    if a.report_only:
        with open(os.path.join(a.out, "results.json")) as f:
            saved = json.load(f)
        for key in ("trials", "requests", "concurrency", "n_ctx", "max_tokens"):
            setattr(a, key, saved[key])
        write_report(a, saved["summary"], saved["runs"])
        return
    os.makedirs(os.path.join(a.out, "plots"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    report.write_command(a.out)

    docs = documents()
    work = [(j, docs[j % 4], QUESTIONS[(j // 4) % len(QUESTIONS)]) for j in range(a.requests)]
    pair = [(j % 4, (j // 4) % len(QUESTIONS)) for j in range(a.requests)]
    arms = [("exact", []), ("no-exact", ["--no-exact"])]
    runs = []
    for trial in range(a.trials):
        for name, flags in trials.alternate(arms, trial):
            s = Server(a.bin, a.n_ctx, flags, os.path.join(a.out, "logs", f"{name}-{trial}.log"))
            try:
                wall, results = load(s.port, work, a.concurrency, a.max_tokens)
                m = s.metrics()
            finally:
                s.stop()
            runs.append({"trial": trial, "arm": name, "wall_s": wall, "metrics": m,
                         "results": results})
            lat = sorted(r["latency_s"] for r in results)
            print(f"trial {trial} {name:8}: {wall:6.1f} s, {a.requests / wall:5.2f} requests/s, "
                  f"p50 {statistics.median(lat):5.2f} s, resets {m['swarmkv_kv_resets_total']:.0f}, "
                  f"prefilled {m['swarmkv_prefilled_tokens_total']:.0f}", flush=True)

    # each arm's reference: each (document, question) pair alone, one at a time
    reference = {}
    for name, flags in arms:
        s = Server(a.bin, a.n_ctx, flags + ["--max-live", "1"],
                   os.path.join(a.out, "logs", f"reference-{name}.log"))
        try:
            for d, q in sorted(set(pair)):
                reference[(name, d, q)] = complete(s.port, docs[d], QUESTIONS[q], a.max_tokens)["text"]
        finally:
            s.stop()

    def check(arm):
        equal = sum(1 for r in runs if r["arm"] == arm
                    for j, x in enumerate(r["results"]) if x["text"] == reference[(arm, *pair[j])])
        return equal, sum(len(r["results"]) for r in runs if r["arm"] == arm)

    summary = {}
    for name, _ in arms:
        rs = [r for r in runs if r["arm"] == name]
        lat = [x["latency_s"] for r in rs for x in r["results"]]
        lat.sort()
        equal, total = check(name)
        summary[name] = {
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "requests_per_s": statistics.median(a.requests / r["wall_s"] for r in rs),
            "completion_tokens_per_s": statistics.median(
                sum(x["completion_tokens"] for x in r["results"]) / r["wall_s"] for r in rs),
            "latency_p50_s": statistics.median(lat),
            "latency_p95_s": lat[int(0.95 * (len(lat) - 1))],
            "kv_resets": statistics.median(r["metrics"]["swarmkv_kv_resets_total"] for r in rs),
            "prefilled_tokens": statistics.median(
                r["metrics"]["swarmkv_prefilled_tokens_total"] for r in rs),
            "reused_tokens": statistics.median(r["metrics"]["swarmkv_reused_tokens_total"] for r in rs),
            "decode_steps": statistics.median(r["metrics"]["swarmkv_decode_steps_total"] for r in rs),
            "answers_equal_reference": [equal, total],
        }
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"model": os.path.basename(MODEL), "trials": a.trials, "requests": a.requests,
                   "concurrency": a.concurrency, "n_ctx": a.n_ctx, "max_tokens": a.max_tokens,
                   "summary": summary,
                   "runs": [{k: v for k, v in r.items() if k != "results"} |
                            {"latency_s": [x["latency_s"] for x in r["results"]]} for r in runs]},
                  f, indent=1)
    report.write_csv(os.path.join(a.out, "trials.csv"),
                     ["trial", "arm", "wall_s", "requests_per_s", "latency_p50_s"] + list(COUNTERS),
                     [[r["trial"], r["arm"], r["wall_s"], a.requests / r["wall_s"],
                       statistics.median(x["latency_s"] for x in r["results"])]
                      + [r["metrics"].get(c) for c in COUNTERS] for r in runs])

    write_report(a, summary, [{"arm": r["arm"], "latency_s": [x["latency_s"] for x in r["results"]]}
                              for r in runs])
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
