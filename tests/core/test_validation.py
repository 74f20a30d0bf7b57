"""`treegraft validate`'s checks: every error of a file, model folders checked without loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import tiny_llama, word_tokenizer
from treegraft.conformance.tiny import tiny_model
from treegraft.core.errors import TreegraftError
from treegraft.core.model_files import model_folder_problems
from treegraft.core.pipeline import load_pipeline
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


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))


def _reshape(folder: Path, name: str, shape: tuple[int, ...]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors[name] = torch.zeros(shape, dtype=tensors[name].dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _agree(
    tmp_path: Path, folder: Path, drafter: dict | None = None
) -> tuple[list[str], Exception | None]:
    """`validate`'s errors and what `load_pipeline` raises (None: it loads) for one folder
    (with `drafter` as a second drafter, where given)."""
    data = spec(str(folder))
    if drafter is not None:
        data["drafters"]["strong"] = drafter
    _, errors = pipeline_errors(write(tmp_path, "p.yaml", data))
    try:
        load_pipeline(data)
    except TreegraftError as exc:
        return errors, exc
    return errors, None


def test_a_field_config_json_leaves_out_is_checked_at_its_default(model_copy: Path) -> None:
    """Without `hidden_size`, transformers builds the class default (4096 for Llama): the
    weights do not fit it, and validate says so as loading does."""
    _edit_config(model_copy, hidden_size=None)
    problems = model_folder_problems(model_copy)
    assert any(
        "has 32 columns but the config's hidden_size is 4096 (its default" in p for p in problems
    ), problems


def test_a_tensor_of_another_shape_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path
) -> None:
    _reshape(model_copy, "model.layers.0.mlp.up_proj.weight", (60, 32))
    errors, raised = _agree(tmp_path, model_copy)
    needle = "model.layers.0.mlp.up_proj.weight has shape [60, 32] in the weights but [64, 32]"
    assert len(errors) == 1 and needle in errors[0]
    assert raised is not None and needle in str(raised) and "above report" not in str(raised)


def test_a_config_leaving_vocab_size_to_its_default_loads(tmp_path: Path) -> None:
    """config.json without `vocab_size` describes the class default (32000 for Llama): weights
    of that size load, by validate and by the pipeline."""
    folder = tmp_path / "model"
    tiny_llama(seed=5, vocab=32000, hidden=16, layers=1, heads=2, kv_heads=1).save_pretrained(
        folder
    )
    _edit_config(folder, vocab_size=None)
    assert _agree(tmp_path, folder) == ([], None)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model_type": None}, "config.json states no model_type"),
        ({"model_type": "nosuch"}, "model_type 'nosuch', which this transformers version"),
        (
            {"model_type": "custom", "auto_map": {"AutoConfig": "c.CustomConfig"}},
            "treegraft never runs a checkpoint's code",
        ),
        ({"model_type": "t5"}, "holds a 't5' model, which transformers does not load"),
        ({"vocab_size": "32"}, "Field 'vocab_size' expected int, got str"),
        ({"rope_parameters": 5}, "config.json: Validation error for field 'rope_parameters'"),
        ({"quantization_config": "yes"}, "quantization_config: expected an object naming"),
        ({"quantization_config": {"bits": 4}}, "got an object without one: {'bits': 4}"),
        ({"dtype": "bf16"}, "config.json: dtype: expected a torch dtype name (e.g. 'bfloat16'"),
        (
            {"dtype": None, "torch_dtype": "fp32"},
            "config.json: torch_dtype: expected a torch dtype name (e.g. 'bfloat16'",
        ),
        (
            {"rope_scaling": {"rope_type": "ntk", "factor": 2.0}},
            "rope_type 'ntk' is not one transformers knows; expected one of 'default', 'linear'",
        ),
    ],
    ids=[
        "no-type",
        "unknown-type",
        "remote-code",
        "not-causal",
        "vocab-str",
        "rope",
        "quant",
        "quant-",
        "dtype",
        "torch-dtype",
        "rope-type",
    ],
)
@pytest.mark.parametrize("lm_drafter", [False, True], ids=["ngram", "lm-drafter"])
def test_a_config_transformers_cannot_build_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path, changes: dict, needle: str, lm_drafter: bool
) -> None:
    """With an LM drafter the folders' tokenizers are compared first: a config.json they cannot
    be read past is named as such, not as tokenizer files that do not load."""
    (model_copy / "c.py").write_text("raise SystemExit('the folder code ran')\n")
    _edit_config(model_copy, **changes)
    drafter = {"name": "hf_lm", "model": str(model_copy)} if lm_drafter else None
    errors, raised = _agree(tmp_path, model_copy, drafter)
    assert len(errors) == 1 + lm_drafter and all(needle in e for e in errors), errors
    assert raised is not None and needle in str(raised)


@pytest.mark.parametrize("model_type", ["electra", "dory", "mixtral"])
def test_checkpoints_whose_embeddings_or_layers_read_otherwise_validate(
    tmp_path: Path, model_type: str
) -> None:
    """Electra embeds in `embedding_size` columns, not `hidden_size`; Dory numbers its layers
    its own way; Mixtral saves its experts one by one, fused at load: their own checkpoints have
    no problem."""
    tiny_model(model_type, seed=0).save_pretrained(tmp_path)
    assert model_folder_problems(tmp_path) == []


def test_weights_with_layers_past_the_config_load_exactly_and_validate(
    tmp_path: Path, model_copy: Path
) -> None:
    """transformers builds the layers config.json names and ignores the rest (as DeepSeek's
    multi-token-prediction layer): both validate and load accept it."""
    _edit_config(model_copy, num_hidden_layers=1)
    errors, raised = _agree(tmp_path, model_copy)
    assert errors == [] and raised is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{bad", "generation_config.json is not valid JSON"),
        ("[]", "generation_config.json is not a JSON object (got list)"),
        ('{"eos_token_id": "x"}', "eos_token_id: expected a token id or a list of token ids"),
    ],
    ids=["not-json", "list", "eos-str"],
)
def test_a_broken_generation_config_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path, text: str, needle: str
) -> None:
    """transformers skips a generation_config.json that does not parse (its EOS ids with it) or
    fails on one that is a list: both are an error naming the file."""
    (model_copy / "generation_config.json").write_text(text)
    errors, raised = _agree(tmp_path, model_copy)
    assert len(errors) == 1 and needle in errors[0], errors
    assert raised is not None and needle in str(raised)


def test_an_index_naming_a_tensor_its_shard_lacks_fails_load_as_validate(
    tmp_path: Path, model_copy: Path
) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_copy / "model.safetensors")
    (model_copy / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, model_copy / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    weight_map["model.extra.weight"] = "model-00001-of-00002.safetensors"
    (model_copy / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    errors, raised = _agree(tmp_path, model_copy)
    assert (
        len(errors) == 1 and "1 tensors not in their shards, e.g. 'model.extra.weight'" in errors[0]
    )
    assert raised is not None and "1 tensors not in their shards" in str(raised)


@pytest.mark.parametrize(
    ("index", "needle"),
    [
        ({"weight_map": {"a": "model.safetensors"}}, "no 'metadata' mapping, which transformers"),
        ({"metadata": {}, "weight_map": ["a"]}, "'weight_map' is not a mapping of tensor names"),
        ({"metadata": {}, "weight_map": {"a": "../x.safetensors"}}, "is not a file name inside"),
    ],
    ids=["no-metadata", "list-map", "outside"],
)
def test_a_malformed_shard_index_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path, index: dict, needle: str
) -> None:
    (model_copy / "model.safetensors").rename(model_copy / "shard.safetensors")
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    errors, raised = _agree(tmp_path, model_copy)
    assert len(errors) == 1 and needle in errors[0], errors
    assert raised is not None and needle in str(raised)


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
        "pipeline.builder.budget: expected int >= 1 and <= 8192, got 100000000000000000000",
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


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_an_architecture_refused_at_build_is_refused_by_validate_alike(
    tmp_path: Path, good_model: Path, role: str
) -> None:
    """A refused architecture (XLM, bidirectional; Bloom was, until its ALiBi biases were handed
    a tree's positions) as the target or an LM drafter passed `validate` and was refused only
    by `load_pipeline`; validate now judges the architecture rules from a meta-device skeleton
    of its config and says what the build says."""
    refused = tmp_path / "xlm"
    tiny_model("xlm", seed=0, vocab_size=VOCAB).save_pretrained(refused)
    word_tokenizer(VOCAB).save_pretrained(refused)
    data = spec(str(refused) if role == "target" else str(good_model))
    if role == "drafter":
        data["drafters"]["strong"] = {"name": "hf_lm", "model": str(refused)}
        data["scheduler"] = "always"
    path = write(tmp_path, "p.yaml", data)
    _, errors = pipeline_errors(path)
    with pytest.raises(TreegraftError) as info:
        load_pipeline(data)
    assert [e.removeprefix(f"{path}: ") for e in errors] == [str(info.value)]
    field = "pipeline.target" if role == "target" else "pipeline.drafters.strong.model"
    assert str(info.value).startswith(
        f"{field}: model {str(refused)!r} (XLMWithLMHeadModel) cannot"
    )


@pytest.mark.parametrize(
    ("model_type", "extra"), [("bloom", {}), ("mpt", {}), ("falcon", {"alibi": True})]
)
def test_an_alibi_checkpoint_validates_and_builds(
    tmp_path: Path, model_type: str, extra: dict
) -> None:
    """ALiBi models (Bloom, MPT, Falcon with `alibi: true`) were refused by `validate` and
    the build; their biases now take a tree's positions: both accept the checkpoint (validate
    judging a meta-device skeleton, whose bias builders it finds as the build does)."""
    folder = tmp_path / model_type
    tiny_model(model_type, seed=0, vocab_size=VOCAB, **extra).save_pretrained(folder)
    word_tokenizer(VOCAB).save_pretrained(folder)
    path = write(tmp_path, "p.yaml", spec(str(folder)))
    assert pipeline_errors(path)[1] == []
    assert load_pipeline(spec(str(folder))).generate(torch.tensor([3, 4, 5])).token_ids


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


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_a_damaged_folder_reads_the_same_in_validate_and_load(
    tmp_path: Path, good_model: Path, model_copy: Path, role: str
) -> None:
    """The same words, at the same field (`pipeline.target`, a drafter's `.model`)."""
    (model_copy / "generation_config.json").write_text("[]")
    if role == "target":
        data = spec(str(model_copy))
    else:
        data = spec(str(good_model), drafters=_lm(model_copy))
    path = write(tmp_path, "damaged.yaml", data)
    _, errors = pipeline_errors(path)
    with pytest.raises(TreegraftError) as info:
        load_pipeline(data)
    field = "pipeline.target" if role == "target" else "pipeline.drafters.strong.model"
    assert str(info.value).startswith(f"{field}: {model_copy}: ")
    assert errors == [f"{path}: {info.value}"]


def test_a_quantized_checkpoint_is_not_held_to_the_unquantized_shapes(model_copy: Path) -> None:
    """A bitsandbytes 4-bit checkpoint packs `weight` tensors under their own names: their
    shapes are the quantizer's business (transformers reads them at load), not a mismatch."""
    _reshape(model_copy, "model.layers.0.mlp.up_proj.weight", (1024, 1))
    _edit_config(model_copy, quantization_config={"quant_method": "bitsandbytes"})
    assert model_folder_problems(model_copy) == []


def _to_pickled(folder: Path) -> Path:
    from safetensors.torch import load_file

    weights = folder / "pytorch_model.bin"
    torch.save(load_file(folder / "model.safetensors"), weights)
    (folder / "model.safetensors").unlink()
    return weights


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda data: data[: len(data) // 2], "zip directory does not read; the file is truncated"),
        (lambda data: b"", "pytorch_model.bin is empty (0 bytes)"),
        (lambda data: b"<html>404</html>", "not a PyTorch checkpoint (it starts with b'<htm')"),
    ],
    ids=["truncated", "empty", "html"],
)
def test_a_damaged_pickled_checkpoint_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path, damage, needle: str
) -> None:
    weights = _to_pickled(model_copy)
    weights.write_bytes(damage(weights.read_bytes()))
    errors, raised = _agree(tmp_path, model_copy)
    assert len(errors) == 1 and needle in errors[0], errors
    assert raised is not None and needle in str(raised)


