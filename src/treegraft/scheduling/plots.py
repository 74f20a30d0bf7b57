"""The scheduler tools' figures: gains over the better endpoint, and explanations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from treegraft.bench.plots import save_figure
from treegraft.viz import figure

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: Path, option: str = "--plot") -> Path:
    """Refuse a plot path whose suffix matplotlib would not write as an image."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(
            f"{option}: expected a path ending in {', '.join(PLOT_SUFFIXES)}, got {str(path)!r}"
        )
    return path


def plot_scheduler_gains(
    groups: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str
) -> Path:
    """Per group (a dataset or a pair), each scheduler's tokens/s over the better endpoint.

    `groups` maps a name to rows in the `--json` form of `treegraft scheduler evaluate`
    (`scheduler`, `vs_best_endpoint`, `oracle_share`). The better endpoint is the line at 1; each
    bar is labelled with its ratio and, where an oracle row exists, its share of the oracle's gain.
    """
    names = list(dict.fromkeys(r["scheduler"] for rows in groups.values() for r in rows))
    fig = figure(max(7.5, 0.9 * len(names) + 2), 3.2 * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False)
    for ax, (group, rows) in zip(axes[:, 0], groups.items(), strict=True):
        by_name = {r["scheduler"]: r for r in rows}
        heights = [(by_name[n]["vs_best_endpoint"] or 0.0) if n in by_name else 0.0 for n in names]
        colours = [
            "#8c8c8c" if n in ("never", "always") else "#55a868" if n == "oracle" else "#4c72b0"
            for n in names
        ]
        bars = ax.bar(range(len(names)), heights, color=colours)
        for bar, n in zip(bars, names, strict=True):
            share = by_name.get(n, {}).get("oracle_share")
            text = f"{bar.get_height():.3f}" + (
                f"\n{share:.2f}" if share is not None and n != "oracle" else ""
            )
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize="x-small")  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
        ax.set_ylim(0, max([1.0, *heights]) * 1.18)
        ax.set_ylabel("tokens/s / better endpoint")
        ax.set_title(group, fontsize="small")
    fig.suptitle(f"{title}\nlabels: tokens/s over the better endpoint, share of the oracle's gain",
                 fontsize="small")  # fmt: skip
    return save_figure(fig, path)


def plot_explain(report: Mapping[str, Any], path: Path, top: int = 12) -> Path:
    """`treegraft scheduler explain` as a figure: the `top` feature importances and, per layer,
    the predicted strong-call rate beside the rate of positive labels (when explained on data)."""
    importance = list(report["importance"].items())[:top]
    fig = figure(11, max(3.5, 0.28 * len(importance) + 1.5))
    left, right = fig.subplots(1, 2)
    left.barh([k for k, _ in importance], [v for _, v in importance], color="#4c72b0")
    left.invert_yaxis()
    left.set_xlabel(report["importance_kind"])
    left.set_title(f"importance (top {len(importance)})", fontsize="small")
    rates = report.get("decision_rate") or {}
    labels = report.get("label_rate") or {}
    layers = list(rates)
    width = 0.4 if labels else 0.8
    right.bar([i - (width / 2 if labels else 0) for i in range(len(layers))],
              [rates[k] for k in layers], width, label="predicted calls", color="#dd8452")  # fmt: skip
    if labels:
        right.bar([i + width / 2 for i in range(len(layers))],
                  [labels.get(k, 0.0) for k in layers], width, label="positive labels",
                  color="#55a868")  # fmt: skip
        right.legend(fontsize="small")
    right.set_xticks(range(len(layers)), layers)
    right.set_xlabel("layer")
    right.set_ylim(0, 1)
    right.set_ylabel("fraction of decisions")
    right.set_title(
        "strong-call rate per layer" if layers else "no decision rates (explain on a dataset)",
        fontsize="small",
    )
    fig.suptitle(f"explained on: {report['source']}", fontsize="small")
    return save_figure(fig, path)
