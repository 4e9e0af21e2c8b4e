"""OUT/report.md and OUT/plots/ from bench/cluster_q8.py's OUT/results.json.

usage: /usr/bin/python3 bench/plot_cluster_q8.py OUT
"""
import json
import os
import statistics
import sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report, style as ps  # noqa: E402

out = sys.argv[1]
res = json.load(open(os.path.join(out, "results.json")))
os.makedirs(os.path.join(out, "plots"), exist_ok=True)
KV = ("f16", "q8_0")
med = statistics.median
lines = []


def table(head, rows, csv_name=None):
    """A markdown table in the report and, named, the same rows as OUT/<csv_name>.csv."""
    if csv_name:
        report.write_csv(os.path.join(out, csv_name + ".csv"), head,
                         [[str(x).replace("**", "") for x in r] for r in rows])
    lines.extend(report.md_table(head, rows) + [""])


def mbit(bytes_per_s):
    v = bytes_per_s * 8
    return f"{v / 1e9:.2f} Gbit/s" if v >= 1e9 else f"{v / 1e6:.1f} Mbit/s"


env, params = res["environment"], res["params"]
lines += ["# f16 against q8_0 K/V on the exact kernels: half-size snapshots", "",
          f"CPU: {env['cpu']} ({env['cores']} cores), kernel {env['kernel']}. Engine: {env['engine']}. "
          f"Models: {', '.join(f'{k} = `{v}`' for k, v in params['models'].items())}. {params['threads']} threads, "
          f"exact mode (the default: flash attention on the batch-invariant kernel), {params['trials']} trials per "
          "arm, arms alternated within each trial; medians. What was decided from it (q8_0 the default where "
          "flash attention runs; no sub-8-bit wire encoding): NOTES.md, \"Half-size snapshots\".", "",
          *report.reproduce(out)]

# ---------------------------------------------------------------- prefill and bytes
pre = res.get("prefill", [])
by = {(r["model"], r["length"], r["kv"]): r for r in pre}
models = list(params["models"])


def measured_pairs():
    """(model, length, f16 row, q8_0 row) of the prefill section, where both were measured."""
    for m in models:
        for L in params["lengths"]:
            if (m, L, "f16") in by and (m, L, "q8_0") in by:
                yield m, L, by[(m, L, "f16")], by[(m, L, "q8_0")]


def per_model_lengths(samples, ylabel, title, name, dots=None):
    """One panel per model: per document length, f16 and q8_0 bars of the median of samples(row) (a row
    of the prefill section), each sample as a dot when `dots` names them."""
    fig, axes = ps.figure(1, len(models), width=4.2 * len(models) + 1.5)
    for i, m in enumerate(models):
        a = axes[0][i]
        groups = [L for L in params["lengths"] if (m, L, "f16") in by]
        ps.grouped(a, groups, list(KV), lambda L, kv, m=m: med(samples(by[(m, L, kv)])),
                   (lambda L, kv, m=m: samples(by[(m, L, kv)])) if dots else None,
                   labels=[f"{by[(m, L, 'f16')]['prefix_tokens']:,}" for L in groups], value_fmt=lambda v: f"{v:.0f}")
        a.set_xlabel("prefix tokens")
        a.set_ylabel(ylabel)
        ps.panel_title(a, m)
    ps.arm_legend(axes[0][-1], list(KV), dots=dots, names={"f16": "f16 K/V", "q8_0": "q8_0 K/V"})
    ps.title(fig, title)
    ps.save(fig, os.path.join(out, "plots", name))


