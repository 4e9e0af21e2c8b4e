"""Plots and report for a `swarmkv bench` output directory.

usage: /usr/bin/python3 bench/plot_bench.py OUT_DIR [--command "how it was run"] [--notes ANALYSIS.md] [--plots-only]

Reads OUT_DIR/best_run.json and OUT_DIR/all_trials.csv (result schema
version 2, or version 1 mapped to it on load); writes OUT_DIR/plots/*.png
and OUT_DIR/report.md. Needs matplotlib (Debian's python3-matplotlib,
installed by scripts/lib.sh); the look is bench/swarmbench/style.py's.
"""
import argparse
import csv
import json
import os
import statistics
import sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import style as ps  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--command", default="")
ap.add_argument("--notes", default="", help="a Markdown file of hand-written analysis, included as '## Analysis'")
ap.add_argument("--plots-only", action="store_true",
                help="write the plots and leave report.md as it is (a report an older plot_bench.py wrote for its run)")
args = ap.parse_args()

# Result schema version 1 (docs/result-schema.md) spelled the reference arm
# `baseline` and a branch's timings `<key>_ms` beside its other fields; the
# loaders below rename those to version 2's, so one reader serves both.
TIMING_KEYS = ("wait", "context", "prefill", "fork", "restore", "prompt", "first_token", "generate", "total", "done_at")


def v2_arm(name):
    return "none" if name == "baseline" else name


def v2_arms(arms):
    """An {arm: summary} map with version 2 arm names and best trials."""
    for a in arms.values():
        bt = a.get("best_trial")
        if not bt or "schema_version" in bt:
            continue
        bt["arm"] = v2_arm(bt["arm"])
        if "answers_match_baseline" in bt:
            bt["answers_match_reference"] = bt.pop("answers_match_baseline")
        for b in bt["branches"]:
            b["timings_ms"] = {k: b.pop(f"{k}_ms") for k in TIMING_KEYS if f"{k}_ms" in b}
            if "first_difference_vs_baseline" in b:
                b["first_difference_vs_reference"] = b.pop("first_difference_vs_baseline")
    return {v2_arm(k): v for k, v in arms.items()}


def load_best(path):
    """best_run.json in version 2 names, and whether it was written in version 1's."""
    best = json.load(open(path))
    v1 = "baseline" in best["params"]["arms"]
    best["params"]["arms"] = [v2_arm(a) for a in best["params"]["arms"]]
    for summary in best["results"] + [best]:  # best_run.json repeats the first point's arms at the top
        if "arms" in summary:
            summary["arms"] = v2_arms(summary["arms"])
    return best, v1


def load_trials(path):
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        r["arm"] = v2_arm(r["arm"])
        if "answers_match_baseline" in r:
            r["answers_match_reference"] = r.pop("answers_match_baseline")
    return rows


best, was_v1 = load_best(os.path.join(args.out, "best_run.json"))
# A version 1 run's report and command call the reference `baseline`: its legends give both names.
NAMES = {"none": "none (baseline)"} if was_v1 else {}
rows = load_trials(os.path.join(args.out, "all_trials.csv"))
plots = os.path.join(args.out, "plots")
os.makedirs(plots, exist_ok=True)
arms = best["params"]["arms"]
fork_arms = [a for a in arms if a != "none"]
results = best["results"]
sweep = best["params"].get("sweep") or ""
sweep_key = sweep.split("=")[0]
# The most interesting point: the most branches or the longest document.
largest = max(results, key=lambda r: (r["branches"], r["doc_tokens"]))
made = []


def number(cell):
    return float(cell) if cell not in ("", None) else None


def trials(r, arm, column, scale=1.0):
    """One CSV column at point r for one arm, every trial."""
    vals = [number(row[column]) for row in rows if row["sweep_value"] == r["sweep_value"] and row["arm"] == arm]
    return [v / scale for v in vals if v is not None]


def workload():
    """What was run, for the figure titles."""
    p = best["params"]
    branches = sorted({r["branches"] for r in results})
    docs = sorted({r["doc_tokens"] for r in results})
    b = ", ".join(map(str, branches)) + (" branch" if branches == [1] else " branches")
    d = f"document of {', '.join(map(str, docs))} tokens"
    gen = f"{p['n_predict']} generated token{'' if p['n_predict'] == 1 else 's'} per branch"
    model = os.path.basename(best["environment"].get("model_file", "")).removesuffix(".gguf")
    return f"{model}: {b}, {d}, {gen}"


def median_of():
    n = best["params"]["trials"]
    return "1 trial" if n == 1 else f"median of {n} trials"


def point_name(r):
    return f"{r['branches']} branches, {r['doc_tokens']}-token document"


X_LABEL = {"branches": "branches", "doc-tokens": "document tokens"}.get(sweep_key, "")
ticks = [r["sweep_value"] for r in results] if sweep else [point_name(r) for r in results]
has_speedup = "none" in arms and bool(fork_arms)


def marker(bars):
    """What shows the median in a ps.grouped() panel."""
    return "bar" if bars else "large dot"


