"""`trace render` draws a traced step's tree (`treegraft.viz.trace_render`)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from tests.core.test_trace import traced_run
from treegraft.cli import app


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
    ],
    ids=["truncated", "not-utf8", "list", "no-nodes", "no-accepted", "bad-parent", "bad-depth"],
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


def _edit_node(text: bytes, i: int, **changes) -> bytes:
    record = json.loads(text)
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