def test_a_sharded_pickled_checkpoint_with_a_missing_shard(
    tmp_path: Path, model_copy: Path
) -> None:
    weights = _to_pickled(model_copy)
    weights.rename(model_copy / "pytorch_model-00001-of-00002.bin")
    tensors = torch.load(model_copy / "pytorch_model-00001-of-00002.bin")
    weight_map = dict.fromkeys(tensors, "pytorch_model-00001-of-00002.bin")
    weight_map["lm_head.weight"] = "pytorch_model-00002-of-00002.bin"
    index = {"metadata": {}, "weight_map": weight_map}
    (model_copy / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    errors, raised = _agree(tmp_path, model_copy)
    assert len(errors) == 1 and "pytorch_model-00002-of-00002.bin is missing" in errors[0]
    assert raised is not None and "pytorch_model-00002-of-00002.bin is missing" in str(raised)


def test_a_pickled_checkpoint_loads_exactly(tmp_path: Path, model_copy: Path) -> None:
    _to_pickled(model_copy)
    assert _agree(tmp_path, model_copy) == ([], None)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_broken_symbolic_link_is_named_as_one(
    tmp_path: Path, model_copy: Path, name: str
) -> None:
    """A Hugging Face cache snapshot links its files to blobs; a deleted blob leaves a link to
    nothing, which is not 'no weights file' nor 'no config.json'."""
    (model_copy / name).unlink()
    (model_copy / name).symlink_to(tmp_path / "blobs" / "deadbeef")
    errors, raised = _agree(tmp_path, model_copy)
    needle = f"{name} in {model_copy} is a broken symbolic link (to {tmp_path / 'blobs'}"
    assert len(errors) == 1 and needle in errors[0], errors
    assert raised is not None and needle in str(raised)


def test_a_pickled_checkpoint_holding_other_objects_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path
) -> None:
    """torch unpickles tensors only (weights_only): an object of another class in the pickle
    fails loading after pages of advice; validate reads the pickle's opcodes and names it."""
    import datetime

    weights = _to_pickled(model_copy)
    tensors = torch.load(weights)
    torch.save({**tensors, "saved_at": datetime.datetime(2020, 1, 1)}, weights)
    errors, raised = _agree(tmp_path, model_copy)
    needle = "pytorch_model.bin holds Python objects other than tensors (datetime.datetime)"
    assert len(errors) == 1 and needle in errors[0], errors
    assert raised is not None and needle in str(raised)


