"""The look shared by every bench plot (plot_bench.py, snapshot_bench.py,
old_vs_new.py, plot_*.py, the other benches, the summarize.py scripts in
bench/results/).

- One colour per arm name in every plot, from the one table ARM_COLOURS
  (the Okabe-Ito palette, safe for colour-blind readers); the reference arm
  `none` is grey. A bench adds the names it draws to that table, not a
  table of its own.
- Bars only on a linear axis that starts at 0, so that a bar's length is
  its value. grouped() draws one group per point, one bar per arm, the
  median as the bar and every trial as a white dot on it; when the values
  span more than BAR_SPAN it draws them as points instead (the median as a
  large marker in the arm's colour), on a log axis.
- Ratios (speed-ups, new / old) are points around a dashed 1 line
  (grouped_points), never bars.
- Lines and points: their axis is logarithmic when their values span more
  than WIDE, with ticks at 1-2-5 steps labelled in plain numbers.
- One quantity per axis: a second quantity gets a panel of its own.
- Legends outside the data, right of the panels; the arms' one per figure;
  lines that run close together are named at their right end (end_labels)
  rather than told apart by a legend.

Needs matplotlib (Debian's python3-matplotlib; run with /usr/bin/python3).
"""
import math
import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

ARM_COLOURS = {
    "none": "#999999",  # the reference: every branch re-prefills the document
    "host": "#0072B2",
    "shared": "#009E73",
    "server-concurrent": "#D55E00",
    "server-sequential": "#CC79A7",
    "cold": "#56B4E9",  # snapshot_bench.py: the document prefilled
    "warm": "#E69F00",  # snapshot_bench.py: the document's state from the snapshot store
    "old": "#000000",  # old_vs_new.py: the two binaries
    "new": "#F0E442",
    "exact": "#224477",  # serve_load.py: the modes
    "no-exact": "#DD6666",
    "after": "#224477",  # prefix_attention.py, sgemm_rows.py, streaming_prefill.py: the two builds
    "before": "#DD6666",
    "no needs": "#99BBDD",  # streaming_prefill.py: the pipeline without its needs
    # cluster_transfer.py: the phases, the arms, the trials
    "publish": "#0072B2",
    "fetch": "#009E73",
    "prefill": "#56B4E9",  # also prefill_settings.py's phase: as "cold", the document prefilled
    "local": "#999999",
    "redis-1-worker": "#0072B2",
    "redis-2-workers": "#009E73",
    "first trial": "#E69F00",
    "later trials": "#56B4E9",
    # prefill_settings.py: the phases, the programs, the weight files
    "branches": "#E69F00",
    "end to end": "#009E73",
    "swarmkv": "#009E73",
    "llama-server": "#D55E00",  # results/serve/: the peer server
    "llama-bench": "#0072B2",
    "q4_1": "#999999",
    "q4_0": "#0072B2",
    "f16": "#D55E00",
}
# Lines per link rate (cluster_transfer.py), in the order drawn; no limit is grey.
LINK_COLOURS = ["#CC79A7", "#E69F00", "#56B4E9", "#0072B2", "#882255", "#44AA99"]
UNLIMITED_COLOUR = "#777777"
# For arm names not listed above, handed out in the order they are first drawn.
SPARE_COLOURS = ["#882255", "#44AA99", "#DDCC77", "#332288", "#117733", "#AA4499"]
EDGE = "#333333"
DOT = dict(marker="o", markersize=4, markerfacecolor="white", markeredgecolor="black", markeredgewidth=0.8,
           linestyle="none", zorder=4)
WIDE = 10  # max / min above which a line's or a point's axis goes logarithmic
BAR_SPAN = 30  # max / min above which grouped() draws points on a log axis instead of bars
LABEL_BOX = dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.85)  # over lines, under data
MEDIAN = dict(marker="o", markersize=8, markeredgecolor="black", markeredgewidth=0.8, linestyle="none", zorder=5)

plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "figure.titlesize": 11, "legend.fontsize": 8.5,
                     "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
                     "axes.grid.axis": "y", "grid.color": "#dddddd", "axes.axisbelow": True})

_spare_given = {}


def colour(arm):
    if arm in ARM_COLOURS:
        return ARM_COLOURS[arm]
    return _spare_given.setdefault(arm, SPARE_COLOURS[len(_spare_given) % len(SPARE_COLOURS)])


def figure(rows=1, cols=1, width=8.0, height_per_row=3.2, **kw):
    """A figure of rows x cols panels (always a 2-D array), laid out so that nothing overlaps."""
    fig, axes = plt.subplots(rows, cols, figsize=(width, height_per_row * rows + 0.6), layout="constrained",
                             squeeze=False, **kw)
    return fig, axes


def _log_ticks(lo, hi):
    """1-2-5 ticks (or 1-3, or decades: no more than about eight) from the last one at or below lo
    up to hi."""
    for steps in ((1, 2, 5), (1, 3), (1,)):
        ladder = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                  for m in steps]
        below = max(t for t in ladder if t <= lo)
        ticks = [t for t in ladder if below <= t <= hi]
        if len(ticks) <= 8:
            return ticks
    return ticks


