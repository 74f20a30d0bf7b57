"""Starting and resuming a sweep (`treegraft.bench.run`): what is refused before anything runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest
import yaml
from typer.testing import CliRunner

from tests.bench.conftest import pair_resources, write_suites
from tests.conftest import memory_resources
from treegraft.bench import bench_config_from_dict, run_bench
from treegraft.bench.run import check_device
from treegraft.bench.store import encode_line, read_store
from treegraft.cli import app
from treegraft.core.config import ConfigError
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import resolve_pipeline


def small_config(tmp_path: Path, **settings):
    """One pair, two suites of one prompt, a pipeline read from a file beside the sweep."""
    shutil.copy(resolve_pipeline("ngram-only"), tmp_path / "mine.yaml")
    return bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 1,
            "max_new_tokens": 6,
            "baselines": [],
            "pipelines": ["mine.yaml"],
            "warmup_tokens": 0,
            **settings,
        },
        base_dir=tmp_path,
    )


def test_a_device_this_machine_lacks_is_refused_before_any_model_loads(tmp_path):
    config = small_config(tmp_path, device="cuda:99")
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^bench\.device: device 'cuda:99'"):
        run_bench(config, out, resources=memory_resources(), progress=False)
    assert not out.exists()
    ray = attrs.evolve(config, executor=attrs.evolve(config.executor, name="ray"))
    check_device(ray)  # Ray workers run elsewhere: their devices are theirs to check


def test_resume_refuses_a_pipeline_whose_file_changed(tmp_path):
    """Same sweep file, same pipeline path, but the pipeline's content was edited: its stored
    results were measured with the old one and would be mixed with new ones under one label."""
    config = small_config(tmp_path)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    digests = json.loads((out / "manifest.json").read_text())["pipelines"]
    assert list(digests) == ["target+draft/mine"] and len(digests["target+draft/mine"]) == 16
    pipeline = tmp_path / "mine.yaml"
    original = pipeline.read_text()
    edited = yaml.safe_load(original)
    edited["builder"]["budget"] = 1
    pipeline.write_text(yaml.safe_dump(edited))
    with pytest.raises(ConfigError) as info:
        run_bench(config, out, resources=pair_resources(), progress=False, resume=True)
    assert str(info.value) == (
        f"cannot resume {out}: pipeline mine ({pipeline}) changed since its results were "
        "measured; restore it, or start a new sweep (another --out, or --force)"
    )
    pipeline.write_text(original + "\n# a comment changes nothing\n")  # restored
    run_bench(config, out, resources=pair_resources(), progress=False, resume=True)


def test_a_manifest_without_pipeline_digests_resumes_with_a_warning(tmp_path):
    config = small_config(tmp_path)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest.pop("pipelines")
    (out / "manifest.json").write_text(json.dumps(manifest))  # as an older treegraft wrote it
    with pytest.warns(UserWarning, match=r"records no pipeline digests \(an older sweep\)"):
        run_bench(config, out, resources=memory_resources(), progress=False, resume=True)
    assert json.loads((out / "manifest.json").read_text())["pipelines"] == recorded


def test_units_of_another_sweep_merged_into_the_store_are_refused(tmp_path):
    """They were reported as this sweep's: an extra prompt, or a method it never ran."""
    config = small_config(tmp_path)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    store = out / "units.jsonl"
    whole = store.read_bytes()
    first = read_store(store).records[0]
    other_prompt = attrs.evolve(
        first,
        prompt_ids=("code-7",),
        requests=tuple(attrs.evolve(r, prompt_id="code-7") for r in first.requests),
    )
    other_method = attrs.evolve(
        first, requests=tuple(attrs.evolve(r, method="theirs") for r in first.requests[-1:])
    )
    store.write_bytes(whole + encode_line(other_prompt) + encode_line(other_method))
    with pytest.raises(ConfigError) as info:
        run_bench(config, out, resources=memory_resources(), progress=False, resume=True)
    assert str(info.value) == (
        f"cannot resume {out}: its units.jsonl holds units of prompts or methods this sweep "
        "does not have (target+draft/code/code-7 r0, target+draft: theirs (measured)): another "
        "sweep's, merged into it? Keep each sweep's units in its own folder"
    )
    store.write_bytes(whole)
    run_bench(config, out, resources=memory_resources(), progress=False, resume=True)