if pre:
    lines += ["## Snapshot bytes and prefill speed", "",
              "`swarmkv prefill DOC --out FILE --kv-type KV --snapshot-cache off`, a synthetic document (the seed's "
              "phrase). Bytes: the file's size. Loopback fetch: swarmkv_bus_bench against a redis-server on "
              "127.0.0.1, median of its trials.", ""]
    rows = []
    for m, L, f, q in measured_pairs():
        tf = f["prefix_tokens"] / (med(f["prefill_ms"]) / 1000)
        tq = q["prefix_tokens"] / (med(q["prefill_ms"]) / 1000)
        rows.append([m, f"{f['prefix_tokens']:,}", f"{f['file_bytes'] / 1e6:.1f}", f"{q['file_bytes'] / 1e6:.1f}",
                     f"{q['file_bytes'] / f['file_bytes']:.3f}", f"{tf:.0f}", f"{tq:.0f}", f"**{tq / tf:.2f}**",
                     f"{f['loopback']['fetch_ms_median']:.0f}", f"{q['loopback']['fetch_ms_median']:.0f}"])
    table(["model", "prefix tokens", "f16 MB", "q8_0 MB", "bytes q8_0/f16", "f16 tok/s", "q8_0 tok/s",
           "speed q8_0/f16", "f16 fetch ms", "q8_0 fetch ms"], rows, "prefill")

    per_model_lengths(lambda r: [r["prefix_tokens"] / (x / 1000) for x in r["prefill_ms"]], "prefill tokens/s",
                      "Prefill speed, exact kernels: f16 against q8_0 K/V", "prefill.png", dots="one trial")

# ---------------------------------------------------------------- break-even
transfer = None
if res.get("transfer"):
    p = os.path.join(out, res["transfer"]["folder"], "results.json")
    transfer = json.load(open(p)) if os.path.exists(p) else None
if pre:
    lines += ["## Break-even link rate: fetch the snapshot or prefill the document", "",
              "A worker fetches instead of prefilling when the link delivers more than b × v bytes per second "
              "(b: the snapshot's bytes per token, v: the prefill's tokens per second; "
              "bench/results/cluster-transfer/ derives it). Both measured above, in this run.", ""]
    rows = []
    for m, L, f, q in measured_pairs():
        be = {}
        for kv, r in (("f16", f), ("q8_0", q)):
            b = r["file_bytes"] / r["prefix_tokens"]
            v = r["prefix_tokens"] / (med(r["prefill_ms"]) / 1000)
            be[kv] = b * v
        rows.append([m, f"{f['prefix_tokens']:,}", f"{f['file_bytes'] / f['prefix_tokens']:,.0f}",
                     f"{q['file_bytes'] / q['prefix_tokens']:,.0f}", mbit(be["f16"]), mbit(be["q8_0"]),
                     f"{be['q8_0'] / be['f16']:.2f}"])
    table(["model", "prefix tokens", "f16 bytes/token", "q8_0 bytes/token", "f16 break-even", "q8_0 break-even",
           "q8_0/f16"], rows, "breakeven")
    if transfer and transfer.get("links"):
        snap = transfer["snapshot"]
        lines += [f"Over the shaped links of bench/results/cluster-transfer/ (two network namespaces, a veth pair, "
                  f"`tc tbf` on both ends), measured in this run with the {snap['doc_tokens']:,}-token q8_0 "
                  f"snapshot of {models[0]} ({snap['file_bytes'] / 1e6:.1f} MB); the f16 column moves the f16 "
                  "snapshot of the same length (prefill section) at the same delivered rate.", ""]
        L = min(params["lengths"], key=lambda x: abs(x - snap["doc_tokens"]))
        f, q = by.get((models[0], L, "f16")), by.get((models[0], L, "q8_0"))
        rows = []
        for row in transfer["links"]["rates"]:
            rate = row["bench"]["fetch_mb_s"] * 1e6
            name = row["rate"] if row["rate"] != "unlimited" else "veth, no limit"
            cells = [name, mbit(rate)]
            for kv, r in (("f16", f), ("q8_0", q)):
                fetch = r["file_bytes"] / rate * 1000
                pre_ms = med(r["prefill_ms"])
                cells += [f"{fetch:,.0f}", f"{pre_ms:,.0f}", "fetch" if fetch < pre_ms else "prefill"]
            rows.append(cells)
        table(["link", "delivered", "f16 fetch ms", "f16 prefill ms", "f16 faster", "q8_0 fetch ms",
               "q8_0 prefill ms", "q8_0 faster"], rows, "links")

    per_model_lengths(lambda r: [r["file_bytes"] / (x / 1000) * 8 / 1e6 for x in r["prefill_ms"]],
                      "break-even link rate, Mbit/s",
                      "Fetching beats prefilling above this link rate (lower: a slower link suffices)", "breakeven.png")