def median_ms(values):
    return statistics.median(values) if values else None


def summary(r, arm, key):
    return (r["arms"].get(arm) or {}).get(key)


def save(fig, name, what=""):
    ps.title(fig, workload() + (f"\n{what}" if what else ""))
    ps.save(fig, os.path.join(plots, name))
    made.append(name)


def plot_end_to_end():
    """Every point: end-to-end seconds per arm, and the speed-up vs none in its own panel
    (below it when swept, beside it for one point)."""
    panels = 2 if has_speedup else 1
    if len(results) > 1:
        fig, axes = ps.figure(panels, 1, width=max(7.0, 3.5 + 0.35 * len(results) * len(arms)))
        axes = [row[0] for row in axes]
    else:
        fig, axes = ps.figure(1, panels, width=3.2 * panels + 1.5, height_per_row=3.6)
        axes = list(axes[0])
    ax = axes[0]
    bars = ps.grouped(ax, results, arms, lambda r, a: (summary(r, a, "median_end_to_end_ms") or 0) / 1000,
                      lambda r, a: trials(r, a, "end_to_end_ms", 1000), labels=ticks)
    ax.set_ylabel("end-to-end s")
    ps.panel_title(ax, f"End-to-end time per arm ({marker(bars)}: {median_of()}; dots: each trial)")
    reference = []
    if has_speedup:
        ax = axes[1]
        drawn = ps.grouped_points(ax, results, fork_arms, lambda r, a: (r["speedup"].get(a) or {}).get("end_to_end"),
                                  labels=ticks, value_fmt=lambda v: f"{v:.2f}×")
        ps.value_scale(ax, drawn, suffix="×", bars=False, base=1.0)
        reference = [ps.reference_line(ax, legend=len(results) > 1)]
        ax.set_ylabel("speed-up vs none")
        ps.panel_title(ax, "End-to-end speed-up vs none (median of none / median of the arm; above 1× = faster)")
    if len(results) > 1:
        ps.arm_legend(axes[0], arms, dots="one trial", names=NAMES, points=not bars)
    else:
        ps.arm_legend(axes[-1], arms, dots="one trial", extra=reference, names=NAMES, points=not bars)
    for ax in axes:
        ax.set_xlabel(X_LABEL)
    save(fig, "end_to_end.png")


def plot_activation():
    """Branch-2 activation at every point (when swept), and every branch's activation at the largest point."""
    n = largest["branches"]
    swept = len(results) > 1
    fig, axes = ps.figure(2 if swept else 1, 1, width=min(14.0, max(7.0, 3.5 + 0.16 * n * len(arms))))
    all_bars = True
    if swept:
        ax = axes[0][0]
        bars = ps.grouped(ax, results, arms, lambda r, a: summary(r, a, "median_branch2_activation_ms"),
                          lambda r, a: trials(r, a, "branch2_activation_ms"), labels=ticks)
        all_bars &= bars
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel("ms")
        ax.set_title(f"Branch-2 activation (branch 1 when alone) per arm ({marker(bars)}: {median_of()})")
    ax = axes[-1][0]
    column = lambda b: f"branch{b}_first_token_ms"  # noqa: E731
    bars = ps.grouped(ax, list(range(1, n + 1)), arms, lambda b, a: median_ms(trials(largest, a, column(b))),
                      lambda b, a: trials(largest, a, column(b)))
    all_bars &= bars
    ax.set_xlabel("branch")
    ax.set_ylabel("ms")
    ax.set_title(f"Every branch's activation at {point_name(largest)} ({marker(bars)}: {median_of()})")
    ps.arm_legend(axes[0][0], arms, dots="one trial", names=NAMES, points=not all_bars)
    fig.text(0.0, 0.0, "Activation: from the start of the branch's own work to its first generated token.",
             fontsize=7.5, color="#555555", va="top")
    save(fig, "activation_per_branch.png")


def plot_breakdown():
    """Where a branch's time goes at the largest point: each step's median over branches and trials."""
    steps = ["re-prefill", "fork", "restore", "prompt", "generate"]

    def step_ms(arm, step):
        out = []
        for b in range(1, largest["branches"] + 1):
            if step != "re-prefill":
                out += trials(largest, arm, f"branch{b}_{step}_ms")
            elif arm == "none":
                # The reference's first token includes its own re-prefill; no other arm has one.
                out += [f - p for f, p in zip(trials(largest, arm, f"branch{b}_first_token_ms"),
                                              trials(largest, arm, f"branch{b}_prompt_ms"))]
        return out

    steps = [s for s in steps if any(v > 0 for a in arms for v in step_ms(a, s))]
    fig, axes = ps.figure(1, 1, width=max(7.0, 3.5 + 0.3 * len(steps) * len(arms)), height_per_row=3.6)
    ax = axes[0][0]
    # The steps differ by up to 10^5: then points on a log axis (ps.grouped), as bars would hide the small ones.
    bars = ps.grouped(ax, steps, arms, lambda s, a: median_ms(step_ms(a, s)), lambda s, a: step_ms(a, s))
    ax.set_ylabel("ms per branch")
    server_note = "; server arms' prompt: the document too, unless cached" if any(a.startswith("server-") for a in arms) else ""
    ax.set_xlabel(f"step of a branch\n(no {marker(bars)}: the arm has no such step{server_note})")
    ps.panel_title(ax, f"Where a branch's time goes at {point_name(largest)} ({marker(bars)}: median over branches "
                       "and trials)")
    ps.arm_legend(ax, arms, dots="one branch in one trial", names=NAMES, points=not bars)
    save(fig, "breakdown.png")