@pytest.mark.parametrize("saved", ["LlamaModel", "LlamaForSequenceClassification"])
def test_a_checkpoint_without_the_lm_head_fails_validate_and_load_alike(
    tmp_path: Path, model_copy: Path, saved: str
) -> None:
    """A base model's checkpoint (its names lack the `model.` prefix loading adds) or a
    classifier's (a `score` head) holds no `lm_head`: transformers would make one at random."""
    import transformers

    config = tiny_llama(seed=5, vocab=VOCAB).config
    (model_copy / "model.safetensors").unlink()
    getattr(transformers, saved)(config).save_pretrained(model_copy)
    _edit_config(model_copy, architectures=["LlamaForCausalLM"])
    errors, raised = _agree(tmp_path, model_copy)
    needle = "lacks 1 weight(s) of LlamaForCausalLM (e.g. lm_head.weight)"
    assert len(errors) == 1 and needle in errors[0], errors
    assert raised is not None and needle in str(raised)


LONG = list(range(500))
GOOD = {"target": "zoo:target", "drafters": {"weak": "ngram"}, "builder": "layered"}
ONE_ERROR = {
    "not a mapping": LONG,
    "missing target": {k: v for k, v in GOOD.items() if k != "target"},
    "target a list": {**GOOD, "target": LONG},
    "drafters a string": {**GOOD, "drafters": "x" * 500},
    "drafter a list": {**GOOD, "drafters": {"weak": LONG}},
    "component a list": {**GOOD, "builder": LONG},
    "name a list": {**GOOD, "builder": {"name": LONG}},
    "int role": {**GOOD, "drafters": {1: "ngram"}},
    "null role": {**GOOD, "drafters": {None: "ngram"}},
    "empty role": {**GOOD, "drafters": {"": "ngram"}},
    "tokenizer a list": {**GOOD, "tokenizer": ["a"]},
    "tokenizer empty": {**GOOD, "tokenizer": ""},
}


