"""Plots and report for a `swarmkv bench` output directory.

usage: /usr/bin/python3 bench/plot_bench.py OUT_DIR [--command "how it was run"] [--notes ANALYSIS.md]

Reads OUT_DIR/best_run.json and OUT_DIR/all_trials.csv; writes
OUT_DIR/plots/*.png and OUT_DIR/report.md. Needs matplotlib (Debian's
python3-matplotlib, installed by scripts/lib.sh).
"""
import argparse
import csv
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--command", default="")
ap.add_argument("--notes", default="", help="a Markdown file of hand-written analysis, included as '## Analysis'")
args = ap.parse_args()

best = json.load(open(os.path.join(args.out, "best_run.json")))
rows = list(csv.DictReader(open(os.path.join(args.out, "all_trials.csv"))))
plots = os.path.join(args.out, "plots")
os.makedirs(plots, exist_ok=True)
arms = best["params"]["arms"]
results = best["results"]
made = []
PALETTE = ["#c44", "#48c", "#4a4", "#a6c", "#c92", "#2aa"]
COLOR = {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(arms)}


def save(fig, name):
    fig.tight_layout()
    fig.savefig(os.path.join(plots, name), dpi=110)
    plt.close(fig)
    made.append(name)


first = results[0]
point_rows = [r for r in rows if r["sweep_value"] == first["sweep_value"]]

# End-to-end per arm: every trial and the median.
fig, ax = plt.subplots(figsize=(6, 4))
for i, arm in enumerate(arms):
    vals = [float(r["end_to_end_ms"]) for r in point_rows if r["arm"] == arm]
    ax.scatter([i] * len(vals), vals, color="grey", zorder=3, label="trials" if i == 0 else None)
    ax.bar(i, statistics.median(vals) if vals else 0, color=COLOR[arm], alpha=0.8)
ax.set_xticks(range(len(arms)), arms)
ax.set_ylabel("end-to-end ms (bar: median)")
ax.set_title(f"End to end: {first['branches']} branches, {first['doc_tokens']}-token document")
ax.legend()
save(fig, "end_to_end.png")

# Activation latency per branch (median over trials).
n_branches = first["branches"]
fig, ax = plt.subplots(figsize=(7, 4))
width = 0.8 / len(arms)
for i, arm in enumerate(arms):
    meds = []
    for b in range(1, n_branches + 1):
        vals = [float(r[f"branch{b}_first_token_ms"]) for r in point_rows if r["arm"] == arm and r.get(f"branch{b}_first_token_ms")]
        meds.append(statistics.median(vals) if vals else 0)
    ax.bar([b + i * width for b in range(n_branches)], meds, width, label=arm)
ax.set_xticks([b + width * (len(arms) - 1) / 2 for b in range(n_branches)], [f"branch {b + 1}" for b in range(n_branches)])
ax.set_yscale("log")
ax.set_ylabel("ms from the branch's own start to its first token (log)")
ax.set_title("Activation latency per branch (median)")
ax.legend()
save(fig, "activation_per_branch.png")

# Per-branch breakdown, stacked, for the fork arm(s) and the reference (none).
parts = ["fork", "restore", "prompt", "generate"]
fig, ax = plt.subplots(figsize=(8, 4))
labels, bottoms = [], []
x = 0
for arm in arms:
    for b in range(1, n_branches + 1):
        sel = [r for r in point_rows if r["arm"] == arm]
        if not sel:
            continue
        bottom = 0.0
        if arm == "none":
            # The reference's first-token time includes its own re-prefill.
            pre = statistics.median(float(r[f"branch{b}_first_token_ms"]) - float(r[f"branch{b}_prompt_ms"]) for r in sel)
            ax.bar(x, pre, bottom=bottom, color="#c44", label="re-prefill" if x == 0 else None)
            bottom += pre
        for j, p in enumerate(parts):
            v = statistics.median(float(r[f"branch{b}_{p}_ms"]) for r in sel)
            ax.bar(x, v, bottom=bottom, color=["#fa3", "#3af", "#a3f", "#5b5"][j], label=p if (x == 0 or (arm != "none" and b == 1 and p in ("fork", "restore"))) else None)
            bottom += v
        labels.append(f"{arm}\nb{b}")
        x += 1
