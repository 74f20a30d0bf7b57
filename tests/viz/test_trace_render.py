"""`trace render` draws a traced step's tree (`treegraft.viz.trace_render`)."""

from __future__ import annotations

import json

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
