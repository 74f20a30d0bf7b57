"""Starting and resuming a sweep (`treegraft.bench.run`): what is refused before anything runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest
import yaml

from tests.bench.conftest import pair_resources, write_suites
from tests.conftest import memory_resources
from treegraft.bench import bench_config_from_dict, run_bench
from treegraft.bench.run import check_device
from treegraft.core.config import ConfigError
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
