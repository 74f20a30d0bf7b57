"""Starting and resuming a sweep (`treegraft.bench.run`): what is refused before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs
import pytest

from tests.bench.conftest import write_suites
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
