"""The look shared by every bench plot (plot_bench.py, snapshot_bench.py,
old_vs_new.py).

- One colour per arm name in every plot (the Okabe-Ito palette, safe for
  colour-blind readers); the reference arm `none` is grey.
- Grouped bars: one group per point, one bar per arm, the median as the bar
  and every trial as a white dot on it.
- A value axis is logarithmic when its values span more than 10x, with
  ticks at 1-2-5 steps labelled in plain numbers.
- Legends outside the data, right of the panels; the arms' one per figure.

Needs matplotlib (Debian's python3-matplotlib; run with /usr/bin/python3).
"""
import math
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
}
# For arm names not listed above, handed out in the order they are first drawn.
SPARE_COLOURS = ["#882255", "#44AA99", "#DDCC77", "#332288", "#117733", "#AA4499"]
EDGE = "#333333"
DOT = dict(marker="o", markersize=4, markerfacecolor="white", markeredgecolor="black", markeredgewidth=0.8,
           linestyle="none", zorder=4)
WIDE = 10  # max / min above which an axis goes logarithmic

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
    return f"{v:g}" if v >= 0.01 else f"{v:.0e}"


def value_scale(ax, values, axis="y", suffix="", bars=True, pad=1.6, base=None):
    """Log when the positive values span more than WIDE, else linear: from 0 for bars, or around
    base (a ratio's 1) and the values when base is given.

    pad: how far (a factor) a log axis reaches beyond the values."""
    vals = [v for v in list(values) + ([base] if base else []) if v is not None and v > 0]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    target = ax.yaxis if axis == "y" else ax.xaxis
    set_scale, set_lim = (ax.set_yscale, ax.set_ylim) if axis == "y" else (ax.set_xscale, ax.set_xlim)
    if hi / lo > WIDE:
        set_scale("log")
        ticks = _log_ticks(lo, hi * pad)
        set_lim(min(lo / pad, ticks[0]), hi * pad)
        target.set_major_locator(FixedLocator(ticks))
        target.set_minor_locator(NullLocator())
    elif base is not None:
        # At least base ± 20 %, so that a few percent of noise does not look like a step.
        lo, hi = min(lo, 0.8 * base), max(hi, 1.2 * base)
        margin = 0.1 * (hi - lo)
        set_lim(max(0.0, lo - margin), hi + margin)
    elif bars:
        set_lim(0, hi * 1.12)
    target.set_major_formatter(FuncFormatter(lambda v, _pos: _plain(v) + suffix))


def grouped_bars(ax, groups, arms, median, trials=None, labels=None, value_fmt=None, base=0.0):
    """For each group (x position) one bar per arm: median(group, arm); trials(group, arm) as dots.

    Bars start at base (1 for a speed-up: up is faster, down is slower). Missing or
    zero medians draw no bar. value_fmt(v) writes the value at each bar's end.
    Returns every value drawn, for value_scale()."""
    width = 0.8 / max(len(arms), 1)
    drawn = []
    for j, arm in enumerate(arms):
        for i, g in enumerate(groups):
            v = median(g, arm)
            x = i - 0.4 + width * (j + 0.5)
            if v is not None and v > 0:
                ax.bar(x, v - base, width, bottom=base, color=colour(arm), edgecolor=EDGE, linewidth=0.6)
                drawn.append(v)
                if value_fmt:
                    up = v >= base
                    ax.annotate(value_fmt(v), (x, v), xytext=(0, 2 if up else -2), textcoords="offset points",
                                ha="center", va="bottom" if up else "top", fontsize=7,
                                rotation=90 if len(arms) * len(groups) > 12 else 0)
            pts = [t for t in (trials(g, arm) if trials else []) if t > 0]
            if pts:
                ax.plot([x] * len(pts), pts, **DOT)
                drawn += pts
    ax.set_xticks(range(len(groups)), labels if labels is not None else [str(g) for g in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    return drawn


def reference_line(ax, label="1× = as fast as none", legend=True):
    """The speed-up 1x line, in the reference's colour; named in a legend right of `ax`, or returned
    for arm_legend(extra=...)."""
    line = ax.axhline(1, color=colour("none"), linestyle="--", linewidth=1.2, zorder=1, label=label)
    if legend:
        ax.legend(handles=[line], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    return line


def arm_legend(ax, arms, dots=None, lines=False, extra=(), names=None):
    """The figure's one legend, right of `ax`: a swatch (or line) per arm (named names[arm] where given),
    what the dots are, and extra handles."""
    names = names or {}
    if lines:
        handles = [Line2D([], [], color=colour(a), marker="o", linewidth=2, label=names.get(a, a)) for a in arms]
    else:
        handles = [Patch(facecolor=colour(a), edgecolor=EDGE, linewidth=0.6, label=names.get(a, a)) for a in arms]
    if dots:
        handles.append(Line2D([], [], label=dots, **DOT))
    handles += list(extra)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)


def panel_title(ax, text):
    """A panel's title, wrapped to the panel's width."""
    width = ax.get_position().width * ax.figure.get_figwidth()
    ax.set_title(textwrap.fill(text, max(int(width * 13), 30)))


def title(fig, text):
    """The figure's title, wrapped to the figure's width."""
    fig.suptitle(textwrap.fill(text, int(fig.get_figwidth() * 13)))


def save(fig, path):
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