def _plain(v):
    if v == 0 or v >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}" if v >= 0.0001 else f"{v:.0e}"


def value_scale(ax, values, axis="y", suffix="", bars=True, pad=1.6, base=None):
    """The value axis. Bars: always linear from 0, so that a bar's length is its value. Lines and
    points (bars=False, or a base): log when the positive values span more than WIDE, else linear,
    around base (a ratio's 1) and the values when base is given, else matplotlib's.

    pad: how far (a factor) a log axis reaches beyond the values."""
    vals = [v for v in list(values) + ([base] if base else []) if v is not None and v > 0]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    target = ax.yaxis if axis == "y" else ax.xaxis
    set_scale, set_lim = (ax.set_yscale, ax.set_ylim) if axis == "y" else (ax.set_xscale, ax.set_xlim)
    if bars and base is None:  # a base (a ratio's 1) means points: grouped_points
        set_scale("linear")
        set_lim(0, hi * 1.15)
    elif hi / lo > WIDE:
        set_scale("log")
        ticks = _log_ticks(lo, hi * pad)
        set_lim(min(lo / pad, ticks[0]), hi * pad)
        target.set_major_locator(FixedLocator(ticks))
        target.set_minor_locator(NullLocator())
    elif base is not None:
        # At least base ± 20 %, so that a few percent of noise does not look like a step.
        lo, hi = min(lo, 0.8 * base), max(hi, 1.2 * base)
        margin = 0.12 * (hi - lo)
        set_lim(max(0.0, lo - margin), hi + margin)
    target.set_major_formatter(FuncFormatter(lambda v, _pos: _plain(v) + suffix))


def bars_fit(values):
    """Whether bars (on a linear axis from 0) show these values: the largest at most BAR_SPAN times
    the smallest positive one, so that the shortest bar is still seen."""
    vals = [v for v in values if v is not None and v > 0]
    return not vals or max(vals) / min(vals) <= BAR_SPAN


def _cells(groups, arms, median, trials):
    """The bar width, and (arm, x, median, trials' positive values) for each arm in each group."""
    width = 0.8 / max(len(arms), 1)
    return width, [(arm, i - 0.4 + width * (j + 0.5), median(g, arm),
                    [t for t in (trials(g, arm) if trials else []) if t > 0])
                   for j, arm in enumerate(arms) for i, g in enumerate(groups)]