@pytest.mark.parametrize("data", ONE_ERROR.values(), ids=ONE_ERROR.keys())
def test_validate_lists_exactly_the_error_load_raises(data: object) -> None:
    """Each malformed mapping has one error, which `treegraft validate`'s pass over every key
    words as loading does: values shortened alike (they were printed whole), a missing target
    once (it was also `got ''`), roles and the tokenizer checked there too (a bad tokenizer
    showed only once every other key was sound)."""
    from treegraft.core.config import ConfigError, pipeline_spec_from_dict
    from treegraft.core.registry import default_registry
    from treegraft.core.validation import structure_errors

    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(data)
    assert structure_errors(data, default_registry()) == [str(info.value)]
    assert len(str(info.value)) < 400


def test_pipeline_errors_names_arguments_of_another_type() -> None:
    """`pipeline_errors('x.yaml', 'x')` was a raw AttributeError; `pipeline_errors(5)` a
    TypeError."""
    from treegraft.core.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"^pipeline_errors: registry: expected a Registry"):
        pipeline_errors(Path("x.yaml"), "x")  # type: ignore[arg-type]
    with pytest.raises(
        ArgumentError, match=r"^pipeline_errors: path: expected a file path, got int"
    ):
        pipeline_errors(5)  # type: ignore[arg-type]


