"""Plots and report for a bench/cluster_transfer.py output directory.

usage: /usr/bin/python3 bench/plot_cluster_transfer.py OUT_DIR [--notes ANALYSIS.md]

Reads OUT_DIR/results.json and command.txt; writes OUT_DIR/plots/*.png and
OUT_DIR/report.md (the tables of every section, the break-even model with
this machine's numbers, notes; then OUT_DIR/analysis.md or --notes when
there is one).
"""
import math
import os
import statistics
import sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report, style as ps  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

args, res = report.results_arguments()
plots = ps.Plots(args.out)
save, made = plots.save, plots.made
med = statistics.median


def rate_label(rate):
    if rate == "unlimited":
        return "veth, no limit"
    bits = rate_bits(rate)
    return f"{bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:g} Mbit/s"


def rate_bits(rate):
    import re
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)?bit", rate.lower())
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def mbit(mb_s):
    return mb_s * 8


def fmt_rate(bytes_per_s):
    b = bytes_per_s * 8
    return f"{b / 1e9:.2f} Gbit/s" if b >= 1e9 else f"{b / 1e6:.1f} Mbit/s"


def fmt_s(ms):
    return f"{ms / 1000:.2f} s" if ms < 10000 else f"{ms / 1000:.1f} s"


def num(v):
    """3 significant digits, without exponents: 1.19, 11.9, 119, 1,190."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def trial_mb_s(bench, key):
    return [bench["bytes"] / 1000 / t[key] for t in bench["trials"] if t[key] > 0]


env = res.get("environment", {})
params = res.get("params", {})
links = res.get("links", {}).get("rates", [])
shaped = [x for x in links if x["rate"] != "unlimited"]
unlimited = next((x for x in links if x["rate"] == "unlimited"), None)
loop = res.get("loopback", {}).get("bench")

# ---------------------------------------------------------------- throughput per link
if links or loop:
    groups = [(rate_label(x["rate"]), x["bench"], x["rate_bits"]) for x in links]
    if loop:
        groups.append(("loopback", loop, None))
    names = [g[0] for g in groups]
    by = {g[0]: g for g in groups}
    fig, ax = ps.figure(2 if shaped else 1, 1, width=9, height_per_row=3.2)
    a = ax[0][0]
    arms = ["publish", "fetch"]
    median = lambda g, arm: by[g][1][f"{arm}_mb_s"]  # noqa: E731
    every = lambda g, arm: trial_mb_s(by[g][1], f"{arm}_ms")  # noqa: E731
    # The links are decades apart: points on a log axis then (bars need a linear axis from 0).
    bars = ps.bars_fit([median(g, arm) for g in names for arm in arms] + [g[2] / 8e6 for g in groups if g[2]])
    if bars:
        drawn = ps.grouped_bars(a, names, arms, median, trials=every, value_fmt=num)
    else:  # the values below their points: the nominal rate's line runs just above them
        drawn = ps.grouped_points(a, names, arms, median, trials=every, value_fmt=num, label="below")
    nominal = None
    for i, g in enumerate(groups):
        if g[2]:
            nominal, = a.plot([i - 0.45, i + 0.45], [g[2] / 8e6] * 2, color="black", linestyle="--", linewidth=1.2,
                              zorder=2)
            drawn.append(g[2] / 8e6)
    ps.value_scale(a, drawn, bars=bars, pad=2.2)
    a.set_ylabel("MB/s (10^6 bytes/s)")
    snap = res.get("snapshot", {})
    slow = [x for x in shaped if x["rate_bits"] <= 10e6]
    n_main = max([x["trials"] for x in links if x not in slow] + ([len(loop["trials"])] if loop else []))
    ps.panel_title(a, f"Snapshot bus throughput: {snap.get('file_bytes', by[names[0]][1]['bytes']) / 1e6:.1f} MB "
                      f"snapshot ({snap.get('doc_tokens', '?')} tokens), {'bar' if bars else 'large dot'}: "
                      f"median of {n_main} trial(s)"
                      + (f" ({', '.join(rate_label(x['rate']) for x in slow)}: {slow[0]['trials']})" if slow else ""))
    extra = [Line2D([], [], color="black", linestyle="--", linewidth=1.2, label="nominal link rate")] if nominal else []
    ps.arm_legend(a, arms, dots="each trial", extra=extra, points=not bars)
    if shaped:
        b = ax[1][0]
        sn = [rate_label(x["rate"]) for x in shaped]
        sby = {rate_label(x["rate"]): x for x in shaped}
        ps.grouped_bars(b, sn, arms, lambda g, arm: 100 * sby[g]["bench"][f"{arm}_mb_s"] * 8e6 / sby[g]["rate_bits"],
                        trials=lambda g, arm: [100 * v * 8e6 / sby[g]["rate_bits"]
                                               for v in trial_mb_s(sby[g]["bench"], f"{arm}_ms")],
                        value_fmt=lambda v: f"{v:.0f} %")
        line = b.axhline(100, color="black", linestyle="--", linewidth=1.2, label="nominal rate")
        b.set_ylim(0, 125)
        b.set_ylabel("% of the nominal rate")
        b.legend(handles=[line], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
        ps.panel_title(b, "Delivered share of each shaped link (tbf on both veth ends): the snapshot's bytes per "
                          "second ÷ the nominal rate; headers and protocol cost a few %, far less means the CPU limits")
    save(fig, "link_throughput.png")

# ---------------------------------------------------------------- break-even
be = res.get("breakeven", {}).get("lengths", [])
crossings = {}  # rate -> (tokens or None, verdict)


def be_rows():
    out = []
    for x in be:
        fb = med(x["file_bytes"])
        out.append({"tokens": x["prefix_tokens"], "prefill_ms": med(x["prefill_ms"]), "samples": x["prefill_ms"],
                    "bytes": fb, "bpt": fb / x["prefix_tokens"],
                    "loop_fetch_ms": x["fetch"]["fetch_ms_median"] if x.get("fetch") else None})
    return sorted(out, key=lambda r: r["tokens"])


rows = be_rows()
link_rates = [(x["rate"], x["bench"]["fetch_mb_s"] * 1e6) for x in links]  # bytes/s, measured fetch


def link_colour(k, rate):
    return ps.UNLIMITED_COLOUR if rate == "unlimited" else ps.LINK_COLOURS[k % len(ps.LINK_COLOURS)]


def transfer_ms(r, bps):
    return r["bytes"] / bps * 1000


for rate, bps in link_rates:
    d = [transfer_ms(r, bps) - r["prefill_ms"] for r in rows]
    found = None
    for i in range(len(rows) - 1):
        if d[i] == 0 or (d[i] > 0) != (d[i + 1] > 0):
            t0, t1 = math.log(rows[i]["tokens"]), math.log(rows[i + 1]["tokens"])  # as drawn: log x
            found = math.exp(t0 + (t1 - t0) * d[i] / (d[i] - d[i + 1]) if d[i] != d[i + 1] else t0)
            break
    if found is not None:
        verdict = (f"break-even at ≈{found:,.0f} tokens: "
                   + ("fetch wins above" if d[0] > 0 else "prefill wins above"))
    elif d and all(v < 0 for v in d):
        verdict = "fetch faster at every measured length"
    elif d:
        verdict = "prefill faster at every measured length"
    else:
        verdict = ""
    crossings[rate] = (found, verdict)

def log_x(ax, xs):
    if max(xs) / min(xs) > 3:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(min(xs) / 1.25, max(xs) * 1.25)
    ax.set_xticks(xs, [f"{x:,}" for x in xs])


if rows:
    # The links' lines are named at their right ends (ps.end_labels): three of them run on top of each other,
    # which a legend of colours cannot tell apart; the legend under those names says what the kinds of line are.
    fig, ax = ps.figure(2, 1, width=9, height_per_row=3.6)
    a = ax[0][0]
    xs = [r["tokens"] for r in rows]
    a.plot(xs, [r["prefill_ms"] / 1000 for r in rows], color=ps.colour("prefill"), marker="o", linewidth=2.2,
           zorder=4)
    for r in rows:
        a.plot([r["tokens"]] * len(r["samples"]), [s / 1000 for s in r["samples"]], **ps.DOT)
    vals = [r["prefill_ms"] / 1000 for r in rows]
    names = [(xs[-1], rows[-1]["prefill_ms"] / 1000, "prefill", ps.colour("prefill"))]
    handles = [Line2D([], [], color=ps.colour("prefill"), marker="o", linewidth=2.2,
                      label="prefill (measured, median)"),
               Line2D([], [], label="each prefill trial", **ps.DOT),
               Line2D([], [], color="#555555", linestyle="--", linewidth=1.4, marker=".",
                      label="fetch over a link: bytes ÷ its measured fetch rate")]
    stars = []
    for k, (rate, bps) in enumerate(link_rates):
        c = link_colour(k, rate)
        ys = [transfer_ms(r, bps) / 1000 for r in rows]
        vals += ys
        a.plot(xs, ys, color=c, linestyle="--", linewidth=1.4, marker=".")
        names.append((xs[-1], ys[-1], f"{rate_label(rate)} ({bps / 1e6:.3g} MB/s)", c))
        found = crossings[rate][0]
        if found is not None:
            y = found * rows[0]["bpt"] / bps  # the transfer line at the crossing, seconds
            a.plot([found], [y], marker="*", markersize=13, color=c, markeredgecolor="black", zorder=6)
            stars.append((found, y))
    loops = [(r["tokens"], r["loop_fetch_ms"] / 1000) for r in rows if r["loop_fetch_ms"]]
    if loops:
        a.plot([t for t, _ in loops], [v for _, v in loops], color="#333333", marker="x", linestyle=":",
               linewidth=1)
        vals += [v for _, v in loops]
        names.append((loops[-1][0], loops[-1][1], "loopback (measured)", "#333333"))
        handles.append(Line2D([], [], color="#333333", marker="x", linestyle=":", label="fetch over loopback (measured)"))
    handles.append(Line2D([], [], marker="*", markersize=11, color="white", markeredgecolor="black",
                          linestyle="none", label="break-even"))
    ps.value_scale(a, vals, bars=False, pad=2.0)
    a.set_xlabel("document length (prefix tokens)")
    a.set_ylabel("seconds per machine")
    log_x(a, xs)
    a.grid(axis="x", color="#eeeeee")
    for found, y in stars:  # below right of the star, where no line runs
        a.annotate(f"≈{found:,.0f} tok", (found, y), xytext=(8, -14), textcoords="offset points", fontsize=7.5)
    a.legend(handles=handles, loc="lower left", bbox_to_anchor=(1.01, 0.0), frameon=False, borderaxespad=0)
    ps.panel_title(a, "Fetch the snapshot or prefill the document? Fetch time = the snapshot file's bytes ÷ the "
                      "link's measured fetch throughput; prefill = `swarmkv prefill` on this CPU "
                      f"({params.get('threads', '?')} threads)")
    ps.end_labels(a, names)
    b = ax[1][0]
    need = [r["bytes"] * 8 / (r["prefill_ms"] / 1000) / 1e6 for r in rows]  # Mbit/s
    b.plot(xs, need, color=ps.colour("prefill"), marker="o", linewidth=2.2, zorder=4)
    for i, v in enumerate(need):
        b.annotate(f"{v:,.0f}", (xs[i], v), xytext=(0, 5), textcoords="offset points", ha="center", fontsize=7.5)
    hv = list(need)
    names = [(xs[-1], need[-1], "break-even rate = bytes ÷ prefill time", ps.colour("prefill"))]
    for k, (rate, bps) in enumerate(link_rates):
        c = link_colour(k, rate)
        b.axhline(bps * 8 / 1e6, color=c, linestyle="--", linewidth=1.2)
        hv.append(bps * 8 / 1e6)
        names.append((b.get_xlim()[1], bps * 8 / 1e6, f"{rate_label(rate)}: {bps * 8 / 1e6:,.0f} Mbit/s delivered", c))
    ps.value_scale(b, hv, bars=False, pad=2.0)
    log_x(b, xs)
    names = [(b.get_xlim()[1] if x != xs[-1] else x, y, t, c) for x, y, t, c in names]
    b.grid(axis="x", color="#eeeeee")
    b.set_xlabel("document length (prefix tokens)")
    b.set_ylabel("Mbit/s")
    ps.panel_title(b, "The link rate above which fetching beats prefilling on this CPU (a link line above "
                      "the curve: fetch wins)")
    ps.end_labels(b, names)
    save(fig, "breakeven.png")

# ---------------------------------------------------------------- e2e
e2e = res.get("e2e", {})
arms = {k: v for k, v in e2e.get("arms", {}).items() if v}
ARM_NAMES = {"local": "local\n(--fork shared)", "redis-1-worker": "--redis\n1 worker (-t 2)",
             "redis-2-workers": "--redis\n2 workers (-t 1 each)"}


def first(arm):
    return arms[arm][0]


def later(arm):
    return arms[arm][1:]


if arms:
    names = list(arms)
    fig, ax = ps.figure(2, 1, width=9, height_per_row=3.2)
    a = ax[0][0]
    kinds = ["first trial"] + (["later trials"] if any(later(n) for n in names) else [])
    drawn = ps.grouped_bars(
        a, names, kinds,
        lambda g, k: (first(g)["total_ms"] / 1000 if k == "first trial"
                      else (med(x["total_ms"] for x in later(g)) / 1000 if later(g) else None)),
        trials=lambda g, k: ([first(g)["total_ms"] / 1000] if k == "first trial"
                             else [x["total_ms"] / 1000 for x in later(g)]),
        labels=[ARM_NAMES.get(n, n) for n in names], value_fmt=lambda v: f"{v:.1f} s")
    ps.value_scale(a, drawn)
    a.set_ylabel("total_ms, seconds")
    cold = e2e.get("cold_every_trial")
    ps.arm_legend(a, kinds, dots="each trial",
                  names={"first trial": "first trial (--redis: empty bus and worker\nstores: prefill, publish, fetch)",
                         "later trials": ("later trials, median (--e2e-cold: the same)" if cold else
                                          "later trials, median (--redis: the snapshot\nalready on the bus and in "
                                          "the stores)")})
    ps.panel_title(a, f"{e2e.get('agents')} agents × {e2e.get('max_tokens')} tokens over the README's document, "
                      f"end to end (model load excluded; {e2e.get('trials')} trial(s) per arm, interleaved; the "
                      "local arm prefills in every trial)")
    b = ax[1][0]
    parts = ["prefill", "publish", "fetch"]
    get = {"prefill": lambda x: x["prefill_ms"], "publish": lambda x: (x["transfer"] or {}).get("publish_ms"),
           "fetch": lambda x: (x["transfer"] or {}).get("fetch_ms")}
    bars = ps.grouped(b, names, parts, lambda g, p: (get[p](first(g)) or 0) / 1000,
                      labels=[ARM_NAMES.get(n, n) for n in names],
                      value_fmt=lambda v: f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s")
    b.set_ylabel("seconds (first trial)")
    ps.arm_legend(b, parts, names={"prefill": "prefill (this machine / the coordinator)",
                                   "publish": "publish to the bus (coordinator)",
                                   "fetch": "fetch from the bus (slowest worker)"}, points=not bars)
    ps.panel_title(b, "The document's cost in the first trial: a worker fetches the snapshot instead of prefilling")
    save(fig, "e2e.png")

# ---------------------------------------------------------------- report
lines = ["# Cluster: the Redis snapshot bus against the prefill it saves", ""]
lines += [f"CPU: {env.get('cpu', '?')} ({env.get('cores', '?')} cores), kernel {env.get('kernel', '?')}. "
          f"Engine: {str(env.get('engine', '?')).split(' | ')[0]}. Model: `{env.get('model_file', '?')}`. "
          f"{env.get('redis', '')}.", ""]
BUSY = 0.25  # as bench/cluster_transfer.py
if env.get("busy_cores_at_start") is not None:
    lines += [f"Cores busy with other processes when the run started (1 s sample of /proc/stat): "
              f"{env['busy_cores_at_start']:.2f}"
              + (" — **other processes were running: the timings are skewed**" if env["busy_cores_at_start"] > BUSY
                 else "") + ".", ""]
if params.get("quick"):
    lines += ["**Smoke run (`--quick`): small sizes and one trial; not a measurement.**", ""]
lines += report.reproduce(args.out)


def table(head, rows):
    lines.extend(report.md_table(head, rows) + [""])


snap = res.get("snapshot")
if snap:
    lines += [f"The snapshot of `loopback` and `links`: a synthetic document (the seed's phrase) of "
              f"{snap['doc_tokens']:,} prefix tokens (default system prompt and chat template included), "
              f"{res['params'].get('kv_type', 'f16')} K/V, "
              f"`swarmkv prefill --out`: {snap['file_bytes']:,} bytes = {snap['file_bytes'] / 1e6:.1f} MB, "
              f"{snap['bytes_per_token']:,.0f} bytes per token.", ""]

if loop:
    lines += ["## Loopback (redis-server on 127.0.0.1, no shaping)", ""]
    table(["trials", "publish ms", "fetch ms", "publish MB/s", "fetch MB/s"],
          [[len(loop["trials"]), f"{loop['publish_ms_median']:.0f}", f"{loop['fetch_ms_median']:.0f}",
            f"{loop['publish_mb_s']:.0f}", f"{loop['fetch_mb_s']:.0f}"]])

if links:
    L = res["links"]
    lines += ["## Links (two network namespaces, veth pair, `tc qdisc ... tbf` on both ends)", "",
              f"redis-server in `{L['namespaces'][0]}` at {L['addresses'][0]}, swarmkv_bus_bench in "
              f"`{L['namespaces'][1]}`; MTU {L.get('mtu')}; tbf burst = rate/250 bytes, at least 64 KiB; latency "
              f"50 ms. Links at or below 10 Mbit/s: {L.get('slow_trials')} trial(s) (the others "
              f"{L.get('trials')}). MB = 10^6 bytes; ms = the whole snapshot, median.", ""]
    table(["link", "nominal MB/s", "trials", "publish MB/s", "fetch MB/s", "fetch % of nominal", "publish ms",
           "fetch ms"],
          [[rate_label(x["rate"]), f"{x['rate_bits'] / 8e6:g}" if x["rate_bits"] else "—", x["trials"],
            num(x['bench']['publish_mb_s']), num(x['bench']['fetch_mb_s']),
            f"{x['fetch_of_nominal'] * 100:.0f} %" if x.get("fetch_of_nominal") else "—",
            num(x['bench']['publish_ms_median']), num(x['bench']['fetch_ms_median'])]
           for x in links])
    notes = []
    for c in L.get("checks", []):
        notes.append(f"- Shaping check, {rate_label(c['rate'])}: fetch {c['fetch_of_nominal'] * 100:.0f} %, "
                     f"publish {c['publish_of_nominal'] * 100:.0f} % of the nominal rate: "
                     + ("within 80–105 %, the link is what limits the transfer." if c["ok"] else
                        "**outside 80–105 %: this link's numbers are suspect.**"))
    ceiling = max(([unlimited["bench"]["fetch_mb_s"]] if unlimited else []) +
                  ([loop["fetch_mb_s"]] if loop else []), default=None)
    for x in shaped:
        share = x["fetch_of_nominal"]
        if x["rate_bits"] >= 1e9 and ceiling:
            nominal = x["rate_bits"] / 8e6
            bound = share < 0.8 and x["bench"]["fetch_mb_s"] > 0.6 * min(ceiling, nominal)
            notes.append(f"- {rate_label(x['rate'])}: {x['bench']['fetch_mb_s']:.0f} MB/s fetched = "
                         f"{share * 100:.0f} % of nominal; unshaped the same path moves "
                         f"{unlimited['bench']['fetch_mb_s'] if unlimited else float('nan'):.0f} MB/s (veth) / "
                         f"{loop['fetch_mb_s'] if loop else float('nan'):.0f} MB/s (loopback). "
                         + ("**CPU-bound, not link-bound**: the unshaped ceiling of Redis + client + kernel on these "
                            "cores is below the nominal rate." if (ceiling < nominal) else
                            ("Below the rate although the unshaped path is faster: tbf's per-packet cost at this rate, "
                             "not the link." if bound else "Link-bound.")))
    lines += notes + ([""] if notes else [])

if rows:
    lines += ["## Break-even: fetch the snapshot or prefill the document", "",
              f"`{res['breakeven'].get('how', '')}`; {res['breakeven']['trials']} trial(s) per length, lengths "
              "interleaved, order reversed every other trial (each length prefilled once more before, as a warm-up). "
              "Transfer time per link = the file's bytes ÷ that link's measured fetch throughput (section Links); "
              "`loopback fetch` is measured (swarmkv_bus_bench on that very file).", ""]
    head = ["tokens", "prefill ms", "tok/s", "bytes/token", "file MB", "loopback fetch ms"] + \
           [f"fetch {rate_label(r)} ms" for r, _ in link_rates]
    table(head, [[f"{r['tokens']:,}", f"{r['prefill_ms']:.0f} (n={len(r['samples'])})",
                  f"{r['tokens'] / r['prefill_ms'] * 1000:.0f}", f"{r['bpt']:,.0f}", f"{r['bytes'] / 1e6:.1f}",
                  f"{r['loop_fetch_ms']:.0f}" if r["loop_fetch_ms"] else "—"]
                 + [f"{transfer_ms(r, bps):,.0f}" for _, bps in link_rates] for r in rows])
    busy = [v for x in be for v in x.get("busy_cores_before", [])]
    if busy and max(busy) > BUSY:
        lines += [f"**Other processes kept up to {max(busy):.2f} cores busy just before a prefill** "
                  f"({sum(v > BUSY for v in busy)} of {len(busy)} prefills above {BUSY} cores): these prefill times "
                  "are skewed (too slow).", ""]
    if link_rates:
        table(["link", "delivered (fetch)", "verdict over the measured lengths"],
              [[rate_label(r), fmt_rate(bps), crossings[r][1]] for r, bps in link_rates])
    bpt = med(r["bpt"] for r in rows)
    v_lo = min(r["tokens"] / r["prefill_ms"] * 1000 for r in rows)
    v_hi = max(r["tokens"] / r["prefill_ms"] * 1000 for r in rows)
    ref = next((r for r in rows if r["tokens"] == 3501), rows[-1])
    v_ref = ref["tokens"] / ref["prefill_ms"] * 1000
    lines += ["### The model", "",
              "Per machine, fetching the snapshot beats prefilling the document when",
              "", "    (KV bytes per token) ÷ (link rate) < (prefill time per token)", "",
              "i.e. when the link delivers more than **b × v** bytes per second, with b the snapshot's bytes per "
              "token and v the prefill speed in tokens/s. b is fixed by the model and the KV type (layers × KV heads "
              "× head size × 2 (K and V) × bytes per element, plus a small header); v by the hardware. Both sides are "
              "linear in the length as long as v is flat; v falls with the length (attention), so long documents "
              "favour fetching a little more.", "",
              f"This machine: b = {bpt:,.0f} bytes/token (measured: the files' sizes ÷ their tokens, "
              f"{min(r['bpt'] for r in rows):,.0f}–{max(r['bpt'] for r in rows):,.0f}), v = "
              + (f"{v_lo:,.0f}–{v_hi:,.0f}" if round(v_lo) != round(v_hi) else f"{v_lo:,.0f}") + f" "
              f"tokens/s ({v_ref:,.0f} at {ref['tokens']:,} tokens), so the break-even link rate is "
              f"b × v = {fmt_rate(bpt * v_ref)} at {ref['tokens']:,} tokens "
              f"({fmt_rate(bpt * v_lo)}–{fmt_rate(bpt * v_hi)} over the lengths measured). A link that delivers "
              "more than that makes the fetch cheaper than the prefill.", "",
              "Plug in your own numbers (b from `swarmkv prefill --out` file size ÷ prefix tokens, v from "
              "`swarmkv prefill --json` prefix_tokens ÷ prefill_ms; the link's delivered rate, not its nominal "
              "one: here the shaped links delivered about "
              + (f"{med(x['fetch_of_nominal'] for x in shaped) * 100:.0f} %" if shaped else "?")
              + " of nominal):", ""]
    ex = [("this CPU (measured)", bpt, v_ref)]
    for v in (5_000, 20_000, 50_000):
        ex.append((f"this model at {v:,} tok/s (e.g. a GPU; assumed, not measured)", bpt, v))
    kv8b = 32 * 8 * 128 * 2 * 2  # a Llama-3-8B-like GQA model, f16 KV
    for v in (5_000, 10_000):
        ex.append((f"8B model with GQA (32 layers × 8 KV heads × 128 × 2 × f16 = {kv8b:,} B/token) at {v:,} tok/s "
                   "(assumed)", kv8b, v))
    table(["case", "b (bytes/token)", "v (tokens/s)", "break-even link rate b × v"],
          [[c, f"{b:,.0f}", f"{v:,.0f}", fmt_rate(b * v)] for c, b, v in ex])
    lines += ["Left out of the model: the coordinator's one publish (paid once per document, not per worker); "
              "workers fetching at the same time share the Redis server's link (W workers move W × b × L bytes "
              "through it); after the fetch a worker writes and checks the file in its store and restores it into "
              "its context, on top of the fetch time; a busy Redis or another chunk size changes the delivered "
              "rate.", ""]

if arms:
    lines += [f"## End to end: {e2e['agents']} agents × {e2e['max_tokens']} tokens over the README's document", "",
              f"Pipeline `{e2e['pipeline']}` (generated: the README pipeline's document and system prompt, "
              f"temperature 0). Arms interleaved per trial, order reversed every other trial. `--redis` arms: their "
              "own redis-server on loopback (one database per arm), workers started before each run (model loaded, "
              "live in Redis) and stopped with SIGTERM after it; the coordinator runs with `--snapshot-cache off`; "
              + ("every trial starts from an empty bus and empty worker stores (`--e2e-cold`)."
                 if e2e.get("cold_every_trial") else
                 "each arm's worker stores start empty, so its **first** trial fetches the snapshot (and the "
                 "worker that takes the prefill job prefills and publishes it); later trials find it on the bus "
                 "and in the stores (no prefill, no fetch anywhere)."), ""]
    body = []
    for n, rs in arms.items():
        f = rs[0]
        tr = f["transfer"] or {}
        lat = [x["total_ms"] for x in rs[1:]]
        fetched = "".join("F" if x["snapshot_fetched"] else ("L" if x["snapshot_fetched"] is not None else "·")
                          for x in rs)
        exits = sorted({w["exit"] for x in rs for w in x["workers"]})
        body.append([n, len(rs), f"{f['wall_ms']:.0f}", f"{f['total_ms']:.0f}",
                     f"{med(lat):.0f} (n={len(lat)})" if lat else "—", f"{f['prefill_ms']:.0f}",
                     f"{tr['publish_ms']:.0f}" if tr else "—", f"{tr['fetch_ms']:.0f}" if tr else "—",
                     tr.get("fetches", "—") if tr else "—", fetched,
                     f"{sum(x['agents_ok'] for x in rs)}/{sum(x['agents'] for x in rs)}",
                     ",".join(str(e) for e in exits) or "—"])
    table(["arm", "trials", "first: wall ms", "first: total ms", "later: total ms (median)", "first: prefill ms",
           "first: publish ms", "first: fetch ms (slowest worker)", "first: fetches", "fetched (F) / local (L) per trial",
           "agents ok", "worker exit on SIGTERM"], body)
    loc = arms.get("local")
    notes = ["Notes:", ""]
    if loc:
        lp = med(x["prefill_ms"] for x in loc)
        for n in ("redis-1-worker", "redis-2-workers"):
            if n in arms and arms[n][0]["transfer"] and not arms[n][0]["transfer"].get("fetch_ms"):
                notes.append(f"- {n}: no worker fetched the snapshot in the first trial: the worker that ran "
                             "the prefill job prefilled the document and published it, and no other took a job.")
            elif n in arms and arms[n][0]["transfer"]:
                fm = arms[n][0]["transfer"]["fetch_ms"]
                notes.append(f"- {n}: each worker fetched the {arms[n][0]['transfer']['bytes'] / 1e6:.1f} MB snapshot "
                             f"in ≤ {fm:.0f} ms where a prefill of the document takes {lp:.0f} ms here (local arm, "
                             f"median): {lp / fm:.0f}× less per machine, over loopback.")
        same = {n: sum(rs[0]["answers"][k] == loc[0]["answers"].get(k) for k in rs[0]["answers"])
                for n, rs in arms.items() if n != "local"}
        if same:
            notes.append("- Answers equal to the local arm's (first trial): "
                         + ", ".join(f"{n} {v}/{e2e['agents']}" for n, v in same.items())
                         + " (a worker decodes its job's agents as one batch, half as wide with two workers: in "
                           "exact mode that changes no answer; without it near-ties may break differently).")
    notes.append(f"- {env.get('cores', '?')} cores: the two workers (-t 1 each) share the same cores as the one "
                 "worker (-t 2) and the coordinator, so a second worker adds no compute here; these runs show the "
                 "protocol's overhead and the prefill a worker does not pay, not a cluster's speed-up. On separate "
                 "machines each worker brings its own cores and pays one fetch instead of one prefill.")
    busy = [x["busy_cores_before"] for rs in arms.values() for x in rs if x.get("busy_cores_before") is not None]
    if busy and max(busy) > BUSY:
        notes.append(f"- **Other processes kept up to {max(busy):.2f} cores busy just before a run** "
                     f"({sum(v > BUSY for v in busy)} of {len(busy)} runs above {BUSY} cores): with 2 threads on 2 "
                     "cores llama.cpp's threads wait for each other, and a busy core makes a run several times "
                     "slower. Treat these numbers as skewed.")
    notes.append("- total_ms excludes the model load (`load_ms`); wall ms is the whole `swarmkv run` process. "
                 "Worker start (model load, SHA-256 of the model) is outside both.")
    lines += notes + [""]

lines += ["## Plots", ""] + [f"![{m}](plots/{m})" for m in made] + [""]
notes_path = args.notes or os.path.join(args.out, "analysis.md")
if os.path.exists(notes_path):
    lines += ["## Analysis", "", open(notes_path).read().strip(), ""]
open(os.path.join(args.out, "report.md"), "w").write("\n".join(lines))
print(f"wrote {len(made)} plots and report.md in {args.out}")
