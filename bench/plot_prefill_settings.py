"""Plots and report for a bench/prefill_settings.py output directory.

usage: /usr/bin/python3 bench/plot_prefill_settings.py OUT_DIR [--notes ANALYSIS.md]

Reads OUT_DIR/results.json and command.txt; writes OUT_DIR/plots/*.png and
OUT_DIR/report.md (the tables of every section, then the analysis).
"""
import os
import statistics
import sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report, style as ps  # noqa: E402

args, res = report.results_arguments()
plots = ps.Plots(args.out)
save, made = plots.save, plots.made
configs = res["configs"]
base = configs[0]
trials = res["params"]["trials"]
doc_tokens = res["params"]["doc_tokens"]
med = statistics.median


def short(c):
    return c.replace(" ", "\n")


# ---------------------------------------------------------------- parity
if "parity" in res:
    p = res["parity"]
    fig, ax = ps.figure(2, 1, width=9, height_per_row=2.8)
    arms = ["swarmkv", "llama-bench"]
    key = {"swarmkv": "ours", "llama-bench": "llama_bench"}
    drawn = ps.grouped_bars(ax[0][0], configs, arms, lambda g, a: med(p[g][key[a]]),
                            trials=lambda g, a: p[g][key[a]], labels=[short(c) for c in configs],
                            value_fmt=lambda v: f"{v:.0f}")
    ps.value_scale(ax[0][0], drawn)
    ax[0][0].set_ylabel("prefill tokens/s")
    ps.panel_title(ax[0][0], f"Prefill of {doc_tokens} tokens: SwarmKV vs llama-bench at equal settings "
                             f"(2 threads, n_batch = n_ubatch = 512; median of {trials})")
    ps.arm_legend(ax[0][0], arms, dots="each trial")
    ratios = {c: med(p[c]["ours"]) / med(p[c]["llama_bench"]) for c in configs}
    drawn = ps.grouped_points(ax[1][0], configs, ["swarmkv"], lambda c, _a: ratios[c],
                              labels=[short(c) for c in configs], value_fmt=lambda v: f"{v:.2f}")
    ps.value_scale(ax[1][0], drawn + [0.95], bars=False, base=1.0)
    reference = ps.reference_line(ax[1][0], label="1 = as fast as llama-bench", legend=False)
    line = ax[1][0].axhline(0.95, color="#D55E00", linestyle="--", linewidth=1, label="goal 0.95")
    ax[1][0].legend(handles=[reference, line], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax[1][0].set_ylabel("SwarmKV / llama-bench")
    ps.panel_title(ax[1][0], "Ratio of the medians")
    save(fig, "prefill_parity.png")

# ---------------------------------------------------------------- grid
if "grid" in res:
    g = res["grid"]
    fig, ax = ps.figure(1, 2, width=11, height_per_row=3.4)
    for k, (test, what) in enumerate((("pp512", "prefill 512 tokens"), ("tg32", "generate 32 tokens"))):
        a = ax[0][k]
        vals = [med(g[c][test]) for c in configs]
        a.bar(range(len(configs)), vals, color=[ps.colour(c.split(" ")[0]) for c in configs], edgecolor=ps.EDGE,
              linewidth=0.6)
        for i, v in enumerate(vals):
            a.annotate(f"{v:.0f}", (i, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
        a.set_xticks(range(len(configs)), [short(c) for c in configs], fontsize=7)
        ps.value_scale(a, vals)
        a.set_ylabel("tokens/s")
        ps.panel_title(a, f"llama-bench {test}: {what} (median of {trials})")
    save(fig, "llama_bench_grid.png")


# ---------------------------------------------------------------- readme and agents16
def phases_plot(runs, name, what, keys):
    fig, ax = ps.figure(2, 1, width=9, height_per_row=3.0)
    names = list(runs)
    pre = [med(r[keys[0]] for r in runs[c]) / 1000 for c in names]
    rest = [med(r[keys[1]] for r in runs[c]) / 1000 for c in names]
    x = range(len(names))
    ax[0][0].bar(x, pre, color=ps.colour("prefill"), edgecolor=ps.EDGE, linewidth=0.6, label="document prefill")
    ax[0][0].bar(x, rest, bottom=pre, color=ps.colour("branches"), edgecolor=ps.EDGE, linewidth=0.6,
                 label="the agents (everything after the prefill)")
    for i, (a, b) in enumerate(zip(pre, rest)):
        ax[0][0].annotate(f"{a + b:.1f} s", (i, a + b), xytext=(0, 2), textcoords="offset points", ha="center",
                          fontsize=7)
    ax[0][0].set_xticks(list(x), [short(c) for c in names])
    ax[0][0].set_ylabel("seconds (median)")
    ax[0][0].set_ylim(0, max(a + b for a, b in zip(pre, rest)) * 1.15)
    ax[0][0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ps.panel_title(ax[0][0], f"{what}: end to end (median of {trials})")
    total0 = pre[0] + rest[0]
    sp_total = [total0 / (a + b) for a, b in zip(pre, rest)]
    sp_pre = [pre[0] / a for a in pre]
    drawn = ps.grouped_points(ax[1][0], names, ["prefill", "end to end"],
                              lambda c, arm: (sp_pre if arm == "prefill" else sp_total)[names.index(c)],
                              labels=[short(c) for c in names], value_fmt=lambda v: f"{v:.2f}×")
    ps.value_scale(ax[1][0], drawn, suffix="×", bars=False, base=1.0)
    reference = ps.reference_line(ax[1][0], label=f"1× = as fast as {names[0]}", legend=False)
    ax[1][0].set_ylabel(f"speed-up vs {names[0]}")
    ps.arm_legend(ax[1][0], ["prefill", "end to end"], points=True, extra=[reference])
    ps.panel_title(ax[1][0], f"Speed-up against {names[0]} (the old default)")
    save(fig, name)


if "readme" in res:
    phases_plot(res["readme"], "readme_pipeline.png", "README pipeline (4 agents, snapshot store off)",
                ("prefill_ms", "branch_phase_ms"))
if "agents16" in res:
    phases_plot(res["agents16"], "agents16.png", "16 agents over the README's document, shared fork, "
                                                 "32 tokens each", ("prefill_ms", "branch_phase_ms"))

# ---------------------------------------------------------------- quality
if "quality" in res:
    q = res["quality"]
    fig, ax = ps.figure(1, 1, width=6, height_per_row=3.0)
    names = list(q)
    a = ax[0][0]
    a.bar(range(len(names)), [q[m]["ppl"] for m in names], yerr=[q[m]["ppl_stderr"] for m in names],
          color=[ps.colour(m) for m in names], edgecolor=ps.EDGE, linewidth=0.6, capsize=4)
    for i, m in enumerate(names):
        a.annotate(f"{q[m]['ppl']:.2f}", (i, q[m]["ppl"]), xytext=(8, 2), textcoords="offset points", fontsize=7)
    a.set_xticks(range(len(names)), [f"{m}\n{q[m]['size_bytes'] / 1e6:.0f} MB" for m in names])
    a.set_ylabel("perplexity (lower is better)")
    ps.panel_title(a, f"llama-perplexity on {os.path.basename(res['params']['text'])}, 512-token chunks")
    save(fig, "perplexity.png")

# ---------------------------------------------------------------- report
lines = ["# Prefill at this machine's limit: engine settings and weight formats", "",
         f"CPU: {res['environment']['cpu']} ({res['environment']['cores']} cores). "
         f"Engine: {res['environment']['engine'].split(' | ')[0]}. {trials} trials per arm, arms interleaved, "
         "order reversed every other trial; medians.", "",
         "Models: " + ", ".join(f"`{k}` = `{os.path.basename(v)}`" for k, v in res["models"].items()), "",
         *report.reproduce(args.out)]


def table(head, rows):
    lines.extend(report.md_table(head, rows) + [""])


if "parity" in res:
    p = res["parity"]
    lines += [f"## SwarmKV's prefill vs llama-bench ({doc_tokens} tokens, depth 0)", ""]
    table(["config", "SwarmKV tok/s", "llama-bench tok/s", "ratio"],
          [[c, f"{med(p[c]['ours']):.1f}", f"{med(p[c]['llama_bench']):.1f}",
            f"{med(p[c]['ours']) / med(p[c]['llama_bench']):.3f}"] for c in configs])
if "grid" in res:
    g = res["grid"]
    lines += ["## llama-bench grid", ""] + ([res["grid_note"], ""] if "grid_note" in res else [])
    table(["config", "pp512 tok/s", "tg32 tok/s"],
          [[c, f"{med(g[c]['pp512']):.1f}", f"{med(g[c]['tg32']):.1f}"] for c in configs])
if "readme" in res:
    r = res["readme"]
    b = r[base][0]["answers"]
    lines += ["## README pipeline, snapshot store off", ""]
    table(["config", "prefill ms", "prefill tok/s", "vs " + base, "total ms", "agents ms", "snapshot MB",
           f"answers = {base}'s"],
          [[c, f"{med(x['prefill_ms'] for x in r[c]):.0f}",
            f"{r[c][0]['prefix_tokens'] / med(x['prefill_ms'] for x in r[c]) * 1000:.1f}",
            f"{med(x['prefill_ms'] for x in r[base]) / med(x['prefill_ms'] for x in r[c]):.2f}×",
            f"{med(x['total_ms'] for x in r[c]):.0f}", f"{med(x['branch_phase_ms'] for x in r[c]):.0f}",
            f"{r[c][0]['snapshot_bytes'] / 1e6:.1f}",
            f"{sum(r[c][0]['answers'][k] == b[k] for k in b)}/{len(b)}"] for c in configs])
if "agents16" in res:
    a = res["agents16"]
    names = list(a)
    a0 = names[0]
    lines += ["## 16 agents over the README's document, shared fork, 32 tokens each", ""]
    table(["config", "prefill ms", "total ms", "vs " + a0, "agents ms", "vs " + a0],
          [[c, f"{med(x['prefill_ms'] for x in a[c]):.0f}", f"{med(x['total_ms'] for x in a[c]):.0f}",
            f"{med(x['total_ms'] for x in a[a0]) / med(x['total_ms'] for x in a[c]):.2f}×",
            f"{med(x['branch_phase_ms'] for x in a[c]):.0f}",
            f"{med(x['branch_phase_ms'] for x in a[a0]) / med(x['branch_phase_ms'] for x in a[c]):.2f}×"]
           for c in names])
if "quality" in res:
    q = res["quality"]
    lines += [f"## Perplexity ({os.path.basename(res['params']['text'])}, 512-token chunks)", ""]
    table(["weights", "PPL", "±", "file MB"],
          [[m, f"{q[m]['ppl']:.4f}", f"{q[m]['ppl_stderr']:.4f}", f"{q[m]['size_bytes'] / 1e6:.1f}"] for m in q])
lines += ["## Plots", ""] + [f"![{m}](plots/{m})" for m in made] + [""]
if args.notes:
    lines += ["## Analysis", "", open(args.notes).read().strip(), ""]
open(os.path.join(args.out, "report.md"), "w").write("\n".join(lines))
print(f"wrote {len(made)} plots and report.md in {args.out}")
