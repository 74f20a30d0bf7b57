"""Reading a sweep's files back: a damaged one is named with what is wrong, never half-read."""

from __future__ import annotations

from pathlib import Path

import pytest

from treegraft.bench.readback import read_json_object, read_summary_csv
from treegraft.core.errors import ArgumentError

HEADER = "pair,suite,method,mode,prompts,speedup,speedup_lo,speedup_hi,baseline\r\n"
ROWS = [
    f"{pair},{suite},{method},measured,12,{speedup},1.1,1.3,ar-runner\r\n"
    for pair in ("p", "all")
    for suite in ("code", "all")
    for method, speedup in (("ar-runner", "1"), ("tg", "1.2"))
]
WHOLE = HEADER + "".join(ROWS)


def summary(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "summary.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_a_whole_summary_reads_back(tmp_path):
    rows = read_summary_csv(summary(tmp_path, WHOLE))
    assert len(rows) == 8 and rows[-1]["method"] == "tg" and rows[-1]["speedup"] == "1.2"


DAMAGED = {
    "empty": ("", "the file is empty"),
    "header-only": (HEADER, "only a header, no rows"),
    "no-key-column": ("pair,method,speedup\r\np,m,1\r\n", "no column suite, mode in its header"),
    "cut-short": (WHOLE[:-25], "its last line (9) ends without a line break: cut short?"),
    "a-short-row": (HEADER + "p,code,tg,measured,1\r\n" + "".join(ROWS), "line 2 has fewer fields"),
    "cut-at-a-line-end": (
        HEADER + "".join(ROWS[:6]),
        "no row for pair 'all', suite 'all' of ar-runner (measured), which its pair 'all', "
        "suite 'code' row implies: cut short?",
    ),
    "extra-field": (WHOLE + "p,code,x,measured,1,1,1,1,ar,9\r\n", "line 10 has more fields"),
    "not-a-number": (WHOLE.replace(",1.2,", ",1.2x,", 1), "line 3: speedup '1.2x' is not a number"),
    "bad-mode": (WHOLE.replace("measured", "measurd", 1), "line 2: mode 'measurd', expected"),
    "bad-baseline": (
        WHOLE.replace("ar-runner\r\n", "ar-run\r\n", 1),
        "line 2: baseline 'ar-run' is not ar or ar-runner",
    ),
    "no-method": (WHOLE.replace(",ar-runner,", ",,", 1), "line 2: no method"),
}


@pytest.mark.parametrize(("text", "why"), DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_summary_is_refused_naming_the_file(tmp_path, text: str, why: str):
    path = summary(tmp_path, text)
    with pytest.raises(ArgumentError) as info:
        read_summary_csv(path)
    assert str(info.value).startswith(f"{path} is not a sweep's summary ({why}")
    assert str(info.value).endswith("; rerun its sweep with --resume to write it again")


def test_a_summary_not_utf8_is_refused_naming_the_byte(tmp_path):
    path = summary(tmp_path, b"\xff\xfe" + WHOLE.encode())
    with pytest.raises(ArgumentError) as info:
        read_summary_csv(path)
    assert str(info.value) == (
        f"{path} is not a sweep's summary (not UTF-8 text: byte 0xff at offset 0)"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"a": ', "malformed JSON at line 1 column 7: Expecting value)"),
        ('{"a": "\t"}', "malformed JSON at line 1 column 8: Invalid control character)"),
        ("[1, 2]", "expected a JSON object, got a list)"),
        ("null", "expected a JSON object, got null)"),
        ("3", "expected a JSON object, got a number)"),
    ],
)
def test_a_file_not_holding_a_json_object_is_named(tmp_path, text: str, why: str):
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(ArgumentError) as info:
        read_json_object(path, "a results manifest")
    assert str(info.value) == f"{path} is not a results manifest ({why}"


def test_requests_read_back_leaving_out_a_torn_last_line_only(tmp_path: Path) -> None:
    import json

    from tests.bench.test_store import record
    from treegraft.bench.readback import read_requests
    from treegraft.bench.records import request_to_json

    request = record("a").requests[0]
    line = json.dumps(request_to_json(request))
    path = tmp_path / "requests.jsonl"
    path.write_text(f"{line}\n{line}")  # a whole last line without its line break
    assert read_requests(path) == [request, request]
    path.write_text(f"{line}\n{line[:30]}")  # torn where a kill stopped the write
    assert read_requests(path) == [request]
    path.write_text(f"{line}\n{{}}\n{line}\n")
    with pytest.raises(ArgumentError) as info:
        read_requests(path)
    assert str(info.value).startswith(f"{path}, line 2: not a request (a request without 'pair'")
