"""Models split across devices (device maps through accelerate) decode exactly as plain decoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import greedy_reference, tiny_llama, word_tokenizer
from tests.core.test_decoder import repetitive_prompt
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner.placement import input_device, is_device_map, layer_devices, load_kwargs

pytest.importorskip("accelerate")

VOCAB = 40
#: The target's layers split between memory and disk, its head offloaded to disk too.
TARGET_MAP = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.norm": "cpu",
    "lm_head": "disk",
}


def pipeline(target: Path, drafter: Path, offload: Path, device_map: dict) -> dict:
    """TreeGraft with an n-gram and an LM drafter, greedy, float64, the given device maps."""
    return {
        "target": str(target),
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 4, "chain_len": 3},
            "strong": {"name": "hf_lm", "model": str(drafter)},
        },
        "builder": {"name": "layered", "depth": 4, "top_k": 3, "budget": 12},
        "rescorer": {"name": "overwrite"},
        "grafter": {"name": "reselect", "lookback": 2},
        "scheduler": {"name": "every_k", "k": 2},
        "verifier": {"name": "greedy"},
        "decoding": {
            "max_new_tokens": 24,
            "dtype": "float64",
            "device": "cpu",
            "device_map": device_map,
            "offload_folder": str(offload),
        },
    }


def test_a_target_split_over_cpu_and_disk_decodes_exactly_as_plain_decoding(tmp_path):
    target = tiny_llama(seed=3, vocab=VOCAB, layers=3)
    drafter = tiny_llama(seed=4, vocab=VOCAB, hidden=16, layers=2, heads=2, kv_heads=1)
    target.save_pretrained(tmp_path / "target")
    word_tokenizer(VOCAB).save_pretrained(tmp_path / "target")
    drafter.save_pretrained(tmp_path / "drafter")
    maps = {
        str(tmp_path / "target"): TARGET_MAP,
        str(tmp_path / "drafter"): {"model": "cpu", "lm_head": "disk"},
    }
    pipe = load_pipeline(
        pipeline(tmp_path / "target", tmp_path / "drafter", tmp_path / "off", maps)
    )
    runner = pipe.decoder.target
    assert runner.model.hf_device_map["model.layers.1"] == "disk"
    assert runner.model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert not runner.lean  # accelerate's hooks run the transformers forward
    assert input_device(runner.model) == torch.device("cpu")
    assert layer_devices(runner.model) == [torch.device("cpu")] * 3
    for seed in (0, 1):
        prompt = repetitive_prompt(seed, 20) % VOCAB
        out = pipe.generate(prompt)
        assert list(out.token_ids) == greedy_reference(target, prompt, 24)


def test_device_maps_are_checked_with_their_path():
    assert is_device_map("balanced") and is_device_map({"model": 0, "lm_head": "cuda:1"})
    assert not is_device_map({"model": "moon"}) and not is_device_map({})
    with pytest.raises(
        ConfigError, match=r"pipeline\.decoding\.device_map: expected mapping model references to"
    ):
        pipeline_spec_from_dict(
            pipeline(Path("t"), Path("d"), Path("o"), {"zoo:target": {"model": "moon"}})
        )
    assert load_kwargs({"model": "disk"}, None)["offload_folder"]  # a temporary folder
    assert load_kwargs({"model": "cpu"}, None) == {"device_map": {"model": "cpu"}}
    home = str(Path("~/off").expanduser())
    assert load_kwargs({"model": "disk"}, "~/off")["offload_folder"] == home  # not a "~" folder
    assert not is_device_map("disk")  # from_pretrained offloads modules, not a whole model


def saved_pair(tmp_path: Path) -> tuple[Path, Path]:
    for name, seed in (("target", 3), ("drafter", 4)):
        tiny_llama(seed=seed, vocab=VOCAB, layers=2).save_pretrained(tmp_path / name)
    return tmp_path / "target", tmp_path / "drafter"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize(
    ("device_map", "message"),
    [
        ({"model": 1, "lm_head": "cpu"}, "'model': device 'cuda:1' requested but CUDA is not "
         "available; use 'cpu' or 'auto'"),
        ("cuda:7", "device 'cuda:7' requested but CUDA is not available; use 'cpu' or 'auto'"),
        ({"model": "xpu", "lm_head": "cpu"}, "'model': device 'xpu' requested but XPU is not "
         "available"),
    ],
    ids=["index", "whole", "xpu"],
)  # fmt: skip
def test_a_placement_on_a_device_this_machine_lacks_is_refused_before_loading(
    tmp_path: Path, device_map, message: str
) -> None:
    target, drafter = saved_pair(tmp_path)
    spec = pipeline(target, drafter, tmp_path / "off", {str(target): device_map})
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec)
    assert str(info.value) == f"pipeline.decoding.device_map: {str(target)!r}: {message}"


def test_a_device_map_key_naming_no_module_is_refused(tmp_path: Path) -> None:
    target, drafter = saved_pair(tmp_path)
    maps = {str(target): {"model": "cpu", "lm_head": "cpu", "model.layer.1": "disk"}}  # layers
    with pytest.raises(ConfigError) as info:
        load_pipeline(pipeline(target, drafter, tmp_path / "off", maps))
    assert str(info.value).startswith(
        f"pipeline.target: {target}: device_map: 'model.layer.1' names no module or parameter of "
        "LlamaForCausalLM (its modules: model, model.embed_tokens, model.layers, model.norm, "
    )


def test_an_offload_folder_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    target, drafter = saved_pair(tmp_path)
    (tmp_path / "file").write_text("")
    maps = {str(target): {"model": "cpu", "lm_head": "disk"}}
    with pytest.raises(ConfigError) as info:
        load_pipeline(pipeline(target, drafter, tmp_path / "file" / "off", maps))
    assert str(info.value) == (
        f"pipeline.decoding.offload_folder: {str(tmp_path / 'file' / 'off')!r}: "
        f"{str(tmp_path / 'file')!r} is a file, not a folder"
    )


def test_a_device_map_for_a_model_already_held_is_refused(tmp_path: Path) -> None:
    target, drafter = saved_pair(tmp_path)
    plain = pipeline(target, drafter, tmp_path / "off", {})
    res = Resources(dtype="float64", device="cpu")
    load_pipeline(plain, resources=res)
    placed = {str(target): {"model": "cpu", "lm_head": "disk"}}
    refused = pipeline(target, drafter, tmp_path / "off", placed)
    refused["decoding"]["check_model"] = False
    with pytest.raises(ConfigError) as info:  # the target is loaded unplaced: no map can apply
        load_pipeline(refused, resources=res)
    assert res.check_model  # a refused pipeline changes nothing of the shared Resources
    assert str(info.value) == (
        f"pipeline.decoding.device_map: {str(target)!r}: a device map applies when a model "
        "loads, and this one was loaded by an earlier pipeline on these Resources under another "
        "placement: give its map to the first pipeline, or use a separate Resources"
    )
    res = Resources(dtype="float64", device="cpu")
    first = load_pipeline(pipeline(target, drafter, tmp_path / "off", placed), resources=res)
    again = load_pipeline(pipeline(target, drafter, tmp_path / "off", placed), resources=res)
    assert again.decoder.target.model is first.decoder.target.model  # the same placement: shared
    other = {str(target): {"model": "cpu", "lm_head": "cpu"}}
    fresh = Resources(dtype="float64", device="cpu")
    fresh.place(placed, None)  # as a benchmark pair does before its pipelines load
    with pytest.raises(ConfigError, match=r"these Resources place it as \{'model': 'cpu', 'lm_"):
        load_pipeline(pipeline(target, drafter, tmp_path / "off", other), resources=fresh)
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding\.offload_folder: '.*other', but"):
        load_pipeline(pipeline(target, drafter, tmp_path / "other", placed), resources=res)
    res.add_model("mem:target", tiny_llama(seed=3, vocab=VOCAB, layers=2))
    in_memory = {**plain, "target": "mem:target", "drafters": {"weak": {"name": "ngram"}}}
    in_memory["decoding"] = {**plain["decoding"], "device_map": {"mem:target": "cpu"}}
    with pytest.raises(ConfigError, match=r"this one was added in memory \(add_model\): save it"):
        load_pipeline(in_memory, resources=res)


def test_map_keys_may_name_tied_parameters_and_buffers() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from treegraft.core.runner.placement import unknown_modules

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    named = {"lm_head.weight": "cpu", "model.rotary_emb.inv_freq": "cpu", "model": "cpu"}
    assert unknown_modules(model, named) == []  # the head's weight is the embeddings'
    assert unknown_modules(model, {"model.layer.0": "disk"}) == ["model.layer.0"]


def test_tied_embeddings_split_across_disk_are_refused_before_loading(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    tied, drafter = tmp_path / "tied", saved_pair(tmp_path)[1]
    maps = {str(tied): {"model": "cpu", "lm_head": "disk"}}
    with pytest.raises(ConfigError) as info:  # was a KeyError from the tree forward's probe
        load_pipeline(pipeline(tied, drafter, tmp_path / "off", maps))
    assert str(info.value) == (
        f"pipeline.target: {tied}: device_map: 'lm_head' shares its weight with "
        "'model.embed_tokens' (tied embeddings), but goes to 'disk' and 'model.embed_tokens' to "
        "'cpu': place both alike"
    )
