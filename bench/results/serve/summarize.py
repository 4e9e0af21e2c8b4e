#!/usr/bin/env python3
"""Summarises client.py's runs against both servers: report.md,
summary.json, summary.csv and plots/ (argument: this directory)."""
import json, os, sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
from swarmbench import style as ps  # noqa: E402
from swarmbench.report import prometheus, write_csv  # noqa: E402
from swarmbench.trials import percentile as pct  # noqa: E402

d = sys.argv[1]

def metric(path, name):
    with open(path) as f:
        return prometheus(f.read(), name)

rows = {}
for arm, prefilled_name in (("swarmkv", "swarmkv_prefilled_tokens_total"),
                            ("llama-server", "llamacpp:prompt_tokens_total")):
    run = json.load(open(os.path.join(d, arm + ".json")))
    reqs = run["requests"]
    ttft = [r["ttft_s"] for r in reqs if r["ttft_s"] is not None]
    end = [r["end_s"] for r in reqs]
    rows[arm] = {
        "arm": arm,
        "agents": run["agents"],
        "ok": sum(1 for r in reqs if r["status"] == 200),
        "end_to_end_s": round(run["end_to_end_s"], 2),
        "ttft_p50_s": round(pct(ttft, 50), 2), "ttft_p95_s": round(pct(ttft, 95), 2),
        "ttft_p99_s": round(pct(ttft, 99), 2),
        "completion_p50_s": round(pct(end, 50), 2),
        "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in reqs if r["usage"]),
        "prompt_tokens_each": reqs[0]["usage"]["prompt_tokens"] if reqs[0]["usage"] else None,
        "prefilled_tokens": metric(os.path.join(d, arm + ".metrics"), prefilled_name),
        "completion_tokens": sum(r["usage"]["completion_tokens"] for r in reqs if r["usage"]),
        "texts": [r["text"] for r in reqs],
    }
s, l = rows["swarmkv"], rows["llama-server"]
same = sum(1 for a, b in zip(s["texts"], l["texts"]) if a == b)
summary = {"arms": [{k: v for k, v in r.items() if k != "texts"} for r in rows.values()],
           "speedup_end_to_end": round(l["end_to_end_s"] / s["end_to_end_s"], 2),
           "answers_equal_between_servers": same}
json.dump(summary, open(os.path.join(d, "summary.json"), "w"), indent=2)
keys = [k for k in summary["arms"][0]]
write_csv(os.path.join(d, "summary.csv"), keys, summary["arms"])

os.makedirs(os.path.join(d, "plots"), exist_ok=True)
fig, axes = ps.figure(1, 1, width=6.5, height_per_row=3.3)
ax = axes[0][0]
ttfts = []
for arm in rows:
    run = json.load(open(os.path.join(d, arm + ".json")))
    xs = sorted(r["ttft_s"] for r in run["requests"])
    ttfts += xs
    ax.plot(xs, range(1, run["agents"] + 1), marker="o", color=ps.colour(arm), label=arm)
ps.value_scale(ax, ttfts, axis="x", bars=False, suffix=" s", pad=1.2)
ax.grid(axis="x", color="#eeeeee")
ax.set_xlabel("time to first token (log scale)")
ax.set_ylabel("requests answered")
ax.set_title("16 concurrent chat requests, same 3.5k-token document")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
ps.save(fig, os.path.join(d, "plots", "ttft.png"))

with open(os.path.join(d, "report.md"), "w") as f:
    f.write("# swarmkv serve vs llama-server -np 16\n\n")
    f.write("Reproduce: `bench/results/serve/command.sh` (one trial per server, same client, "
            "SmolLM2-135M F16, 2 threads, flash attention off).\n\n")
    f.write("| server | ok | end to end | TTFT p50 | p95 | p99 | completion p50 | prompt tokens | "
            "prefilled tokens | generated |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows.values():
        f.write(f"| {r['arm']} | {r['ok']}/{r['agents']} | {r['end_to_end_s']} s | "
                f"{r['ttft_p50_s']} s | {r['ttft_p95_s']} s | {r['ttft_p99_s']} s | "
                f"{r['completion_p50_s']} s | {r['prompt_tokens']} ({r['prompt_tokens_each']} each) | "
                f"{r['prefilled_tokens']:.0f} | {r['completion_tokens']} |\n")
    f.write(f"\nEnd to end: swarmkv serve is **{summary['speedup_end_to_end']}x** faster. "
            f"Greedy answers identical between the two servers: {same}/{s['agents']} "
            "(different batching, so near-ties may part; neither is the other's reference).\n")
print(json.dumps(summary, indent=2))
