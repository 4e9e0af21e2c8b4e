"""Plots and report.md for bench/many_agents.py's results (OUT/results.json).

usage: /usr/bin/python3 bench/plot_many_agents.py OUT
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from swarmbench.style import ARM_COLOURS, plt, value_scale  # noqa: E402

out = sys.argv[1]
with open(os.path.join(out, "results.json")) as f:
    R = json.load(f)
os.makedirs(os.path.join(out, "plots"), exist_ok=True)
p = R["params"]
n = p["agents"]
at_n = [r for r in R["rows"] if r["agents"] == n]

# Per-arm percentiles, n agents: bars on a linear axis from 0 (a bar's length is its value).
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax, metric, title in ((axes[0], "ttft", "time to first token"),
                          (axes[1], "completion", "completion")):
    width = 0.26
    for j, q in enumerate(("p50", "p95", "p99")):
        xs = [i + (j - 1) * width for i in range(len(at_n))]
        ys = [r[f"{metric}_{q}_ms"] / 1000 for r in at_n]
        ax.bar(xs, ys, width, color=[ARM_COLOURS.get(r["arm"], "#444444") for r in at_n],
               alpha=(0.45, 0.7, 1.0)[j], edgecolor="black", linewidth=0.4,
               label=q if metric == "ttft" else None)
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.0f}" if y >= 10 else f"{y:.1f}", ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(range(len(at_n)), [r["arm"] for r in at_n])
    value_scale(ax, [r[f"{metric}_{q}_ms"] / 1000 for r in at_n for q in ("p50", "p95", "p99")])
    ax.set_ylabel("seconds from the run's start")
    ax.set_title(f"{title}, {n} agents: p50 / p95 / p99 (light to dark)")
fig.suptitle(f"{n} agents x {p['n_predict']} tokens over a {p['doc_tokens']}-token document, "
             f"{p['threads']} threads, one trial per arm")
fig.tight_layout()
fig.savefig(os.path.join(out, "plots", "latency.png"), dpi=120)

# max_live trade-off.
ml = sorted(R["max_live"], key=lambda r: r["max_live"])
fig, ax = plt.subplots(figsize=(7, 4.2))
k = [r["max_live"] for r in ml]
# End to end is about the last agent's completion, so completion p99 runs on top of it: a wide pale
# line under a thin dashed one, both named.
ax.plot(k, [r["end_to_end_ms"] / 1000 for r in ml], "o-", color="#009E73", linewidth=5, markersize=10, alpha=0.45,
        label="end to end")
ax.plot(k, [r["completion_p99_ms"] / 1000 for r in ml], "s--", color="#E69F00",
        label="completion p99")
ax.plot(k, [r["completion_p50_ms"] / 1000 for r in ml], "^:", color="#56B4E9",
        label="completion p50")
ax.plot(k, [r["ttft_p50_ms"] / 1000 for r in ml], "v:", color="#CC79A7", label="first token p50")
ax.set_xscale("log")
ax.set_xticks(k, [str(x) for x in k])
ax.xaxis.set_minor_locator(plt.NullLocator())
ax.set_xlabel("max_live (branches decoded at once)")
ax.set_ylabel("seconds")
ax.set_title(f"shared fork, {n} agents: what max_live trades")
ax.legend(loc="center left", bbox_to_anchor=(1, 0.5))
fig.tight_layout()
fig.savefig(os.path.join(out, "plots", "max_live.png"), dpi=120)

g = R["goals"]
ex = R["extrapolated_baseline"]
env = R["environment"]
lines = [
    f"# {n} agents over one document: shared fork vs llama-server, latency percentiles", "",
    "## Method", "",
    f"- `swarmkv bench`, synthetic document of {p['doc_tokens']} tokens, {n} agents with "
    f"~6-token prompts, {p['n_predict']} greedy tokens each, {p['threads']} threads, one trial "
    "per arm (timings here vary by about ±15 %; each figure is one run, not a median).",
    "- Arms: `shared` (one unified-KV context, seq_cp fork, batched decode); "
    f"`server-concurrent` (llama-server, `-np {n}`, every request at once, kv-unified off); "
    "`server-sequential` (llama-server, one slot with its prompt cache, requests one after "
    "another); `none`, the reference (every agent re-prefills the document), measured at "
    f"{p['baseline_agents']} agents only: at {n} it alone would take about "
    f"{ex['end_to_end_ms'] / 60000:.0f} minutes, so its {n}-agent end-to-end is "
    f"extrapolated linearly (x {n / p['baseline_agents']:.2f}: its agents run one after "
    "another and each costs the same). The bench runs without a reference arm for the "
    f"{n}-agent point (so no answer comparison there).",
    "- Latency per agent from the run's start (model load and server start excluded): time "
    "to first token (TTFT) and completion, p50/p95/p99 by linear interpolation over the agents.",
    f"- Environment: {env['cpu']}, {env['cores']} cores; {env['engine'].split(' | ')[0]}; "
    f"model {os.path.basename(p['model'])}.", "",
    "## Results", "",
    "| arm | agents | end-to-end s | TTFT p50 / p95 / p99 s | completion p50 / p95 / p99 s "
    "| inter-token p50 ms |",
    "|---|---|---|---|---|---|",
]
for r in R["rows"]:
    lines.append(
        f"| {r['arm']} | {r['agents']} | {r['end_to_end_ms'] / 1000:.1f} | "
        f"{r['ttft_p50_ms'] / 1000:.1f} / {r['ttft_p95_ms'] / 1000:.1f} / "
        f"{r['ttft_p99_ms'] / 1000:.1f} | {r['completion_p50_ms'] / 1000:.1f} / "
        f"{r['completion_p95_ms'] / 1000:.1f} / {r['completion_p99_ms'] / 1000:.1f} | "
        f"{'—' if r['inter_token_p50_ms'] is None else format(r['inter_token_p50_ms'], '.0f')} |")
lines.append(f"| none (extrapolated) | {n} | {ex['end_to_end_ms'] / 1000:.0f} | — | "
             f"{ex['completion_p50_ms'] / 1000:.0f} / — / {ex['completion_p99_ms'] / 1000:.0f} | — |")
lines += [
    "", "![latency](plots/latency.png)", "",
    "## Goals", "",
    f"- shared ≥ 25× the baseline end to end: **{g['shared_vs_extrapolated_baseline_end_to_end']:.1f}×** "
    f"against the extrapolated baseline ({'met' if g['goal_25x_met'] else 'not met'}); measured at "
    f"{p['baseline_agents']} agents the ratio is {g['shared_vs_baseline_end_to_end_measured_at_8']:.1f}×.",
    f"- shared's p99 completion below the sequential server's p50: "
    f"**{g['shared_p99_completion_ms'] / 1000:.1f} s vs {g['server_sequential_p50_completion_ms'] / 1000:.1f} s** "
    f"({'met' if g['goal_p99_below_sequential_p50_met'] else 'not met'}).",
    f"- shared vs server-concurrent end to end: {g['shared_vs_server_concurrent_end_to_end']:.1f}×; "
    f"vs server-sequential: {g['shared_vs_server_sequential_end_to_end']:.1f}×.", "",
    "## max_live", "",
    "| max_live | end-to-end s | TTFT p50 / p99 s | completion p50 / p99 s | inter-token p50 ms |",
    "|---|---|---|---|---|",
]
for r in sorted(R["max_live"], key=lambda r: r["max_live"]):
    lines.append(f"| {r['max_live']} | {r['end_to_end_ms'] / 1000:.1f} | "
                 f"{r['ttft_p50_ms'] / 1000:.1f} / {r['ttft_p99_ms'] / 1000:.1f} | "
                 f"{r['completion_p50_ms'] / 1000:.1f} / {r['completion_p99_ms'] / 1000:.1f} | "
                 f"{r['inter_token_p50_ms']:.0f} |")
lines += ["", "![max_live](plots/max_live.png)", ""]
L = R.get("long")
if L:
    lat = L["latency"]
    lines += [
        f"## A long document on the second architecture", "",
        f"{L['agents']} agents x {p['n_predict']} tokens over a synthetic document of "
        f"{L['doc_tokens']} tokens on {L['model']} (sliding-window attention, 32k context), "
        f"shared fork, one trial: end to end {L['end_to_end_ms'] / 1000:.1f} s, of which the "
        f"prefill {L['prefill_ms'] / 1000:.1f} s; n_ctx {L['n_ctx']}, KV in use "
        f"{L['kv_bytes_peak'] / 1048576:.0f} MiB, peak RSS {L['peak_rss_kib'] / 1024:.0f} MiB; "
        f"TTFT p50/p99 {lat['ttft_ms']['p50'] / 1000:.1f} / {lat['ttft_ms']['p99'] / 1000:.1f} s, "
        f"completion p50/p99 {lat['completion_ms']['p50'] / 1000:.1f} / "
        f"{lat['completion_ms']['p99'] / 1000:.1f} s, inter-token p50 "
        f"{lat['inter_token_ms']['p50']:.0f} ms. {'ok' if L['ok'] else 'FAILED'}.", ""]
lines += ["## Reproduce", "", "```",
          R["command"], "```", "",
          "Per-section raw output (each `swarmkv bench` run's best_run.json, all_trials.csv and "
          "server logs) is in the section folders.", ""]
with open(os.path.join(out, "report.md"), "w") as f:
    f.write("\n".join(lines))
print(f"wrote {out}/report.md and {out}/plots")
