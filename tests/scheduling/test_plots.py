"""The scheduler tools' figures: bars of gains over the better endpoint, and explanations."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from treegraft.scheduling import plots
from treegraft.scheduling.value_eval import gains

PNG = b"\x89PNG\r\n\x1a\n"


def rows_of(speeds: dict[str, float]) -> list[dict[str, object]]:
    g = gains(speeds)
    return [
        {
            "scheduler": n,
            "vs_best_endpoint": g.vs_best_endpoint[n],
            "oracle_share": g.oracle_share[n],
        }
        for n in speeds
    ]


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[plt.Figure]:
    """The figures the plot functions save, kept open for inspection."""
    figures: list[plt.Figure] = []

    def keep(fig: plt.Figure, path: Path) -> Path:
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def test_gain_bars_are_the_ratios_labelled_with_the_oracle_share(drawn, tmp_path):
    a = rows_of({"never": 50.0, "always": 40.0, "distilled": 55.0, "oracle": 70.0})
    b = rows_of({"never": 30.0, "always": 60.0, "distilled": 75.0, "oracle": 90.0})
    plots.plot_scheduler_gains({"pair a": a, "pair b": b}, tmp_path / "g.png", "title")
    (fig,) = drawn
    top, bottom = fig.axes
    assert [p.get_height() for p in top.patches] == pytest.approx([1.0, 0.8, 1.1, 1.4])
    assert [p.get_height() for p in bottom.patches] == pytest.approx([0.5, 1.0, 1.25, 1.5])
    labels = [t.get_text() for t in top.texts]
    assert "1.100\n0.25" in labels and "0.800\n-0.50" in labels  # distilled, always
    assert "1.400" in labels  # the oracle's own share (1) is not printed
    assert [t.get_text() for t in top.get_xticklabels()] == [
        "never",
        "always",
        "distilled",
        "oracle",
    ]
    assert top.get_title() == "pair a" and bottom.get_title() == "pair b"
    plt.close(fig)


def test_gain_bars_of_a_scheduler_missing_from_a_group_are_empty(drawn, tmp_path):
    a = rows_of({"never": 50.0, "always": 40.0, "distilled": 55.0})
    b = rows_of({"never": 50.0, "always": 40.0})
    plots.plot_scheduler_gains({"a": a, "b": b}, tmp_path / "g.png", "t")
    (fig,) = drawn
    assert [p.get_height() for p in fig.axes[1].patches] == pytest.approx([1.0, 0.8, 0.0])
    assert "1.100" in [t.get_text() for t in fig.axes[0].texts]  # no oracle: no share
    plt.close(fig)


def test_explain_figure_sets_call_rates_beside_label_rates(drawn, tmp_path):
    report = {
        "source": "dataset (10 rows)",
        "importance": {"layer": 0.3, "log_nodes": 0.2, "peek_known": 0.1},
        "importance_kind": "permutation: rise in squared error",
        "decision_rate": {"0": 0.4, "1": 0.2},
        "label_rate": {"0": 0.5, "1": 0.1},
    }
    plots.plot_explain(report, tmp_path / "e.png", top=2)
    (fig,) = drawn
    left, right = fig.axes
    assert [p.get_width() for p in left.patches] == pytest.approx([0.3, 0.2])  # the top 2
    assert [p.get_height() for p in right.patches] == pytest.approx([0.4, 0.2, 0.5, 0.1])
    plt.close(fig)


def test_figures_are_written_as_images(tmp_path):
    rows = rows_of({"never": 50.0, "always": 40.0, "distilled": 55.0, "oracle": 70.0})
    path = plots.plot_scheduler_gains({"a": rows}, tmp_path / "g.png", "t")
    assert path.read_bytes()[:8] == PNG
    report = {"source": "artifact weights", "importance": {"layer": 1.0},
              "importance_kind": "first-layer weight norm (z-space)", "decision_rate": {}}  # fmt: skip
    path = plots.plot_explain(report, tmp_path / "e.svg")
    assert path.read_text().lstrip().startswith("<?xml")


def test_plot_paths_must_name_an_image_format(tmp_path):
    assert plots.check_plot_path(tmp_path / "a.PNG") == tmp_path / "a.PNG"
    with pytest.raises(ValueError, match=r"--plot: expected a path ending in .png, .svg, .pdf"):
        plots.check_plot_path(tmp_path / "a.txt")
    with pytest.raises(ValueError, match=r"--plot: .*got '.*a'"):
        plots.check_plot_path(tmp_path / "a")


def test_drawing_leaves_the_matplotlib_backend_alone(tmp_path):
    """Importing the scheduler plots called `matplotlib.use("Agg")`: a notebook's or program's
    own backend was switched under it (its figures no longer shown)."""
    import subprocess
    import sys

    code = (
        "import matplotlib, pathlib; matplotlib.use('svg');"
        "from treegraft.scheduling import plots;"
        "report = {'source': 's', 'importance': {'layer': 1.0}, 'importance_kind': 'k',"
        " 'decision_rate': {}};"
        f"plots.plot_explain(report, pathlib.Path({str(tmp_path / 'e.png')!r}));"
        "print(matplotlib.get_backend())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "svg"
    assert (tmp_path / "e.png").read_bytes()[:8] == PNG
