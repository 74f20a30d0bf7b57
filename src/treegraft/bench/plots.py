"""PNG plots (matplotlib, headless): a sweep's speedup per suite, tau distribution and time split."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from treegraft.bench.aggregate import ALL, Row
from treegraft.bench.config import AR, BASELINES, ENDPOINTS, PLAIN
from treegraft.bench.records import MEASURED, REPLAY, SPLIT_KEYS, Request
from treegraft.viz import LABEL_CHARS, figure, short

SPLIT_COLOURS = {
    "target": "#4c72b0",
    "strong": "#dd8452",
    "weak": "#55a868",
    "framework": "#8c8c8c",
}


#: Method families in plot order, each with its colour map (darker = later in the family).
FAMILIES = (
    ("pipelines", "Blues"),
    ("scheduler variants", "Greens"),
    ("endpoints and chain", "Purples"),
    ("Hugging Face", "Oranges"),
    ("plain decoding", "Greys"),
)
#: The shipped pipelines (`treegraft-threshold` is `treegraft` in a sweep): black edge, bold label.
SHIPPED = ("treegraft", "treegraft-threshold", "treegraft-distilled")


def family_of(method: str) -> str:
    """Which family a method belongs to (by its harness name)."""
    if method in PLAIN:
        return "plain decoding"
    if method.startswith("hf-"):
        return "Hugging Face"
    if method in (*ENDPOINTS, "chain"):
        return "endpoints and chain"
    if method in BASELINES and method.startswith("treegraft-"):
        return "scheduler variants"
    return "pipelines"


def method_order(methods: Sequence[str], speed: Mapping[str, float]) -> list[str]:
    """Methods grouped by family (in `FAMILIES` order), fastest first within a family."""
    rank = {name: i for i, (name, _) in enumerate(FAMILIES)}
    return sorted(methods, key=lambda m: (rank[family_of(m)], -speed.get(m, 0.0), m))


def method_colours(methods: Sequence[str]) -> dict[str, Any]:
    """A colour per method: its family's colour map, spread over the family's members."""
    colours: dict[str, Any] = {}
    for family, cmap in FAMILIES:
        members = [m for m in methods if family_of(m) == family]
        for i, m in enumerate(members):
            colours[m] = colormaps[cmap](0.45 + 0.5 * (i + 1) / (len(members) + 1))
    return colours


def plot_speedup(rows: Sequence[Row], path: Path) -> Path:
    """One panel per pair: each method's speedup over all suites as a horizontal bar with its 95%
    interval, and its speedup per suite as markers; methods grouped by family (colours), the
    shipped pipelines outlined in black, the plain-decoding line at 1 (each pair's
    faster plain decoding, its `baseline`, named on the axis and left out of the bars)."""
    pairs = list(dict.fromkeys(r.pair for r in rows if r.pair != ALL)) or [ALL]
    measured = [r for r in rows if r.mode == MEASURED and r.method != r.baseline]
    suites = list(dict.fromkeys(r.suite for r in measured if r.suite != ALL))
    overall = {r.method: r.speedup for r in measured if r.pair == ALL and r.suite == ALL}
    methods = method_order(list(dict.fromkeys(r.method for r in measured)), overall)
    colours = method_colours(methods)
    markers = "osD^v<>PX*"
    # tall enough for the two legends beside the last panel (suites above, families below)
    families = [(f, c) for f, c in FAMILIES if any(family_of(m) == f for m in methods)]
    height = max(0.32 * len(methods) + 1.6, 0.22 * (len(suites) + len(families)) + 1.9)
    fig = figure(5.2 * len(pairs) + 2.5, height)
    axes = fig.subplots(1, len(pairs), squeeze=False, sharey=True)
    for ax, pair in zip(axes[0], pairs, strict=True):
        cell = {(r.method, r.suite): r for r in measured if r.pair == pair}
        found = [cell.get((m, ALL)) for m in methods]
        ys = list(range(len(methods)))
        ax.barh(ys, [r.speedup if r else 0.0 for r in found], 0.7,
                color=[colours[m] for m in methods],
                edgecolor=["black" if m in SHIPPED else "none" for m in methods],
                xerr=error_bars(found), error_kw={"elinewidth": 0.8, "capsize": 2})  # fmt: skip
        for k, suite in enumerate(suites):
            points = [(cell[(m, suite)].speedup, y) for y, m in zip(ys, methods, strict=True)
                      if (m, suite) in cell]  # fmt: skip
            if points:
                ax.scatter(*zip(*points, strict=True), s=12, marker=markers[k % len(markers)],
                           color="black", alpha=0.55, zorder=3, label=short(suite))  # fmt: skip
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(ys, [short(m) for m in methods])
        for label in ax.get_yticklabels():
            if label.get_text() in SHIPPED:
                label.set_fontweight("bold")
        ax.invert_yaxis()
        baseline = next((r.baseline for r in rows if r.pair == pair), AR)
        ax.set_xlabel(f"speedup vs {baseline} (bar: all suites, 95% CI)")
        ax.set_title(short(pair, 2 * LABEL_CHARS), fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
    if not methods:  # a sweep of plain decoding alone: say so, not empty axes and legends
        for ax in axes[0]:
            ax.text(0.5, 0.5, "no method measured beside the plain decoding baseline",
                    transform=ax.transAxes, ha="center", va="center", color="grey")  # fmt: skip
        return save_figure(fig, path)
    handles = [Rectangle((0, 0), 1, 1, color=colormaps[c](0.75)) for _, c in families]
    if axes[0, -1].get_legend_handles_labels()[0]:  # the last panel drew per-suite markers
        legend = axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0),
                                    fontsize="small", title="per suite", frameon=False)  # fmt: skip
        axes[0, -1].add_artist(legend)
    axes[0, -1].legend(handles, [f for f, _ in families], loc="lower left",
                       bbox_to_anchor=(1.02, 0.0), fontsize="small", title="family",
                       frameon=False)  # fmt: skip
    return save_figure(fig, path)


def error_bars(rows: Sequence[Row | None]) -> list[list[float]]:
    """`yerr` for bars of the rows' speedups: distances to the 95% interval's ends (0 if none)."""
    low, high = [], []
    for r in rows:
        interval = r.intervals.get("speedup") if r else None
        low.append(max(0.0, r.speedup - interval.lo) if interval else 0.0)
        high.append(max(0.0, interval.hi - r.speedup) if interval else 0.0)
    return [low, high]


def plot_tau(requests: Sequence[Request], path: Path) -> Path:
    """Box plot of per-request tau for every measured speculative method (all pairs and
    suites), grouped by family as in the speedup plot, highest median first within a family;
    plain decoding (tau 1 by definition) left out."""
    measured = [r for r in requests if r.mode == MEASURED and r.method not in PLAIN]
    taus: dict[str, list[float]] = {}
    for r in measured:
        taus.setdefault(r.method, []).append(r.tau)
    methods = method_order(list(taus), {m: statistics.median(t) for m, t in taus.items()})
    fig = figure(max(6, 0.6 * len(methods) + 2), 4.5)
    ax = fig.subplots()
    if methods:
        ax.boxplot([taus[m] for m in methods])
        ax.set_xticks(range(1, len(methods) + 1), [short(m) for m in methods], rotation=45,
                      ha="right")  # fmt: skip
    else:
        ax.text(0.5, 0.5, "no method measured beside plain decoding", transform=ax.transAxes,
                ha="center", va="center", color="grey")  # fmt: skip
    ax.set_ylabel("tau (tokens per target forward, bonus included)")
    ax.set_title("tau per request (all pairs and suites)")
    return save_figure(fig, path)


def plot_time_split(rows: Sequence[Row], path: Path) -> Path:
    """Stacked bars: fraction of wall time in target / strong / weak forwards and framework."""
    chosen = [r for r in rows if r.pair == ALL and r.suite == ALL]
    labels = [short(r.method) + ("" if r.mode == MEASURED else f" ({r.mode})") for r in chosen]
    fig = figure(8, 0.45 * len(chosen) + 1.5)
    ax = fig.subplots()
    left = [0.0] * len(chosen)
    ys = list(range(len(chosen)))  # positions, not labels: two shortened alike stay two bars
    for key in SPLIT_KEYS:
        values = [r.split[key] for r in chosen]
        ax.barh(ys, values, left=left, label=key, color=SPLIT_COLOURS[key])
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(ys, labels)
    ax.set_xlabel("fraction of wall time")
    ax.set_title("where the wall time goes (all pairs and suites)")
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)


def plot_replay(rows: Sequence[Row], path: Path) -> Path:
    """Replay-predicted vs measured speedup per pipeline (overall), with the diagonal; labels
    stacked beside the points without overlapping, each joined to its point by a line."""
    overall = {(r.method, r.mode): r for r in rows if r.pair == ALL and r.suite == ALL}
    points = [
        (overall[(m, MEASURED)].speedup, r.speedup, m)
        for (m, mode), r in overall.items()
        if mode == REPLAY and (m, MEASURED) in overall
    ]
    fig = figure(7.5, 5.5)
    ax = fig.subplots()
    top = max([1.0, *(max(x, y) for x, y, _ in points)]) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    colours = method_colours([m for _, _, m in points])
    for x, y, label in points:
        ax.scatter([x], [y], color=colours[label], edgecolor="black", linewidth=0.5, zorder=3)
    placed = spread_labels([y for _, y, _ in points], min_gap=top / 28)
    for (x, y, label), ty in zip(points, placed, strict=True):
        ax.annotate(short(label), (x, y), xytext=(top * 1.03, ty), textcoords="data",
                    fontsize="small",
                    va="center", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.5})  # fmt: skip
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured speedup")
    ax.set_ylabel("replay-predicted speedup")
    ax.set_title("replay-predicted vs measured speedup (all pairs and suites)")
    return save_figure(fig, path)


def spread_labels(ys: Sequence[float], min_gap: float) -> list[float]:
    """Label heights near `ys`, in the same order, at least `min_gap` apart (pushed apart
    symmetrically around their mean so the block stays centred on the points)."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    placed = [ys[i] for i in order]
    for k in range(1, len(placed)):
        placed[k] = max(placed[k], placed[k - 1] + min_gap)
    shift = (sum(ys) - sum(placed)) / len(ys) if ys else 0.0
    placed = [p + shift for p in placed]
    out = [0.0] * len(ys)
    for i, p in zip(order, placed, strict=True):
        out[i] = p
    return out


def save_figure(fig: Figure, path: Path) -> Path:
    """Lay out, write and close `fig`; return `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    if pyplot := sys.modules.get("matplotlib.pyplot"):  # a pyplot figure: forget it
        pyplot.close(fig)
    return path