# ---------------------------------------------------------------- agents16
a16 = res.get("agents16", {})
if a16:
    lines += ["## 16 agents, shared fork", "",
              f"`swarmkv run {params['pipeline']} --fork shared --kv-type KV --snapshot-cache off` (16 agents × 32 "
              "tokens over the README's document), then one `--fork none` run with q8_0 K/V (every agent "
              "re-prefills the document: the reference exact mode must equal; f16's is in "
              "bench/results/exact-default/).", ""]
    rows = []
    for m, d in a16.items():
        sh = d["shared"]
        f, q = sh["f16"], sh["q8_0"]
        tot = {kv: med(r["total_ms"] for r in sh[kv]) for kv in KV}
        br = {kv: med(r["branch_phase_ms"] for r in sh[kv]) for kv in KV}
        pf = {kv: med(r["prefill_ms"] for r in sh[kv]) for kv in KV}
        names = list(f[0]["tokens"])
        same_kv = sum(f[0]["tokens"][n] == q[0]["tokens"][n] for n in names)
        exact = sum(sh["q8_0"][0]["tokens"][n] == d["none"]["q8_0"]["tokens"][n] for n in names)
        repeat = all(r["tokens"] == sh[kv][0]["tokens"] for kv in KV for r in sh[kv])
        rows.append([m, f"{f[0]['prefix_tokens']:,}", f"{pf['f16']:,.0f} / {pf['q8_0']:,.0f}",
                     f"{br['f16']:,.0f} / {br['q8_0']:,.0f}", f"{tot['f16']:,.0f} / {tot['q8_0']:,.0f}",
                     f"**{tot['q8_0'] / tot['f16']:.2f}**", f"{same_kv}/{len(names)}",
                     f"{exact}/{len(names)}", "yes" if repeat else "**no**"])
    table(["model", "prefix tokens", "prefill ms f16 / q8_0", "branch phase ms f16 / q8_0",
           "end to end ms f16 / q8_0", "end to end q8_0/f16", "q8_0 answers = f16's", "q8_0: shared = none",
           "every trial the same answers"], rows, "agents16")
    fig, axes = ps.figure(1, 2, width=10)
    for a, key, what in ((axes[0][0], "total_ms", "end to end"), (axes[0][1], "branch_phase_ms", "branch phase")):
        ps.grouped(a, list(a16), list(KV), lambda m, kv, key=key: med(r[key] for r in a16[m]["shared"][kv]) / 1000,
                   lambda m, kv, key=key: [r[key] / 1000 for r in a16[m]["shared"][kv]],
                   value_fmt=lambda v: f"{v:.1f}")
        a.set_ylabel("seconds")
        ps.panel_title(a, what)
    ps.arm_legend(axes[0][1], list(KV), dots="one trial", names={"f16": "f16 K/V", "q8_0": "q8_0 K/V"})
    ps.title(fig, "16 agents × 32 tokens, shared fork, exact kernels")
    ps.save(fig, os.path.join(out, "plots", "agents16.png"))

# ---------------------------------------------------------------- ppl
ppl = res.get("ppl", {})
if ppl:
    lines += ["## Perplexity", "",
              f"`llama-perplexity -f {params['text']} -c 512 -b 512 -fa on -ctk KV -ctv KV --no-repack` with "
              "GGML_CPU_FA_BATCH_INVARIANT=1: the exact attention kernel over f16 or q8_0 K/V (llama-perplexity "
              "runs llama.cpp's own matrix products, not the sgemm patch's single-row path).", ""]
    rows = []
    for m in models:
        f, q = ppl.get(f"{m} f16"), ppl.get(f"{m} q8_0")
        if f and q:
            rows.append([m, f"{f['ppl']:.4f} ± {f['ppl_stderr']:.4f}", f"{q['ppl']:.4f} ± {q['ppl_stderr']:.4f}",
                         f"{(q['ppl'] / f['ppl'] - 1) * 100:+.3f} %"])
    table(["model", "f16 K/V", "q8_0 K/V", "q8_0 against f16"], rows, "ppl")