def test_a_resume_on_another_environment_is_said_not_pooled_silently(tmp_path):
    config = small_config(tmp_path)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    run_bench(config, out, resources=memory_resources(), progress=False, resume=True)
    assert "## Segments on different environments" not in (out / "summary.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["segments"][0]["environment"].update(torch="1.0", cpu="Other CPU")
    (out / "manifest.json").write_text(json.dumps(manifest))  # as if run elsewhere first
    with pytest.warns(UserWarning, match=r"segments ran on different environments \(torch 1\.0"):
        run_bench(config, out, resources=memory_resources(), progress=False, resume=True)
    summary = (out / "summary.md").read_text()
    assert "This sweep ran in 3 segments" in summary and "cpu Other CPU vs " in summary


DAMAGED = {
    "truncated": (b'{"started": "2026-', "malformed JSON at line 1 column 13: Unterminated"),
    "a-list": (b"[1, 2]", "expected a JSON object, got a list"),
    "not-utf8": (b"\xff\xfe{}", "not UTF-8 text: byte 0xff at offset 0"),
    "no-config": (b'{"started": "x"}', "no 'config' object in it"),
    "config-a-list": (b'{"config": []}', "no 'config' object in it"),
    "segments": (b'{"config": {}, "segments": {}}', "its 'segments' is not a list"),
    "prompts": (b'{"config": {}, "prompts": [1]}', "its 'prompts' is not a dict"),
}


@pytest.mark.parametrize(("content", "why"), DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_manifest_is_named_not_an_internal_error(tmp_path, content: bytes, why: str):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_bytes(content)
    with pytest.raises(ConfigError) as info:
        run_bench(
            small_config(tmp_path), out, resources=memory_resources(), progress=False, resume=True
        )
    assert str(info.value).startswith(
        f"cannot resume {out}: {out / 'manifest.json'} is not a results manifest ({why}"
    )


def test_damaged_latency_curves_are_named(tmp_path):
    config = small_config(tmp_path, replay=True, latency_repeats=1)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    (out / "latency.json").write_text('{"target+draft": {"target": [1.0,')
    with pytest.raises(ConfigError, match=r"latency\.json is not latency curves \(malformed JSON"):
        run_bench(config, out, resources=memory_resources(), progress=False, resume=True)
    curves = {"target+draft": {"mem:target": {"context": 4, "queries": [1], "seconds": [0.1]}}}
    (out / "latency.json").write_text(json.dumps(curves))  # each unit of the pair failed on it
    refused = r"latency\.json is not latency curves \(pair 'target\+draft', model 'mem:target': no"
    with pytest.raises(ConfigError, match=refused + " 'model'"):
        run_bench(config, out, resources=memory_resources(), progress=False, resume=True)
    curves["target+draft"]["mem:target"].update(model="mem:target", seconds=[])
    (out / "latency.json").write_text(json.dumps(curves))
    with pytest.raises(ConfigError, match=refused.removesuffix(" no") + " expected as many"):
        run_bench(config, out, resources=memory_resources(), progress=False, resume=True)


def test_an_older_sweep_cut_mid_line_resumes_and_a_damaged_line_is_named(tmp_path):
    """A sweep from before the result store holds `requests.jsonl` alone, its last line torn
    where the run was killed (it was a raw JSONDecodeError)."""
    config = small_config(tmp_path)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    (out / "units.jsonl").unlink()
    lines = (out / "requests.jsonl").read_text().splitlines(keepends=True)
    (out / "requests.jsonl").write_text("".join(lines[:-1]) + lines[-1][:40])
    resumed = run_bench(config, out, resources=pair_resources(), progress=False, resume=True)
    assert len(resumed.requests) == len(lines)
    workers = [r.worker["worker"] for r in read_store(out / "units.jsonl").records]
    assert workers == ["unknown", "local"]  # the whole prompt imported, the cut one run again
    (out / "units.jsonl").unlink()
    (out / "requests.jsonl").write_text("".join([lines[0], "{not json\n", *lines[2:]]))
    with pytest.raises(ConfigError) as info:
        run_bench(config, out, resources=pair_resources(), progress=False, resume=True)
    assert str(info.value).startswith(
        f"cannot resume {out}: {out / 'requests.jsonl'}, line 2: not a request (Expecting"
    )


REFUSED_BEFORE_THE_FOLDER = {
    "device": ({"device": "cuda:99"}, [], "bench.device: device 'cuda:99'"),
    "zoo-model": (
        {"pairs": [{"target": "zoo:nosuch", "drafter": "zoo:draft-s"}]},
        [],
        "bench.pairs[0].target (nosuch+draft-s): unknown zoo model 'zoo:nosuch'",
    ),
    "model-folder": (
        {"pairs": [{"target": "zoo:target", "drafter": "no/such/folder"}]},
        [],
        "bench.pairs[0].drafter (target+folder): model 'no/such/folder' not found",
    ),
    "mem-model": (
        {"pairs": [{"target": "mem:target", "drafter": "zoo:draft-s"}]},
        [],
        "bench.pairs[0].target (target+draft-s): in-memory model 'mem:target': none is held",
    ),
    "pipeline-not-utf8": (
        {"pipelines": ["latin1.yaml"]},
        [],
        "bench.pipelines[0].pipeline: pipeline file: ",
    ),
    "resume-nothing": ({}, ["--resume"], "cannot resume"),
}


@pytest.mark.parametrize(
    ("change", "flags", "message"),
    REFUSED_BEFORE_THE_FOLDER.values(),
    ids=REFUSED_BEFORE_THE_FOLDER.keys(),
)
def test_the_command_refuses_before_it_makes_the_results_folder(
    tmp_path, change: dict, flags: list[str], message: str
):
    """`--out` was created (and, for a missing model, a manifest written into it, so the same
    command then refused the folder as not empty) before these checks refused the sweep."""
    (tmp_path / "latin1.yaml").write_bytes("target: caf\xe9\n".encode("latin-1"))
    sweep = {
        "pairs": [{"target": "zoo:target", "drafter": "zoo:draft-s"}],
        "suites": write_suites(tmp_path)[:1],
        "prompts_per_suite": 1,
        "max_new_tokens": 2,
        "baselines": [],
        "device": "cpu",
        **change,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "runs" / "out"
    result = CliRunner().invoke(app, ["bench", "run", str(path), "--out", str(out), *flags])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "runs").exists()


def test_a_suite_shorter_than_prompts_per_suite_is_said_not_reported_as_full(tmp_path):
    """Each suite holds 2 prompts: `prompts_per_suite: 3` ran 2 of each silently, and the
    report's header said 3 per suite."""
    config = small_config(tmp_path, prompts_per_suite=3, max_new_tokens=2)
    with pytest.warns(UserWarning) as caught:
        run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    said = [str(w.message) for w in caught if "prompts_per_suite" in str(w.message)]
    assert said == [
        f"bench.prompts_per_suite: 3, but suite '{suite}' holds 2 prompt(s) "
        f"({tmp_path / f'{suite}.jsonl'}): all of them run"
        for suite in ("code", "chat")
    ]
    header = (tmp_path / "out" / "summary.md").read_text().splitlines()[2]
    assert "· prompts per suite: code 2, chat 2 ·" in header
    short = small_config(tmp_path, max_new_tokens=2)  # 1 of each: as asked, said as before
    run_bench(short, tmp_path / "again", resources=pair_resources(), progress=False)
    assert "· 1 prompt(s) per suite ·" in (tmp_path / "again" / "summary.md").read_text()


def test_resume_accepts_the_sweep_file_by_another_path(tmp_path, monkeypatch):
    """`bench sweep.yaml --out o`, then `bench /abs/sweep.yaml --out o --resume` (or from
    another folder) was refused: 'its sweep differs from this one in source'."""
    from treegraft.bench import load_bench_config

    config = small_config(tmp_path, max_new_tokens=2)
    sweep = {**config.as_dict(), "pipelines": ["mine.yaml"]}
    del sweep["source"]
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    monkeypatch.chdir(tmp_path)
    first = load_bench_config("sweep.yaml")
    run_bench(first, tmp_path / "out", resources=pair_resources(), progress=False)
    again = load_bench_config(tmp_path / "sweep.yaml")
    assert again.source != first.source
    run_bench(again, tmp_path / "out", resources=memory_resources(), progress=False, resume=True)
    edited = {**sweep, "max_new_tokens": 3}  # what the sweep measures is still compared
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(edited))
    with pytest.raises(ConfigError, match=r"differs from this one in max_new_tokens$"):
        run_bench(load_bench_config("sweep.yaml"), tmp_path / "out", resume=True)


def test_force_leaves_nothing_of_the_sweep_it_replaces(tmp_path):
    """`--force` kept the earlier sweep's latency.json (read by a `--resume` of the new sweep
    as the curves its replays must reuse) and its replay.png (taken for the new sweep's)."""
    out = tmp_path / "out"
    replayed = small_config(tmp_path, replay=True, latency_repeats=1, max_new_tokens=2)
    run_bench(replayed, out, resources=pair_resources(), progress=False)
    assert (out / "latency.json").is_file() and (out / "replay.png").is_file()
    (out / "notes.txt").write_text("mine")
    plain = small_config(tmp_path, max_new_tokens=2)
    run_bench(plain, out, resources=pair_resources(), progress=False, force=True)
    assert not (out / "latency.json").exists() and not (out / "replay.png").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "summary.md").is_file()