ax.set_xticks(range(len(labels)), labels, fontsize=8)
ax.set_ylabel("ms (median over trials)")
ax.set_yscale("symlog", linthresh=10)
ax.set_title("Per-branch breakdown")
handles, names = ax.get_legend_handles_labels()
uniq = dict(zip(names, handles))
ax.legend(uniq.values(), uniq.keys(), fontsize=8)
save(fig, "breakdown.png")

# Scaling plots when swept.
sweep = best["params"].get("sweep") or ""
if len(results) > 1 and sweep:
    key = sweep.split("=")[0]
    xs = [int(r["sweep_value"]) for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in arms:
        ax.plot(xs, [r["arms"][arm]["median_end_to_end_ms"] / 1000 for r in results], marker="o", label=arm)
    ax.set_xlabel(key)
    ax.set_ylabel("end-to-end s (median)")
    ax2 = ax.twinx()
    for arm in arms[1:]:
        ax2.plot(xs, [r["speedup"][arm]["end_to_end"] for r in results], "--", color=COLOR[arm], marker="x", label=f"speed-up {arm}")
    ax2.set_ylabel("speed-up vs none (the reference)")
    ax.legend(loc="upper left")
    ax2.legend(loc="lower right")
    ax.set_title(f"Scaling with {key}")
    save(fig, f"scaling_{key.replace('-', '_')}.png")

# report.md
env = best["environment"]
p = best["params"]
lines = [
    f"# SwarmKV benchmark: {', '.join(arms)}",
    "",
    "## Method",
    "",
    "- Arms: `none` (the reference) = every branch clears a context and prefills the whole document itself, then its prompt, then generates; "
    "`host` = the document is prefilled once, its KV state exported to a host buffer, and every branch copies it into its own buffer, "
    "restores it into a (warm, reused) context and decodes its prompt at positions prefix_len + i, then generates; "
    "`shared` = one context with a unified KV cache: the document is prefilled once on sequence 0, every branch is forked by "
    "`llama_memory_seq_cp` (no bytes copied) and all branches are decoded together, one `llama_decode` per step; "
    "`server-concurrent` = llama-server (same build and model) with one slot per branch, all requests at once; "
    "`server-sequential` = llama-server with one slot and prompt caching, requests one after another. Server requests send the same token ids "
    "(document + branch prompt, same chat template), greedy, streamed; server start-up (model load) is outside the timing, as our model load is.",
    f"- Same model, document, threads ({p['threads']} = {'all cores' if p['threads'] == 0 else 'as given'}); n_ctx per arm "
    "(the smallest multiple of 256 that fits its layout, unless --n-ctx), "
    "F16 K/V, flash attention off, greedy decoding for every arm.",
    f"- {p['trials']} trial(s), all arms in each, their order reversed on every other trial; {p['pause_ms']} ms idle pause between trials.",
    "- Best trial by the seed's rule: maximise 2·TTFT% + E2E% (percent reductions vs none, the reference; TTFT = branch-2 activation); "
    "medians over trials are reported next to it.",
    "- Branch-2 activation = time from the start of branch 2's own work to its first generated token "
    "(none: its redundant re-prefill + prompt; host: fork copy + restore + prompt).",
    "",
    "## Environment",
    "",
    f"- CPU: {env['cpu']} ({env['cores']} cores)",
    f"- Engine: {env['engine']}",
    f"- Model: {env['model_file']} ({env['model_description']}){', sha256 ' + env['model_sha256'] if env.get('model_sha256') else ''}",
    f"- Parameters: {p['branches']} branches, {p['doc']} document of {p['doc_tokens']} tokens, branch prompts of ~{p['branch_tokens']} tokens, "
    f"{p['n_predict']} generated token(s) per branch{', sweep ' + sweep if sweep else ''}",
    "",
    "## Results",
    "",
    "| point | arm | median end-to-end ms | median branch-2 activation ms | speed-up e2e (median) | vs host e2e | speed-up activation (median) | best trial e2e / activation | answers equal to none |",
    "|---|---|---|---|---|---|---|---|---|",
]


def point_label(r):
    return f"{sweep.split('=')[0]}={r['sweep_value']}" if sweep else f"{r['branches']} br, {r['doc_tokens']} tok"


def best_trials():
    """(result, point label, arm, best trial) for every point and arm that has one."""
    for r in results:
        for arm in arms:
            bt = (r["arms"].get(arm) or {}).get("best_trial")
            if bt:
                yield r, point_label(r), arm, bt


def identical_branches(a):
    bt = a.get("best_trial") if a else None
    if not bt:
        return "—"
    diffs = [b.get("first_difference_vs_reference", -1) for b in bt["branches"]]
    same = sum(d == -1 for d in diffs)
    tail = "" if same == len(diffs) else " (first difference at token " + ", ".join(str(d) for d in diffs if d != -1) + ")"
    return f"{same}/{len(diffs)}{tail}"


for r in results:
    point = point_label(r)
    for arm in arms:
        a = r["arms"].get(arm)
        if not a:
            continue
        s = r["speedup"].get(arm)
        sp = f"{s['end_to_end']:.2f}×" if s else "—"
        sa = f"{s['branch2_activation']:.1f}×" if s else "—"
        sb = f"{s['best_trial_end_to_end']:.2f}× / {s['best_trial_branch2_activation']:.1f}×" if s else "—"
        sh = f"{s['end_to_end_vs_host']:.2f}×" if s and "end_to_end_vs_host" in s else "—"
        lines.append(f"| {point} | {arm} | {a['median_end_to_end_ms']:.0f} | {a['median_branch2_activation_ms']:.1f} | {sp} | {sh} | {sa} | {sb} | {identical_branches(a) if arm != 'none' else '—'} |")

# Memory per arm and point (best trial).
lines += ["", "Memory (best trial; KV bytes per cell measured on the engine; *needed* = (document + every branch's prompt and "
          "generated tokens) × bytes/cell, the document counted once):", "",
          "| point | arm | n_ctx | contexts | KV in use MiB | KV allocated MiB | allocated / needed | host buffers MiB | peak RSS MiB |",
          "|---|---|---|---|---|---|---|---|---|"]
for r, point, arm, bt in best_trials():
    if "memory" not in bt:
        continue
    m = bt["memory"]
    ratio = m["kv_bytes_allocated"] / m["kv_bytes_needed"] if m.get("kv_bytes_needed") else 0
    rss = f"{bt['peak_rss_kib'] / 1024:.0f}" + ("" if bt.get("peak_rss_per_arm") else " (process)")
    lines.append(f"| {point} | {arm} | {bt['n_ctx']} | {m['contexts']} | {m['kv_bytes_peak'] / 2**20:.1f} | "
                 f"{m['kv_bytes_allocated'] / 2**20:.1f} | {ratio:.2f} | {m['host_buffer_bytes'] / 2**20:.1f} | {rss} |")

# Fork cost and batched decode steps of the shared arm.
if "shared" in arms:
    lines += ["", "Shared arm: fork cost per branch (sampler set-up + `seq_cp`, median over branches, best trial) and generation-only decode "
              "steps by the number of branches in the step (median ms per step):", "",
              "| point | fork ms per branch (median / max) | generation step ms by branches in the step |", "|---|---|---|"]
    for r in results:
        bt = (r["arms"].get("shared") or {}).get("best_trial")
        if not bt:
            continue
        point = point_label(r)
        forks = [b["timings_ms"]["fork"] for b in bt["branches"]]
        steps = ", ".join(f"{s['branches']}: {s['median_ms']:.1f} ({s['steps']} steps)" for s in bt.get("generation_step_ms_by_branches", []))
        lines.append(f"| {point} | {statistics.median(forks):.3f} / {max(forks):.3f} | {steps or '—'} |")
# The peer: llama-server arms next to ours, per point (best trial).
if any(a.startswith("server-") for a in arms):
    lines += ["", "## Against llama-server (same llama.cpp build, same tokens, greedy)", "",
              "Per arm (best trial): end-to-end, when the agents finished (from the arm's start: p50 / max), the branch phase "
              "(end-to-end minus the one document prefill; only for arms that prefill the document once), and for the server "
              "arms its own per-request counters: prompt tokens it processed (`prompt_n`) and reused from its cache (`cache_n`).", "",
              "| point | arm | end-to-end ms | agents done p50 / max ms | branch phase ms | server prompt_n (sum) | server cache_n (sum) | KV layout | answers equal to none |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r, point, arm, bt in best_trials():
        server = (bt.get("extra") or {}).get("server")
        pn = sum(q["prompt_n"] for q in server["requests"]) if server else None
        cn = sum(q["cache_n"] for q in server["requests"]) if server else None
        layout = "—"
        if server:
            tried = ", ".join(f"{'on' if t['kv_unified'] else 'off'} {t['end_to_end_ms']:.0f} ms" for t in server["kv_unified_tried"])
            layout = f"np {server['n_parallel']}, kvu {'on' if server['kv_unified'] else 'off'}" + (f" (tried: {tried})" if len(server["kv_unified_tried"]) > 1 else "")
        bp = f"{bt['branch_phase_ms']:.0f}" if bt.get("branch_phase_ms") else "—"
        lines.append(f"| {point} | {arm} | {bt['end_to_end_ms']:.0f} | {bt['agent_done_ms']['p50']:.0f} / {bt['agent_done_ms']['max']:.0f} | {bp} | "
                     f"{pn if pn is not None else '—'} | {cn if cn is not None else '—'} | {layout} | {identical_branches(r['arms'].get(arm)) if arm != 'none' else '—'} |")
    lines += ["", "Shared fork vs the peer (ratios of medians; > 1 means shared is faster):", "",
              "| point | e2e vs server-concurrent | e2e vs server-sequential | branch phase vs server-sequential |", "|---|---|---|---|"]
    for r in results:
        point = point_label(r)
        sp = r["speedup"].get("shared", {})
        fmt_ = lambda k: f"{sp[k]:.2f}×" if k in sp else "—"  # noqa: E731
        lines.append(f"| {point} | {fmt_('end_to_end_vs_server-concurrent')} | {fmt_('end_to_end_vs_server-sequential')} | {fmt_('branch_phase_vs_server-sequential')} |")

bt = first["arms"].get("host", {}).get("best_trial")
if bt:
    lines += ["", "Where a host branch's time goes (best trial, first point):", "",
              "| branch | fork ms | restore ms | prompt ms | first token ms | generate ms | total ms |", "|---|---|---|---|---|---|---|"]
    for b in bt["branches"]:
        lines.append(f"| {b['name']} | {b['timings_ms']['fork']:.1f} | {b['timings_ms']['restore']:.1f} | {b['timings_ms']['prompt']:.1f} | {b['timings_ms']['first_token']:.1f} | {b['timings_ms']['generate']:.1f} | {b['timings_ms']['total']:.1f} |")
    lines.append(f"\nPrefill {bt['prefill_ms']:.0f} ms ({bt['prefill_tokens_per_s']:.0f} tok/s), snapshot {bt['snapshot_bytes'] / 2**20:.1f} MiB exported in {bt['export_ms']:.1f} ms, peak RSS {bt['peak_rss_kib'] / 1024:.0f} MiB.")
lines += ["", "## Plots", ""] + [f"![{m}](plots/{m})" for m in made]
lines += [
    "",
    "## Limitations",
    "",
    "- CPU only, 2 cores, one machine class; timings on a shared machine are noisy: compare the arms of one run, not runs of different days.",
    "- `none` and `host`: the engine guard serialises branches (the seed's policy): branch N waits for branches 1…N−1; the activation metric starts at the branch's own work, not at the run's start. "
    "`shared` has no guard; its branches are decoded together, so their activation times overlap.",
    "- Contexts are reused by `none` and `host` (clear + restore / clear + re-prefill), so context creation is not part of either arm's cost; `shared` creates its one context inside the measured run.",
    "- `shared` answers are not bit-identical to the reference's: other branches' cells between the document and a branch's own change the rounding "
    "(measured ≤ 0.8 logits on SmolLM2-135M Q4_1), so greedy answers agree up to the first near-tie and may continue differently after it; `host` is bit-exact.",
    "- Peak RSS is reset before each arm (/proc/self/clear_refs) and read from VmHWM; model weights are mapped once and count in every arm.",
    "- Generation is per branch (batched under `shared`, where each branch's token still attends over the whole document on the CPU): "
    "with long answers the end-to-end speed-up shrinks towards the generation speed-up.",
]
if args.notes:
    lines += ["", "## Analysis", "", open(args.notes).read().strip()]
if args.command:
    lines += ["", "## Reproduce", "", "```sh", args.command, "```"]
open(os.path.join(args.out, "report.md"), "w").write("\n".join(lines) + "\n")
print(f"wrote {len(made)} plots and report.md to {args.out}")
