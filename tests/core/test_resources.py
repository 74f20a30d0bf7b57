"""`Resources`: tokenizers per model reference, one forward per shared Resources, checked
arguments (models, dtype, device)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

from tests.conftest import greedy_reference, tiny_llama, word_tokenizer
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import Pipeline, load_pipeline
from treegraft.core.resources import Resources
from treegraft.testing import memory_resources

PROMPT = [1, 2, 3, 1, 2, 3, 4]


def spec(target: str, forward: str = "auto") -> dict:
    return {
        "target": target,
        "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"max_new_tokens": 6, "dtype": "float64", "device": "cpu", "forward": forward},
    }


def test_a_folders_tokenizer_serves_that_folder_alone(model_dir: Path) -> None:
    res = memory_resources(target=tiny_llama(seed=1))
    folder = res.load_tokenizer(str(model_dir))
    assert folder is not None and res.load_tokenizer(str(model_dir)) is folder  # loaded once
    assert res.load_tokenizer("mem:target") is None  # not the folder's


def test_an_explicit_tokenizer_serves_models_without_their_own(model_dir: Path) -> None:
    res = memory_resources(target=tiny_llama(seed=1))
    explicit = word_tokenizer(64)
    res.tokenizer = explicit
    assert res.load_tokenizer("mem:target") is explicit
    own = res.load_tokenizer(str(model_dir))
    assert own is not explicit and own.get_vocab() == word_tokenizer(64).get_vocab()
    given = word_tokenizer(64)
    res.add_model("mem:other", tiny_llama(seed=2), tokenizer=given)
    assert res.load_tokenizer("mem:other") is given


def test_a_pipeline_over_a_model_without_a_tokenizer_gets_none_from_shared_resources(
    model_dir: Path,
) -> None:
    res = memory_resources(target=tiny_llama(seed=1, vocab=64))
    assert load_pipeline(spec(str(model_dir)), resources=res).tokenizer is not None
    pipe = load_pipeline(spec("mem:target"), resources=res)
    assert pipe.tokenizer is None
    with pytest.raises(ArgumentError, match=r"this pipeline has no tokenizer"):
        pipe.generate("t1 t2")


def test_a_second_pipeline_with_another_forward_is_refused() -> None:
    target = tiny_llama(seed=1)
    res = memory_resources(target=target)
    first = load_pipeline(spec("mem:target", "lean"), resources=res)
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec("mem:target", "tree"), resources=res)
    assert str(info.value) == (
        "pipeline.decoding.forward: 'tree', but these Resources already serve a pipeline with "
        "'lean' (one decoding.forward per Resources: it sets how the shared models attend); "
        "build this pipeline on a separate Resources"
    )
    with pytest.raises(ArgumentError, match=r"^forward: 'tree', but these Resources already"):
        res.use_forward("tree")  # called directly
    want = greedy_reference(target, PROMPT, 6)
    assert list(first.generate(PROMPT).token_ids) == want  # untouched
    same = load_pipeline(spec("mem:target", "lean"), resources=res)  # the same forward is fine
    assert list(same.generate(PROMPT).token_ids) == want


@pytest.mark.parametrize(
    ("ref", "model", "message"),
    [
        ("mem:t", "str", "add_model: model 'mem:t': expected a transformers PreTrainedModel with "
         "a config (e.g. from AutoModelForCausalLM), got str"),
        ("mem:t", torch.nn.Linear(3, 3), "add_model: model 'mem:t': expected a transformers "
         "PreTrainedModel with a config (e.g. from AutoModelForCausalLM), got Linear"),
        (5, None, "add_model: ref: expected a non-empty string, got 5"),
    ],
    ids=["str", "linear", "ref-int"],
)  # fmt: skip
def test_add_model_refuses_what_is_not_a_model(ref, model, message: str) -> None:
    res = Resources()
    with pytest.raises(ArgumentError) as info:
        res.add_model(ref, model)
    assert str(info.value) == message and not res.models


def test_dtype_and_device_by_name() -> None:
    res = Resources(dtype="float64", device="cpu")
    assert res.dtype == torch.float64 and res.device == torch.device("cpu")
    assert Resources(dtype=torch.bfloat16).dtype == torch.bfloat16
    for bad in ("fp16", torch.int64):
        with pytest.raises(ArgumentError) as info:
            Resources(dtype=bad)
        assert str(info.value) == (
            "Resources: dtype: expected one of float32, float64, bfloat16, float16 (a name or "
            f"the torch dtype), got {bad!r}"
        )
    with pytest.raises(ArgumentError, match=r"^Resources: device: expected 'auto', .* got 'tpu'"):
        Resources(device="tpu")
    with pytest.raises(ArgumentError, match=r"^Resources: device: expected a torch.device or"):
        Resources(device=0)


def test_create_refuses_a_bad_device_or_dtype_as_an_argument_error() -> None:
    with pytest.raises(ArgumentError, match=r"^dtype: expected one of float32, .* got 'fp16'$"):
        Resources.create(dtype="fp16")
    with pytest.raises(ArgumentError, match=r"^device: expected 'auto', .* got 'tpu'$") as info:
        Resources.create(device="tpu")
    assert isinstance(info.value, ValueError)  # callers catching ValueError still do


def test_a_stated_dtype_or_device_must_agree_with_the_resources(monkeypatch) -> None:
    res = memory_resources(target=tiny_llama(seed=1))  # float64 on the CPU
    for decoding, message in [
        ({"dtype": "float32"}, "pipeline.decoding.dtype: the pipeline states 'float32', but the "
         "Resources it is built on hold their models in 'float64' (one dtype per Resources): "
         "give Resources(dtype='float32'), or leave decoding.dtype out to use the Resources' "
         "dtype"),
        ({"device": "cuda:3"}, "pipeline.decoding.device: device 'cuda:3' requested but CUDA "
         "is not available; use 'cpu' or 'auto'")
        if not torch.cuda.is_available() else
        ({"device": "cuda:99"}, "pipeline.decoding.device: device 'cuda:99': this machine has "),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as info:
            load_pipeline({**spec("mem:target", "lean"), "decoding": decoding}, resources=res)
        assert str(info.value).startswith(message)
    built = pipeline_spec_from_dict(spec("mem:target"))  # in code, without a mapping's keys
    built = attrs.evolve(built, decoding=attrs.evolve(built.decoding, dtype="bfloat16"))
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding\.dtype: the pipeline states 'bf"):
        Pipeline.from_spec(attrs.evolve(built, decoding_keys=frozenset()), resources=res)
    # left out, or stated as the resources hold them: the resources' dtype and device
    for decoding in ({}, {"dtype": "float64", "device": "cpu"}):
        pipe = load_pipeline({**spec("mem:target", "lean"), "decoding": decoding}, resources=res)
        assert pipe.decoder.target.model.dtype == torch.float64
    monkeypatch.setattr("treegraft.core.resources.device_problem", lambda name: None)
    res.device = torch.device("cuda", 1)  # where a GPU machine's Resources would hold them
    with pytest.raises(ConfigError) as info:
        load_pipeline({**spec("mem:target"), "decoding": {"device": "cpu"}}, resources=res)
    assert str(info.value) == (
        "pipeline.decoding.device: the pipeline states 'cpu' (cpu), but the Resources it is "
        "built on hold their models on 'cuda:1': give Resources(device='cpu'), or leave "
        "decoding.device out to use the Resources' device"
    )


def test_create_takes_what_the_constructor_takes() -> None:
    res = Resources.create(device=torch.device("cpu", 0), dtype=torch.float64)
    assert res.device == torch.device("cpu") and res.dtype == torch.float64
    with pytest.raises(ArgumentError, match=r"^dtype: expected one of float32, .* got \['f'\]$"):
        Resources.create(dtype=["f"])  # unhashable: not a TypeError
    with pytest.raises(ArgumentError, match=r"^forward: expected one of auto, .* got 'fast'$"):
        Resources.create(forward="fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize(
    ("device", "message"),
    [
        (torch.device("cuda"), "device 'cuda' requested but CUDA is not available"),
        (torch.device("cuda", 1), "device 'cuda:1' requested but CUDA is not available"),
        (torch.device("meta"), "expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got 'meta'"),
    ],
    ids=["cuda", "cuda-1", "meta"],
)
def test_a_torch_device_this_machine_lacks_is_refused(device, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        Resources(device=device)
    assert str(info.value).startswith(f"Resources: device: {message}")


def test_add_model_refuses_a_model_on_the_meta_device() -> None:
    with torch.device("meta"):
        model = tiny_llama(seed=1)
    with pytest.raises(
        ArgumentError, match=r"^add_model: model 'mem:t': its weights are on the meta "
    ):
        Resources().add_model("mem:t", model)  # was torch's NotImplementedError


@pytest.mark.parametrize(
    "given", ["cpu", Resources, {"device": "cpu"}], ids=["str", "class", "dict"]
)
def test_resources_of_another_type_are_an_argument_error(given) -> None:
    with pytest.raises(ArgumentError, match=r"^resources: expected a treegraft Resources \(e\.g\."):
        load_pipeline(spec("mem:target"), resources=given)  # was an AttributeError or TypeError
