"""`trace render` draws a traced step's tree (`treegraft.viz.trace_render`)."""

from __future__ import annotations

import json
import re
import struct

import pytest
from typer.testing import CliRunner

from tests.core.test_trace import traced_run
from treegraft.cli import app
from treegraft.viz.trace_render import label, layout, render_step, title


def test_trace_render_draws_a_png(tmp_path):
    _, files = traced_run(tmp_path)
    result = CliRunner().invoke(
        app, ["trace", "render", str(tmp_path / "trace"), "--out", str(tmp_path / "t.png")]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = CliRunner().invoke(app, ["trace", "render", str(files[0]), "--hide-pruned"])
    assert result.exit_code == 0, result.output


def test_trace_render_errors(tmp_path):
    result = CliRunner().invoke(app, ["trace", "render", str(tmp_path)])
    assert result.exit_code == 2 and "no trace step files" in result.output
    traced_run(tmp_path)
    result = CliRunner().invoke(app, ["trace", "render", str(tmp_path / "trace"), "--step", "999"])
    assert result.exit_code == 2 and "no step 999" in result.output
    bad = tmp_path / "step-00000.json"
    bad.write_text(json.dumps({"version": 99}))
    result = CliRunner().invoke(app, ["trace", "render", str(bad)])
    assert result.exit_code == 2 and "trace version" in result.output


def render(*args):
    result = CliRunner().invoke(app, ["trace", "render", *map(str, args)])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: t[:50], r"malformed JSON at line \d+, column \d+: .*damaged or truncated"),
        (
            lambda t: b"\xff\xfe",
            r"not UTF-8 text: byte 0xff at offset 0 \(a damaged trace step file\)",
        ),
        (lambda t: b"[1]", r"expected a JSON object \(a trace step record\), got a list"),
        (
            lambda t: _without(t, "nodes"),
            r"not a complete trace step: missing key\(s\) 'nodes'; expected version, step",
        ),
        (
            lambda t: _without(t, "accepted_tokens"),
            r"not a complete trace step: missing key\(s\) 'accepted_tokens'",
        ),
        (
            lambda t: _edit_node(t, 1, parent=5),
            r"not a complete trace step: nodes\[1\]: expected id 1 and a parent listed before it",
        ),
        (
            lambda t: _edit_node(t, 1, depth="2"),
            r"not a complete trace step: nodes\[1\]: depth='2' of the wrong type",
        ),
        (
            lambda t: _edit(t, calls=5),
            r"not a complete trace step: 'calls' must be a list of drafter indices, got 5",
        ),
        (
            lambda t: _edit(t, drafters="ab"),
            r"not a complete trace step: 'drafters' must be a list of names, got 'ab'",
        ),
        (
            lambda t: _edit_node(t, 1, text=7),
            r"not a complete trace step: nodes\[1\]: text=7 of the wrong type",
        ),
    ],
    ids=[
        *("truncated", "not-utf8", "list", "no-nodes", "no-accepted", "bad-parent", "bad-depth"),
        *("bad-calls", "bad-drafters", "bad-text"),
    ],
)
def test_trace_render_names_a_damaged_step_file(tmp_path, damage, message):
    _, files = traced_run(tmp_path)
    damaged = files[1]
    damaged.write_bytes(damage(damaged.read_bytes()))
    code, err = render(tmp_path / "trace")
    assert code == 2 and "internal error" not in err, err
    assert re.search(rf"^error: .*{re.escape(str(damaged))}: {message}", err, re.M), err


def _without(text: bytes, key: str) -> bytes:
    record = json.loads(text)
    del record[key]
    return json.dumps(record).encode()


def _edit(text: bytes, **changes) -> bytes:
    return json.dumps(json.loads(text) | changes).encode()


def _edit_node(data: bytes, i: int, **changes) -> bytes:
    record = json.loads(data)
    record["nodes"][i].update(changes)
    return json.dumps(record).encode()


def test_trace_render_checks_out_before_drawing(tmp_path):
    traced_run(tmp_path)
    trace = tmp_path / "trace"
    code, err = render(trace, "--out", tmp_path / "tree.xyz")
    assert code == 2, err
    assert (
        f"--out: {tmp_path / 'tree.xyz'} has format '.xyz'; expected a file name ending in "
        ".png, .svg, .pdf" in err
    )
    (tmp_path / "outdir").mkdir()
    code, err = render(trace, "--out", tmp_path / "outdir")
    assert code == 2 and f"--out: {tmp_path / 'outdir'} is a directory; expected an image" in err
    code, err = render(trace, "--out", tmp_path / "tree")
    assert code == 2 and "has no format suffix" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outdir", "trace"]  # nothing drawn
    assert sorted(p.suffix for p in trace.iterdir()) == [".json"] * len(list(trace.iterdir()))
    code, err = render(trace, "--out", tmp_path / "tree.svg")
    assert code == 0 and (tmp_path / "tree.svg").read_text().lstrip().startswith("<?xml"), err


