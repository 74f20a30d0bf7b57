"""The sweep's plots: method families and order, error bars, labels that do not collide."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.bench.test_aggregate import req
from treegraft.bench.aggregate import aggregate
from treegraft.bench.config import BASELINES
from treegraft.bench.plots import (
    error_bars,
    family_of,
    method_colours,
    method_order,
    plot_replay,
    plot_speedup,
    spread_labels,
)

METHODS = [*BASELINES, "treegraft-distilled", "treegraft-distilled-adaptive", "cascade3", "mine"]


def test_families_and_order() -> None:
    assert family_of("hf-assisted") == "Hugging Face"
    assert family_of("ngram-only") == family_of("chain") == "endpoints and chain"
    assert family_of("treegraft-threshold") == "scheduler variants"
    assert family_of("treegraft-distilled") == family_of("mine") == "pipelines"
    speed = {"mine": 2.0, "cascade3": 3.0, "hf-assisted": 5.0, "ngram-only": 1.0}
    order = method_order(["hf-assisted", "ngram-only", "mine", "cascade3"], speed)
    assert order == ["cascade3", "mine", "ngram-only", "hf-assisted"]
    colours = method_colours(METHODS)
    assert len({tuple(c) for c in colours.values()}) == len(METHODS)  # 15 distinct colours


def test_spread_labels_keep_order_and_gap() -> None:
    ys = [1.0, 1.01, 1.02, 2.0, 0.99]
    placed = spread_labels(ys, min_gap=0.1)
    ranked = sorted(placed)
    assert all(b - a >= 0.1 - 1e-12 for a, b in itertools.pairwise(ranked))
    assert sorted(range(5), key=lambda i: placed[i]) == sorted(range(5), key=lambda i: ys[i])
    assert sum(placed) / 5 == pytest.approx(sum(ys) / 5)
    assert spread_labels([1.0, 5.0], 0.1) == [1.0, 5.0]  # far apart: unchanged


def fifteen_methods() -> list:
    requests = []
    for suite in ("code", "chat"):
        for i in range(4):
            q = f"q{i}"
            requests.append(req("ar", q, 1.0, suite=suite))
            for k, m in enumerate(METHODS):
                wall = 1.0 / (0.6 + 0.1 * k + 0.05 * i)
                requests.append(req(m, q, wall, suite=suite))
                requests.append(req(m, q, wall * 0.95, suite=suite, mode="replay"))
    return requests


def test_speedup_and_replay_plots_with_fifteen_methods(tmp_path: Path) -> None:
    rows = aggregate(fifteen_methods())
    for plot, name in ((plot_speedup, "speedup.png"), (plot_replay, "replay.png")):
        path = plot(rows, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    overall = [r for r in rows if r.pair == "all" and r.suite == "all" and r.method == "mine"]
    low, high = error_bars(overall)
    interval = overall[0].intervals["speedup"]
    assert low[0] == pytest.approx(overall[0].speedup - interval.lo) and low[0] > 0
    assert high[0] == pytest.approx(interval.hi - overall[0].speedup) and high[0] > 0
    assert error_bars([None]) == [[0.0], [0.0]]


@pytest.mark.parametrize("suites", [1, 6])
def test_plain_decoding_is_its_own_family_and_the_legends_do_not_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suites: int
) -> None:
    """`ar` beside its faster `ar-runner` was drawn and listed as a pipeline; with few methods
    the suites' legend ran into the families' legend, which listed families not plotted."""
    from treegraft.bench import plots

    assert family_of("ar") == family_of("ar-runner") == "plain decoding"
    requests = []
    for k in range(suites):
        for i in range(3):
            wall = 1.0 + 0.1 * i
            requests += [req("ar", f"q{i}", wall, suite=f"s{k}"),
                         req("ar-runner", f"q{i}", wall / 1.2, suite=f"s{k}"),
                         req("ngram-only", f"q{i}", wall / 1.5, suite=f"s{k}")]  # fmt: skip
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plot_speedup(aggregate(requests), tmp_path / "speedup.png")
    fig = figures[0]
    fig.canvas.draw()
    legends = [a for a in fig.axes[-1].get_children() if type(a).__name__ == "Legend"]
    boxes = [legend.get_window_extent() for legend in legends]
    assert len(boxes) == 2 and not boxes[0].overlaps(boxes[1])
    families = [t.get_text() for t in legends[-1].get_texts()]
    assert families == ["endpoints and chain", "plain decoding"]


def test_long_names_are_shortened_in_every_plot(tmp_path: Path, monkeypatch) -> None:
    """A 300-character pipeline label squeezed the speedup panel to a sliver; two labels alike
    but for their middles were one bar of the time split once shortened."""
    from treegraft.bench import plots

    long_a, long_b = "a" * 150 + "-one-" + "z" * 150, "a" * 150 + "-two-" + "z" * 150
    requests = []
    for i in range(2):
        for method, wall in (("ar", 1.0), ("ar-runner", 1.1), (long_a, 0.5), (long_b, 0.6)):
            requests.append(req(method, f"q{i}", wall, suite="s" * 200, pair="p" * 200))
    rows = aggregate(requests)
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plots.plot_speedup(rows, tmp_path / "speedup.png")
    plots.plot_time_split(rows, tmp_path / "time_split.png")
    plots.plot_tau(requests, tmp_path / "tau.png")
    speedup, split, tau = figures
    for fig in figures:
        fig.tight_layout()
        fig.canvas.draw()
    ticks = [t.get_text() for t in speedup.axes[0].get_yticklabels()]
    assert len(ticks) == 3 and all(len(t) <= plots.LABEL_CHARS for t in ticks)
    assert ticks[0].startswith("aaaa") and "…" in ticks[0] and ticks[0].endswith("zzzz")
    assert len(speedup.axes[0].get_title()) <= 2 * plots.LABEL_CHARS
    suites = speedup.axes[0].get_legend_handles_labels()[1]
    assert suites and all(len(label) <= plots.LABEL_CHARS for label in suites)
    panel = speedup.axes[0].get_window_extent().width / speedup.get_window_extent().width
    assert panel > 0.3
    assert len(split.axes[0].patches) == 4 * 4  # four rows (ar, ar-runner, both long), 4 parts
    assert all(len(t.get_text()) <= plots.LABEL_CHARS for t in tau.axes[0].get_xticklabels())


def test_plots_draw_the_summary_numbers_and_say_what_they_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bars are the summary rows' numbers; every plot has a title; a sweep of plain decoding
    alone drew empty axes and two empty legends, with a matplotlib warning."""
    import warnings

    from treegraft.bench import plots

    requests = fifteen_methods()
    rows = aggregate(requests)
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plots.plot_speedup(rows, tmp_path / "s.png")
    plots.plot_time_split(rows, tmp_path / "t.png")
    plots.plot_tau(requests, tmp_path / "tau.png")
    plots.plot_replay(rows, tmp_path / "r.png")
    speedup, split, tau, replay = (fig.axes[0] for fig in figures)
    names = [t.get_text() for t in speedup.get_yticklabels()]
    overall = {r.method: r.speedup for r in rows if r.mode == "measured" and r.suite == "all"}
    widths = [bar.get_width() for bar in speedup.patches]
    assert widths == pytest.approx([overall[m] for m in names])
    chosen = [r for r in rows if r.pair == "all" and r.suite == "all"]
    assert [b.get_width() for b in split.patches[: len(chosen)]] == [
        pytest.approx(r.split["target"]) for r in chosen
    ]
    assert all(ax.get_title() for ax in (split, tau, replay))
    figures.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.plot_speedup(aggregate([req("ar", "q0", 1.0)]), tmp_path / "s.png")
    texts = [t.get_text() for t in figures[0].axes[0].texts]
    assert texts == ["no method measured beside the plain decoding baseline"]
    assert figures[0].axes[0].get_legend() is None


def test_tau_leaves_out_plain_decoding_and_orders_methods_as_the_speedup_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ar-runner` (tau 1 by definition) was boxed beside the methods, in the order the
    requests came, unlike the speedup plot's family grouping."""
    import statistics

    from treegraft.bench import plots

    requests = []
    for i in range(3):
        requests += [req("ar", f"q{i}", 1.0), req("ar-runner", f"q{i}", 0.9),
                     req("hf-assisted", f"q{i}", 0.5, steps=4), req("mine", f"q{i}", 0.4,
                     steps=3 + i)]  # fmt: skip
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plots.plot_tau(requests, tmp_path / "tau.png")
    plots.plot_tau(requests[:2], tmp_path / "none.png")
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["mine", "hf-assisted"]
    drawn = {round(float(y), 9) for line in ax.lines for y in line.get_ydata()}
    for method in ("mine", "hf-assisted"):  # the medians and the extremes of the requests
        taus = [r.tau for r in requests if r.method == method]
        for value in (statistics.median(taus), min(taus), max(taus)):
            assert round(value, 9) in drawn
    assert figures[1].axes[0].texts[0].get_text() == "no method measured beside plain decoding"