# ---------------------------------------------------------------- the cluster with q8_0
if transfer and transfer.get("e2e"):
    e = transfer["e2e"]
    lines += ["## The cluster with q8_0 K/V", "",
              f"bench/cluster_transfer.py --kv-type q8_0 (folder `{res['transfer']['folder']}/`, its own "
              f"report.md): {e['agents']} agents × {e['max_tokens']} tokens over the README's document, "
              "`run --redis` on one worker (-t 2) and on two (-t 1 each) against the local run (store off). The "
              "workers keep the snapshot in their stores after each arm's first trial, which a worker prefilled "
              "(a prefill job) and the other fetched: the later trials decode only.", ""]
    loc = e["arms"]["local"]
    rows = []
    for arm, rs in e["arms"].items():
        same = sum(rs[0]["answers"][k] == loc[0]["answers"].get(k) for k in rs[0]["answers"])
        rows.append([arm, len(rs), f"{med(r['total_ms'] for r in rs):,.0f}", f"{same}/{len(rs[0]['answers'])}",
                     f"{(rs[0].get('snapshot_bytes') or 0) / 1e6:.1f}"])
    table(["arm", "trials", "end to end ms", "answers = local's", "snapshot MB"], rows, "cluster")

# ---------------------------------------------------------------- wire
wire = res.get("wire", {})
if wire:
    lines += ["## A transfer encoding below 8 bits (prototype, bench/kv_wire_codec.py)", "",
              "The f16 snapshot of the 16-agent pipeline's document, each K/V value quantised for the wire "
              "(blocks of 32, one f16 scale each, symmetric) and decoded to f16 on arrival; the pipeline then "
              "runs from the decoded snapshot (`--snapshot FILE`). `tok-b`: b bits, blocks along a cell's row "
              "(K and V); `kch-b`: K in blocks along a channel over 32 cells (KIVI's layout), V as tok-b. "
              "zstd: level 3 over the codes and scales, standing in for an entropy coder. Answers: agents whose "
              "32 tokens equal the run from the untouched snapshot; agreement: the mean share of each answer "
              "before its first different token.", ""]
    rows = []
    for m, w in wire.items():
        for e in w["encodings"]:
            rows.append([m, e["encoding"], f"{e['bits_per_value']:.2f}", f"{e['wire_bytes'] / 1e6:.1f}",
                         f"{e['wire_zstd_bytes'] / 1e6:.1f}", f"{w['payload_bytes'] / e['wire_bytes']:.2f}×",
                         f"{e['rel_rms_k']:.4f} / {e['rel_rms_v']:.4f}", f"{e['agents_equal']}/{w['agents']}",
                         f"{e['token_prefix_agreement']:.2f}"])
    table(["model", "encoding", "bits/value", "wire MB", "zstd MB", "smaller than f16", "rel. RMS error K / V",
           "answers equal", "token agreement"], rows, "wire")
    fig, axes = ps.figure(1, 2, width=10)
    marks = {"tok": "o", "kch": "s"}
    for a, key, what in ((axes[0][0], "equal", "answers equal to the untouched snapshot's, %"),
                         (axes[0][1], "token_prefix_agreement", "tokens before the first difference, %")):
        for m, w in wire.items():
            for layout, mark in marks.items():
                es = [e for e in w["encodings"] if e["encoding"].startswith(layout)]
                ys = [(e["agents_equal"] / w["agents"] if key == "equal" else e[key]) * 100 for e in es]
                a.plot([e["bits_per_value"] for e in es], ys, marker=mark, linestyle="-" if layout == "tok" else ":",
                       color=ps.colour(m), markersize=7, markeredgecolor="black", markeredgewidth=0.6)
        a.set_xlabel("bits per value on the wire (f16: 16; q8_0 as a KV type: 8.5)")
        a.set_ylabel(what)
        a.set_ylim(0, 105)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=ps.colour(m), linewidth=2, label=m) for m in wire]
    handles += [Line2D([], [], color="black", marker="o", linestyle="-", label="tok-b: blocks along a cell's row"),
                Line2D([], [], color="black", marker="s", linestyle=":", label="kch-b: K along a channel")]
    axes[0][1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ps.title(fig, "Wire-only KV encodings decoded to f16: bits against answers (16 agents × 32 tokens)")
    ps.save(fig, os.path.join(out, "plots", "wire.png"))

lines += ["## Plots", ""] + [f"![{p}](plots/{p})" for p in sorted(os.listdir(os.path.join(out, "plots")))] + [""]
open(os.path.join(out, "report.md"), "w").write("\n".join(lines))
print(os.path.join(out, "report.md"))