def test_validate_names_a_sweep_file_as_such_once(tmp_path: Path) -> None:
    """`treegraft validate sweep.yaml` listed its keys as unknown and the pipeline's as missing."""
    data = {"pairs": [{"target": "zoo:target", "drafter": "zoo:draft-s"}], "suites": ["qa"]}
    _, errors = pipeline_errors(write(tmp_path, "sweep.yaml", data))
    notes = [e for e in errors if "this looks like a benchmark sweep file" in e]
    assert len(notes) == 1 and "pipeline.pairs: unknown key" in notes[0]
    assert notes[0].endswith("run it with `treegraft bench run FILE`")


@pytest.mark.parametrize("forward", ["lean", "lean-fast", "tree"])
def test_a_state_target_s_forward_fails_validate_and_load_alike(tmp_path: Path, forward) -> None:
    """A hybrid target (Qwen3-Next) runs only its own forward: `decoding.forward` lean,
    lean-fast or tree refuses it at load, and `treegraft validate` passed the file; both name
    the setting now. `auto` validates."""
    from treegraft.conformance.tiny import VOCAB as TINY_VOCAB

    folder = tmp_path / "hybrid"
    tiny_model("qwen3_next", seed=0, dtype=torch.float32).save_pretrained(folder)
    word_tokenizer(TINY_VOCAB).save_pretrained(folder)
    bad = spec(str(folder), decoding={"device": "cpu", "forward": forward})
    _, errors = pipeline_errors(write(tmp_path, "p.yaml", bad))
    assert len(errors) == 1 and "decoding.forward: Qwen3NextForCausalLM keeps" in errors[0]
    with pytest.raises(TreegraftError) as raised:
        load_pipeline(bad)
    assert errors[0].split("decoding.forward: ")[1] in str(raised.value), (errors, raised.value)
    assert pipeline_errors(write(tmp_path, "ok.yaml", spec(str(folder))))[1] == []


@pytest.mark.parametrize("forward", ["lean", "lean-fast", "tree"])
def test_a_chain_attention_target_s_forward_fails_validate_and_load_alike(
    tmp_path: Path, forward
) -> None:
    """OpenAI GPT, verified one chain per step through its own forward (`SequenceRunner`), runs
    only that forward: `validate` and the build refuse the others alike, naming why it verifies
    chains (not a recurrent state). `auto` validates."""
    from treegraft.conformance.tiny import VOCAB as TINY_VOCAB

    folder = tmp_path / "gpt"
    tiny_model("openai-gpt", seed=0, dtype=torch.float32).save_pretrained(folder)
    word_tokenizer(TINY_VOCAB).save_pretrained(folder)
    bad = spec(str(folder), decoding={"device": "cpu", "forward": forward})
    _, errors = pipeline_errors(write(tmp_path, "p.yaml", bad))
    words = "decoding.forward: OpenAIGPTLMHeadModel takes no draft tree's attention mask"
    assert len(errors) == 1 and words in errors[0]
    with pytest.raises(TreegraftError) as raised:
        load_pipeline(bad)
    assert errors[0].split("decoding.forward: ")[1] in str(raised.value), (errors, raised.value)
    for message in (errors[0], str(raised.value)):  # the remedy: another forward, not model
        assert "Set decoding.forward (`--forward`) to auto" in message, message
        assert "decode it with plain `generate`" not in message, message
    assert pipeline_errors(write(tmp_path, "ok.yaml", spec(str(folder))))[1] == []
