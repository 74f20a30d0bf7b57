"""`treegraft validate`'s checks: every error of a file, model folders checked without loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_llama, word_tokenizer
from treegraft.core.model_files import model_folder_problems
from treegraft.core.validation import pipeline_errors

VOCAB = 32


@pytest.fixture(scope="module")
def good_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good-model")
    tiny_llama(seed=5, vocab=VOCAB).save_pretrained(path)
    word_tokenizer(VOCAB).save_pretrained(path)
    return path


@pytest.fixture
def model_copy(tmp_path: Path, good_model: Path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(good_model, path)
    return path


def write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def spec(target: str, **overrides) -> dict:
    return {
        "target": target,
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"device": "cpu"},
        **overrides,
    }


def test_a_good_model_folder_has_no_problems(good_model: Path) -> None:
    assert model_folder_problems(good_model) == []


def test_a_folder_without_weights(model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    (problem,) = model_folder_problems(model_copy)
    assert problem.startswith("no weights file: expected model.safetensors")


def test_a_truncated_safetensors_file(model_copy: Path) -> None:
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    problems = model_folder_problems(model_copy)
    assert problems and "the file is truncated" in problems[0]


def test_a_corrupt_header(model_copy: Path) -> None:
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:12] = b"\xff\xfe{["
    weights.write_bytes(bytes(data))
    assert "not valid JSON" in model_folder_problems(model_copy)[0]


def test_a_garbage_file(model_copy: Path) -> None:
    (model_copy / "model.safetensors").write_bytes(b"<html>not found</html>")
    assert "exceeds the file" in model_folder_problems(model_copy)[0]


def test_a_config_of_another_model(model_copy: Path) -> None:
    config = json.loads((model_copy / "config.json").read_text())
    config.update(vocab_size=VOCAB * 2, num_hidden_layers=5)
    (model_copy / "config.json").write_text(json.dumps(config))
    problems = model_folder_problems(model_copy)
    assert any(f"rows but config.json says vocab_size {VOCAB * 2}" in p for p in problems)
    assert any(
        "the weights hold 2 layers but config.json says num_hidden_layers 5" in p for p in problems
    )


def test_every_error_of_a_file_is_reported_with_its_name(tmp_path: Path, good_model: Path) -> None:
    data = spec(
        str(good_model),
        builder={"name": "layered", "depth": 0, "top_k": "two", "budget": 10**20, "bugdet": 3},
        decoding={"device": "gpu", "stop": [""], "max_new_tokens": -1},
        verifer={"name": "greedy"},
    )
    path = write(tmp_path, "bad.yaml", data)
    spec_out, errors = pipeline_errors(path)
    assert spec_out is None
    assert all(e.startswith(f"{path}: ") for e in errors)
    text = "\n".join(errors)
    for needle in (
        "pipeline.verifer: unknown key; did you mean 'verifier'?",
        "pipeline.builder.bugdet: unknown key",
        "pipeline.builder.depth: expected int >= 1, got 0",
        "pipeline.builder.top_k: expected int >= 1, got 'two'",
        "pipeline.builder.budget: expected int >= 1, got 100000000000000000000",
        "pipeline.decoding.device: expected str 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got 'gpu'",
        "pipeline.decoding.stop: expected list of str each non-empty",
        "pipeline.decoding.max_new_tokens: expected int >= 1, got -1",
    ):
        assert needle in text, text
    assert len(errors) == 8


def test_model_and_device_errors_need_no_weights_loaded(tmp_path: Path, model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    data = spec(str(model_copy), decoding={"device": "cuda:7"})
    data["drafters"]["strong"] = {"name": "hf_lm", "model": str(tmp_path / "absent")}
    _, errors = pipeline_errors(write(tmp_path, "models.yaml", data))
    text = "\n".join(errors)
    assert "pipeline.target: " in text and "no weights file" in text
    assert "pipeline.drafters.strong.model: model" in text and "not found" in text
    import torch

    if torch.cuda.device_count() < 8:
        assert "pipeline.decoding.device: device 'cuda:7'" in text


def test_placement_errors_are_reported(tmp_path: Path, good_model: Path) -> None:
    (tmp_path / "file").write_text("")
    placed = {str(good_model): {"model": 9, "lm_head": "cpu"}}
    decoding = {"device_map": placed, "offload_folder": str(tmp_path / "file" / "off")}
    _, errors = pipeline_errors(
        write(tmp_path, "placed.yaml", spec(str(good_model), decoding=decoding))
    )
    text = "\n".join(errors)
    assert f"pipeline.decoding.offload_folder: {str(tmp_path / 'file' / 'off')!r}: " in text
    import torch

    if torch.cuda.device_count() < 10:
        assert (
            f"pipeline.decoding.device_map: {str(good_model)!r}: 'model': device 'cuda:9'" in text
        )


def test_a_good_file_validates(tmp_path: Path, good_model: Path) -> None:
    spec_out, errors = pipeline_errors(write(tmp_path, "ok.yaml", spec(str(good_model))))
    assert errors == [] and spec_out is not None


def _lm(model: Path, **extra) -> dict:
    return {"weak": {"name": "ngram"}, "strong": {"name": "hf_lm", "model": str(model), **extra}}


BROKEN = {  # what building the pipeline refuses before any weights load
    "layers-past-depth": {"scheduler": {"name": "layers", "layers": [7]}},
    "plan-drafter": {"scheduler": {"name": "plan", "plan": [0, 4]}},
    "budgeted-drafter": {"scheduler": {"name": "budgeted", "drafter": 3}},
    "silent-drafter": {
        "drafters": "lm",
        "builder": {"name": "layered", "depth": 3, "silent_chain": 4, "silent_drafter": 5},
    },
    "artifact": {"scheduler": {"name": "distilled", "artifact": "/nonexistent/sched"}},
    "plans": {"scheduler": {"name": "oracle", "plans": "/nonexistent/plans.json"}},
    "store": {"drafters": {"weak": {"name": "ngram", "store": "/nonexistent/store.npz"}}},
    "eagle-head": {
        "drafters": {"weak": {"name": "ngram"}, "e": {"name": "eagle", "head": "/nonexistent"}}
    },
    "token-counts": {"drafters": ("lm", {"head": 8, "token_counts": "/nonexistent.json"})},
    "head-past-vocab": {"drafters": ("lm", {"head": 100000})},
    "tokenizer": {"tokenizer": "/nonexistent/tok"},
    "chat": {"decoding": {"device": "cpu", "chat": True}},
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_validate_reports_what_building_the_pipeline_refuses(
    tmp_path: Path, good_model: Path, case: str
) -> None:
    """`validate` and `load_pipeline` agree: the same error, in the same words."""
    from treegraft import load_pipeline
    from treegraft.core.errors import TreegraftError

    overrides = dict(BROKEN[case])
    drafters = overrides.get("drafters")
    if drafters == "lm" or isinstance(drafters, tuple):
        overrides["drafters"] = _lm(good_model, **(drafters[1] if drafters != "lm" else {}))
    data = spec(str(good_model), **overrides)
    path = write(tmp_path, "broken.yaml", data)
    _, errors = pipeline_errors(path)
    with pytest.raises(TreegraftError) as info:
        load_pipeline(data)
    assert errors == [f"{path}: {info.value}"]
