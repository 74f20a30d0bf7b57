"""PNG plots (matplotlib, headless): a sweep's speedup per suite, tau distribution and time split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from treegraft.bench.aggregate import ALL, Row
from treegraft.bench.config import AR
from treegraft.bench.records import MEASURED, REPLAY, SPLIT_KEYS, Request

COLOURS = plt.get_cmap("tab20")
SPLIT_COLOURS = {
    "target": "#4c72b0",
    "strong": "#dd8452",
    "weak": "#55a868",
    "framework": "#8c8c8c",
}


def plot_speedup(rows: Sequence[Row], path: Path) -> Path:
    """Grouped bars: speedup (ratio of medians) per suite and method, one panel per pair, over
    the pair's faster plain decoding (its `baseline`, named on the axis and left out of the bars)."""
    pairs = list(dict.fromkeys(r.pair for r in rows if r.pair != ALL))
    methods = list(
        dict.fromkeys(r.method for r in rows if r.mode == MEASURED and r.method != r.baseline)
    )
    suites = list(dict.fromkeys(r.suite for r in rows))
    fig, axes = plt.subplots(
        len(pairs),
        1,
        figsize=(max(8, 1.2 * len(suites) * max(1, len(methods)) / 4), 3.5 * len(pairs)),
        squeeze=False,
    )
    width = 0.8 / max(1, len(methods))
    for ax, pair in zip(axes[:, 0], pairs, strict=True):
        cell = {
            (r.method, r.suite): r.speedup for r in rows if r.pair == pair and r.mode == MEASURED
        }
        for j, method in enumerate(methods):
            xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(suites))]
            heights = [cell.get((method, s), 0.0) for s in suites]
            ax.bar(xs, heights, width, label=method, color=COLOURS(j % COLOURS.N))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(suites)), suites)
        baseline = next((r.baseline for r in rows if r.pair == pair), AR)
        ax.set_ylabel(f"speedup vs {baseline}")
        ax.set_title(pair)
    axes[0, 0].legend(fontsize="small", ncol=3, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)


def plot_tau(requests: Sequence[Request], path: Path) -> Path:
    """Box plot of per-request tau for every measured method (all pairs and suites)."""
    methods = list(
        dict.fromkeys(r.method for r in requests if r.mode == MEASURED and r.method != AR)
    )
    data = [[r.tau for r in requests if r.method == m and r.mode == MEASURED] for m in methods]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(methods) + 2), 4.5))
    if methods:
        ax.boxplot(data)
        ax.set_xticks(range(1, len(methods) + 1), methods, rotation=45, ha="right")
    ax.set_ylabel("tau (tokens per target forward, bonus included)")
    ax.set_title("tau per request")
    return save_figure(fig, path)


def plot_time_split(rows: Sequence[Row], path: Path) -> Path:
    """Stacked bars: fraction of wall time in target / strong / weak forwards and framework."""
    chosen = [r for r in rows if r.pair == ALL and r.suite == ALL]
    labels = [r.method if r.mode == MEASURED else f"{r.method} ({r.mode})" for r in chosen]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(chosen) + 1.5))
    left = [0.0] * len(chosen)
    for key in SPLIT_KEYS:
        values = [r.split[key] for r in chosen]
        ax.barh(labels, values, left=left, label=key, color=SPLIT_COLOURS[key])
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("fraction of wall time")
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)


def plot_replay(rows: Sequence[Row], path: Path) -> Path:
    """Replay-predicted vs measured speedup per pipeline (overall), with the diagonal."""
    overall = {(r.method, r.mode): r for r in rows if r.pair == ALL and r.suite == ALL}
    points = [
        (overall[(m, MEASURED)].speedup, r.speedup, m)
        for (m, mode), r in overall.items()
        if mode == REPLAY and (m, MEASURED) in overall
    ]
    fig, ax = plt.subplots(figsize=(5, 5))
    for x, y, label in points:
        ax.scatter([x], [y])
        ax.annotate(label, (x, y), fontsize="small")
    top = max([1.0, *(max(x, y) for x, y, _ in points)]) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    ax.set_xlabel("measured speedup")
    ax.set_ylabel("replay-predicted speedup")
    return save_figure(fig, path)


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Lay out, write and close `fig`; return `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