def plot_scaling():
    """End-to-end and its speed-up vs none against the swept value, in two panels sharing x."""
    xs = [int(r["sweep_value"]) for r in results]
    fig, axes = ps.figure(2 if has_speedup else 1, 1, width=8.5, sharex=True)
    ax = axes[0][0]
    drawn = []
    for arm in arms:
        ys = [(summary(r, arm, "median_end_to_end_ms") or 0) / 1000 for r in results]
        ax.plot(xs, ys, marker="o", color=ps.colour(arm), linewidth=2)
        drawn += ys
    ps.value_scale(ax, drawn, bars=False)
    ax.set_ylabel("end-to-end s")
    ax.set_title(f"End-to-end time against {X_LABEL} ({median_of()})")
    ps.arm_legend(ax, arms, lines=True, names=NAMES)
    if has_speedup:
        ax = axes[1][0]
        drawn = []
        for arm in fork_arms:
            ys = [(r["speedup"].get(arm) or {}).get("end_to_end") for r in results]
            ax.plot(xs, ys, marker="o", color=ps.colour(arm), linewidth=2)
            drawn += ys
        ps.value_scale(ax, drawn, suffix="×", base=1.0)
        ps.reference_line(ax)
        ax.set_ylabel("speed-up vs none")
        ax.set_title("End-to-end speed-up vs none (median of none / median of the arm)")
    ax = axes[-1][0]
    ps.value_scale(ax, xs, axis="x", bars=False, pad=1.25)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel(X_LABEL)
    save(fig, f"scaling_{sweep_key.replace('-', '_')}.png")



def engine_summary(p):
    """The K/V type, flash attention and GPU layers of a run (params.engine; older runs lack it)."""
    e = p.get("engine")
    if not e:
        return "F16 K/V, flash attention off"
    gpu = f", {e['offloaded_layers']} layers on the GPU" if e.get("offloaded_layers") else ""
    return f"{e['kv_type'].upper()} K/V, flash attention {'on' if e['flash_attn'] else 'off'}{gpu}"

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


def report_head():
    """report.md's title, method, environment and the results table's head."""
    env = best["environment"]
    p = best["params"]
    return [
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
        f"{engine_summary(p)}, greedy decoding for every arm.",
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


def results_rows():
    """One row per point and arm: medians, speed-ups, answers."""
    lines = []
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
    return lines


def memory_table():
    """Memory per arm and point (best trial)."""
    lines = ["", "Memory (best trial; KV bytes per cell measured on the engine; *needed* = (document + every branch's prompt and "
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
    return lines


def shared_table():
    """The shared arm's fork cost and batched decode steps."""
    lines = []
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
    return lines


def peer_tables():
    """The peer: llama-server arms next to ours, per point (best trial)."""
    lines = []
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
    return lines


def host_breakdown():
    """Where a host branch's time goes (best trial, first point)."""
    lines = []
    bt = results[0]["arms"].get("host", {}).get("best_trial")
    if bt:
        lines += ["", "Where a host branch's time goes (best trial, first point):", "",
                  "| branch | fork ms | restore ms | prompt ms | first token ms | generate ms | total ms |", "|---|---|---|---|---|---|---|"]
        for b in bt["branches"]:
            lines.append(f"| {b['name']} | {b['timings_ms']['fork']:.1f} | {b['timings_ms']['restore']:.1f} | {b['timings_ms']['prompt']:.1f} | {b['timings_ms']['first_token']:.1f} | {b['timings_ms']['generate']:.1f} | {b['timings_ms']['total']:.1f} |")
        lines.append(f"\nPrefill {bt['prefill_ms']:.0f} ms ({bt['prefill_tokens_per_s']:.0f} tok/s), snapshot {bt['snapshot_bytes'] / 2**20:.1f} MiB exported in {bt['export_ms']:.1f} ms, peak RSS {bt['peak_rss_kib'] / 1024:.0f} MiB.")
    return lines


def write_report():
    """report.md: method, environment, every table, the plots, limitations, analysis, command."""
    lines = report_head() + results_rows() + memory_table() + shared_table() + peer_tables() + host_breakdown()
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


plot_end_to_end()
plot_activation()
plot_breakdown()
if len(results) > 1 and sweep:
    plot_scaling()
if args.plots_only:
    print(f"wrote {len(made)} plots to {plots}")
else:
    write_report()
    print(f"wrote {len(made)} plots and report.md to {args.out}")