def test_a_sweep_refused_once_its_models_load_leaves_no_folder(tmp_path):
    """A prompt too long for the pair is found when the models load: the folder was left with
    a manifest, and the corrected command was refused ('the folder is not empty')."""
    out = tmp_path / "runs" / "out"
    too_long = small_config(tmp_path, max_new_tokens=100_000)
    with pytest.raises(ConfigError, match=r"do not fit with max_new_tokens 100000"):
        run_bench(too_long, out, resources=pair_resources(), progress=False)
    assert not out.exists()
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"do not fit"):  # into a folder of the user's
        run_bench(too_long, out, resources=pair_resources(), progress=False, force=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    run_bench(small_config(tmp_path, max_new_tokens=2), out, resources=pair_resources(),
              progress=False)  # fmt: skip
    assert (out / "summary.md").is_file()


def test_the_ray_executor_without_ray_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is missing
    config = small_config(tmp_path).with_executor(name="ray")
    with pytest.raises(ConfigError) as info:
        run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    assert str(info.value) == (
        "--executor ray: Ray is not installed; install the extra with `pip install "
        "'treegraft[ray]'`"
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (({"pairs": []}, "out"), {}, "run_bench: config: expected a BenchConfig (load_bench_conf"),
        ((None, None), {}, "run_bench: out_dir: expected a file path (str or Path), got NoneType"),
        ((None, "out"), {"resources": "mem"}, "run_bench: resources: expected a Resources or N"),
        ((None, "out"), {"options": ["-v"]}, "run_bench: options: expected a dict or None, got"),
        ((None, "out"), {"resume": "no"}, "run_bench: resume: expected True or False, got str"),
    ],
)
def test_run_bench_names_an_argument_of_another_type(tmp_path, args, kwargs, message) -> None:
    """Once an AttributeError or TypeError from deep inside, or 'no' read as resume."""
    config = bench_config_from_dict(
        {"pairs": [{"target": "zoo:target", "drafter": "zoo:draft"}], "suites": ["humaneval"]}
    )
    given, out = args
    with pytest.raises(ArgumentError) as info:
        run_bench(config if given is None else given, out and tmp_path / out, **kwargs)
    assert message in str(info.value) and not (tmp_path / "out").exists()


def test_an_out_dir_holding_a_nul_byte_is_named(tmp_path) -> None:
    """It was a bare `ValueError: embedded null byte` from mkdir, naming no option."""
    from treegraft.bench.store import OutDirError

    config = bench_config_from_dict(
        {"pairs": [{"target": "zoo:target", "drafter": "zoo:draft"}], "suites": ["humaneval"]}
    )
    out = f"{tmp_path}/o\x00ut"
    with pytest.raises(OutDirError) as info:
        run_bench(config, out, progress=False)
    assert str(info.value) == f"--out {out!r}: a folder name cannot hold a NUL byte"
    assert not any(tmp_path.iterdir())