def test_trace_render_names_a_missing_folder(tmp_path):
    code, err = render(tmp_path / "nothere")
    assert code == 2, err
    assert f"{tmp_path / 'nothere'}: no such trace folder or step file" in err


def test_trace_render_titles_a_cut_step_by_its_accepted_count(tmp_path):
    _, files = traced_run(tmp_path)
    record = json.loads(files[-1].read_text())
    record.update(accepted=3, accepted_tokens=[8], finish_reason="length")
    assert title(record, "0, 1").endswith("accepted 3 · ended by length, emitted 1")
    del record["accepted"], record["finish_reason"]  # a trace written before these keys
    assert title(record, "0, 1").endswith("· accepted 0")
    record["accepted"] = "3"
    files[-1].write_text(json.dumps(record))
    code, err = render(files[-1])
    assert code == 2 and "'accepted' must be an int (draft tokens accepted), got '3'" in err


def _chain(n: int, **root) -> dict:
    nodes = [
        {"id": i, "parent": i - 1, "token": i, "text": None, "depth": i, "score": -i, "proposer": 0}
        | {"scorer": 0, "kept": i < 3, "accepted": i < 2, "edge_logp": -1.0}
        for i in range(n)
    ]
    nodes[0].update(root)
    return {"version": 1, "step": 0, "accepted_tokens": [1, 2], "nodes": nodes}


def test_layout_places_a_chain_deeper_than_the_recursion_limit():
    pos = layout(_chain(5000, parent=-1)["nodes"])
    assert pos[4999] == (4999.0, 0.0) and len(pos) == 5000


def test_trace_render_hide_pruned_keeps_the_root(tmp_path):
    step = tmp_path / "step-00000.json"
    step.write_text(json.dumps(_chain(4, parent=-1, kept=False)))
    code, err = render(step, "--hide-pruned")
    assert code == 0 and (tmp_path / "step-00000.png").exists(), err


def test_trace_render_names_an_out_path_it_cannot_write(tmp_path):
    _, files = traced_run(tmp_path)
    (tmp_path / "afile").write_text("")
    code, err = render(files[0], "--out", tmp_path / "afile" / "tree.png")
    assert code == 2 and "internal error" not in err, err
    assert (
        f"--out: cannot write {tmp_path / 'afile' / 'tree.png'}: {tmp_path / 'afile'} is a file; "
        "expected a directory" in err
    )


def test_trace_render_gives_a_root_only_step_room_for_title_and_legend(tmp_path):
    step = tmp_path / "step-00000.json"
    step.write_text(json.dumps(_chain(1, parent=-1, kept=True) | {"drafters": ["weak:ngram"]}))
    code, err = render(step)
    assert code == 0 and "warning" not in err, err  # was: 'Tight layout not applied', clipped
    header = (tmp_path / "step-00000.png").read_bytes()[16:24]
    width, _ = struct.unpack(">II", header)
    assert width > 1000  # the 2.2-inch figure was 286 pixels wide, title and legend cut off