def _ticks(ax, groups, labels):
    ax.set_xticks(range(len(groups)), labels if labels is not None else [str(g) for g in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)


def grouped_bars(ax, groups, arms, median, trials=None, labels=None, value_fmt=None):
    """For each group (x position) one bar per arm from 0: median(group, arm); trials(group, arm) as
    dots. Missing or zero medians draw no bar. value_fmt(v) writes the value above the bar and its
    dots. Returns every value drawn, for value_scale(..., bars=True)."""
    width, cells = _cells(groups, arms, median, trials)
    drawn = []
    for arm, x, v, pts in cells:
        if v is not None and v > 0:
            ax.bar(x, v, width, color=colour(arm), edgecolor=EDGE, linewidth=0.6)
            drawn.append(v)
            if value_fmt:
                ax.annotate(value_fmt(v), (x, max([v] + pts)), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7, bbox=LABEL_BOX, zorder=3,
                            rotation=90 if len(arms) * len(groups) > 12 else 0)
        if pts:
            ax.plot([x] * len(pts), pts, **DOT)
            drawn += pts
    _ticks(ax, groups, labels)
    return drawn


def grouped_points(ax, groups, arms, median, trials=None, labels=None, value_fmt=None, label="auto"):
    """grouped_bars' layout without bars: the median as a large marker in the arm's colour, each
    trial as a white dot behind it; for ratios and for values too far apart for bars (a log axis).
    value_fmt(v) writes the value at the marker: label "above", "below", "right", or "auto" (right
    of it when there are trials' dots, which lie above and below it, else above). Returns every
    value drawn, for value_scale(..., bars=False)."""
    _, cells = _cells(groups, arms, median, trials)
    drawn = []
    for arm, x, v, pts in cells:
        if pts:
            ax.plot([x] * len(pts), pts, **DOT)
            drawn += pts
        if v is not None and v > 0:
            ax.plot([x], [v], color=colour(arm), **MEDIAN)
            drawn.append(v)
            where = label if label != "auto" else "right" if pts else "above"
            if value_fmt and where == "right":
                ax.annotate(value_fmt(v), (x, v), xytext=(7, 0), textcoords="offset points", ha="left",
                            va="center", fontsize=7, bbox=LABEL_BOX, zorder=3)
            elif value_fmt:
                up = where == "above"
                ax.annotate(value_fmt(v), (x, v), xytext=(0, 6 if up else -6), textcoords="offset points",
                            ha="center", va="bottom" if up else "top", fontsize=7, bbox=LABEL_BOX, zorder=3,
                            rotation=90 if len(arms) * len(groups) > 12 else 0)
    _ticks(ax, groups, labels)
    for k in range(len(groups) - 1):  # the groups apart
        ax.axvline(k + 0.5, color="#eeeeee", linewidth=0.8, zorder=0)
    return drawn


def grouped(ax, groups, arms, median, trials=None, labels=None, value_fmt=None, suffix=""):
    """Bars on a linear axis from 0 when the values fit (bars_fit), else points on a log axis; draws,
    scales the axis and returns whether it drew bars. Panels that share a scale decide together:
    bars_fit(all their values), then grouped_bars or grouped_points and value_scale on each."""
    probe = [median(g, a) for g in groups for a in arms]
    probe += [t for g in groups for a in arms for t in (trials(g, a) if trials else [])]
    bars = bars_fit(probe)
    draw = grouped_bars if bars else grouped_points
    value_scale(ax, draw(ax, groups, arms, median, trials, labels, value_fmt), suffix=suffix, bars=bars)
    return bars


def reference_line(ax, label="1× = as fast as none", legend=True):
    """The speed-up 1x line, in the reference's colour; named in a legend right of `ax`, or returned
    for arm_legend(extra=...)."""
    line = ax.axhline(1, color=colour("none"), linestyle="--", linewidth=1.2, zorder=1, label=label)
    if legend:
        ax.legend(handles=[line], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    return line


def arm_legend(ax, arms, dots=None, lines=False, extra=(), names=None, points=False):
    """The figure's one legend, right of `ax`: a swatch (line, or marker for grouped_points) per arm
    (named names[arm] where given), what the dots are, and extra handles."""
    names = names or {}
    if lines:
        handles = [Line2D([], [], color=colour(a), marker="o", linewidth=2, label=names.get(a, a)) for a in arms]
    elif points:
        handles = [Line2D([], [], color=colour(a), label=names.get(a, a), **MEDIAN) for a in arms]
    else:
        handles = [Patch(facecolor=colour(a), edgecolor=EDGE, linewidth=0.6, label=names.get(a, a)) for a in arms]
    if dots:
        handles.append(Line2D([], [], label=dots, **DOT))
    handles += list(extra)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)


def end_labels(ax, items, gap=10.0):
    """Names lines in the margin right of the axes instead of in a legend: items = (x, y, text, colour),
    (x, y) the line's end in data units. Labels closer than gap points are pushed apart, each with a thin
    leader to its line's end, so that lines running together stay told apart. Call after the axis
    limits are final."""
    if not items:
        return
    fig = ax.figure
    fig.canvas.draw()  # the final layout: where the data land on the canvas
    at = [ax.transData.transform((x, y))[1] for x, y, _, _ in items]
    pos = list(at)
    order = sorted(range(len(items)), key=lambda k: at[k])
    room = gap * fig.dpi / 72.0
    for _ in range(500):  # neighbours too close move apart, half the shortfall each
        moved = False
        for lo, hi in zip(order, order[1:]):
            short = room - (pos[hi] - pos[lo])
            if short > 0.01:
                pos[lo] -= short / 2
                pos[hi] += short / 2
                moved = True
        if not moved:
            break
    right = ax.transAxes.transform((1.0, 0.0))[0] + 8 * fig.dpi / 72.0
    to_data = ax.transData.inverted()
    for k, (x, y, text, c) in enumerate(items):
        tx, ty = to_data.transform((right, pos[k]))
        ax.annotate(text, (x, y), xytext=(tx, ty), textcoords="data", ha="left", va="center", fontsize=7.5,
                    color=c, annotation_clip=False,
                    arrowprops=dict(arrowstyle="-", color=c, linewidth=0.6, shrinkA=1, shrinkB=2, alpha=0.7))


def _wrap(text, width):
    """text in as few lines as width allows, of even lengths (no word left alone on the last line)."""
    lines = len(textwrap.wrap(text, width)) or 1
    narrow = max(len(text) // lines, 1)
    while narrow < width and len(textwrap.wrap(text, narrow)) > lines:
        narrow += 1
    return textwrap.fill(text, narrow)


def panel_title(ax, text):
    """A panel's title, wrapped to the panel's width."""
    width = ax.get_position().width * ax.figure.get_figwidth()
    ax.set_title(_wrap(text, max(int(width * 13), 30)))


def title(fig, text):
    """The figure's title, each line wrapped to the figure's width."""
    fig.suptitle("\n".join(_wrap(line, int(fig.get_figwidth() * 13)) for line in text.split("\n")))


def save(fig, path):
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


class Plots:
    """A report's OUT/plots/: save(fig, name) writes OUT/plots/<name> and keeps the name, in order,
    in .made (for the report's list of plots)."""

    def __init__(self, out):
        self.dir = os.path.join(out, "plots")
        os.makedirs(self.dir, exist_ok=True)
        self.made = []

    def save(self, fig, name):
        save(fig, os.path.join(self.dir, name))
        self.made.append(name)