def test_render_step_draws_a_big_tree_as_a_few_collections(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    record = _chain(300, parent=-1)
    for node in record["nodes"][2:]:  # a wide tree: the rest hang off node 1, some rescored
        node.update(parent=1, depth=2, scorer=node["id"] % 2)
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    render_step(record, tmp_path / "wide.png")
    (ax,) = figures[0].axes
    # one scatter of nodes, one of rescoring diamonds, two of edges; was one artist per node
    assert len(ax.collections) + len(ax.lines) == 4


def test_trace_render_draws_dollar_tokens_as_text(tmp_path):
    record = _chain(4, parent=-1) | {"drafters": ["weak $x^$"]}
    for node, text in zip(record["nodes"][1:], ["$$", "${x^}", "$\\frac"], strict=True):
        node["text"] = text  # shell and LaTeX tokens: were parsed as matplotlib math
    step = tmp_path / "step-00000.json"
    step.write_text(json.dumps(record))
    code, err = render(step, "--out", tmp_path / "t.png")
    assert code == 0 and (tmp_path / "t.png").exists(), err  # was: internal error: ValueError: $$
    assert label({"text": "$x$"}) == r"\$x\$"


def test_trace_render_step_reads_only_its_file_and_names_the_gaps(tmp_path):
    """`--step 1` failed on another step's damaged file; a missing step was said to be inside
    the range the trace held; an interrupted or gapped trace rendered without a word."""
    _, files = traced_run(tmp_path)
    trace = tmp_path / "trace"
    files[-1].write_bytes(files[-1].read_bytes()[:40])  # a damaged last step
    files[2].unlink()
    code, err = render(trace, "--step", 1, "--out", tmp_path / "one.png")
    assert code == 0 and "error" not in err, err
    code, err = render(trace, "--step", 2)
    last = len(files) - 1
    assert code == 2 and f"no step 2 in {trace}; its steps run from 0 to {last}, without 2" in err
    files[-1].unlink()
    code, err = render(trace, "--out", tmp_path / "all.png")
    assert code == 0, err
    assert "note: the trace lacks step(s) 2 (deleted, or never written)" in err
    assert f"note: the trace ends at step {last - 1} with no finish reason: its run was" in err
    code, err = render(files[0], "--out", tmp_path / "first.png")  # one file: no notes
    assert code == 0 and "note" not in err, err
    code, err = render(files[0], "--step", 1)
    assert code == 2 and "no step 1 in" in err and "the file holds step 0" in err, err
    code, err = render(files[0], "--step", -1)  # was 'no step -1 in ...'
    assert code == 2 and "'--step': expected a value greater than or equal to 0" in err, err


def test_hide_pruned_leaves_no_gaps_and_the_legend_lists_what_is_drawn(tmp_path, monkeypatch):
    """`--hide-pruned` still gave each hidden node a row (a kept chain drawn as a staircase in
    a figure as tall as the whole tree) and listed pruned and rescored markers not drawn."""
    from matplotlib.figure import Figure

    record = _chain(3, parent=-1) | {"drafters": ["weak:ngram"]}
    record["nodes"][2]["kept"] = True
    for i in range(3, 40):  # pruned siblings at depth 1, each better scored than the kept one
        record["nodes"].append(record["nodes"][1] | {"id": i, "kept": False, "score": 0.0})
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    render_step(record, tmp_path / "hidden.png", show_pruned=False)
    render_step(record, tmp_path / "all.png")
    hidden, whole = (fig.axes[0] for fig in figures)
    points = hidden.collections[-1].get_offsets()  # the nodes' scatter: a straight chain
    assert len(points) == 3 and len({float(y) for _, y in points}) == 1
    assert figures[0].get_figheight() < figures[1].get_figheight() / 4
    legend = [t.get_text() for t in hidden.get_legend().get_texts()]
    assert legend == ["0: weak:ngram", "accepted path"]
    assert "pruned before verification" in [t.get_text() for t in whole.get_legend().get_texts()]


def test_drawing_leaves_the_matplotlib_backend_alone(tmp_path):
    """`render_step` and importing the bench plots called `matplotlib.use("Agg")`: a notebook's
    or program's own backend was switched under it (its figures no longer shown)."""
    code = (
        "import matplotlib, pathlib, json; matplotlib.use('svg');"
        "import treegraft.bench.plots;"
        "from treegraft.viz.trace_render import render_step;"
        f"render_step(json.loads({json.dumps(json.dumps(_chain(3, parent=-1)))}),"
        f" pathlib.Path({str(tmp_path / 't.png')!r}));"
        "print(matplotlib.get_backend())"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "svg"
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_step_names_a_record_that_is_no_step_and_takes_a_str_path(tmp_path):
    """An empty or partial record raised IndexError or KeyError from inside the drawing; a
    str `out` raised AttributeError."""
    from treegraft.core.errors import ArgumentError

    for record, message in (
        ({"nodes": []}, "missing key(s) 'version', 'step', 'accepted_tokens'"),
        (_chain(2, parent=-1) | {"nodes": [{"id": 0}]}, "nodes[0] is not an object with keys"),
    ):
        with pytest.raises(
            ArgumentError, match=re.escape(f"render_step: record: not a trace step: {message}")
        ):
            render_step(record, tmp_path / "x.png")
    with pytest.raises(ArgumentError, match="render_step: out: expected a file path"):
        render_step(_chain(2, parent=-1), None)
    assert render_step(_chain(2, parent=-1), str(tmp_path / "s.png")) == tmp_path / "s.png"
    with pytest.raises(ArgumentError, match=r"render_step: out: .*t.xyz has format '.xyz'"):
        render_step(_chain(2, parent=-1), tmp_path / "t.xyz")  # was matplotlib's ValueError


def test_a_long_drafter_name_is_shortened_in_the_legend(tmp_path, monkeypatch):
    """A 300-character role name (roles are free names) made the legend wider than the tree."""
    from matplotlib.figure import Figure

    from treegraft.viz import LABEL_CHARS

    record = _chain(3, parent=-1) | {"drafters": ["w" * 150 + ":" + "n" * 150]}
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    render_step(record, tmp_path / "t.png")
    texts = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert len(texts[0]) <= LABEL_CHARS and texts[0].startswith("0: www") and "…" in texts[0]
