"""`Pipeline`'s Python API: lists of prompts, hub ids, the `tokenizer:` key and chat templates."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import greedy_reference, hf_generate, word_tokenizer
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.pipeline import (
    Generation,
    Pipeline,
    is_prompt_list,
    load_pipeline,
    resolve_pipeline,
)

VOCAB = 64
CHAT = "{% for m in messages %}t60 {{ m['content'] }} t61{% endfor %}{% if add_generation_prompt %} t62{% endif %}"


@pytest.fixture(scope="module")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chat-tokenizer")
    tokenizer = word_tokenizer(VOCAB)
    tokenizer.chat_template = CHAT
    tokenizer.save_pretrained(path)
    return path


def spec(target: str, **extra) -> dict:
    return {
        "target": target,
        "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"max_new_tokens": 6, "dtype": "float64", "device": "cpu"},
        **extra,
    }


def test_a_list_of_prompts_gives_a_list_of_generations_each_as_alone(model_dir: Path):
    pipe = load_pipeline(spec(str(model_dir)))
    prompts = ["t1 t2 t3 t1 t2", "t7 t8 t9", "t4"]
    results = pipe.generate(prompts)
    assert isinstance(results, list) and len(results) == 3
    assert all(isinstance(r, Generation) for r in results)
    for prompt, result in zip(prompts, results, strict=True):
        alone = pipe.generate(prompt)
        assert result.token_ids == alone.token_ids
        ids = pipe.encode(prompt)
        assert list(result.token_ids) == greedy_reference(pipe.decoder.target.model, ids, 6)
    as_ids = pipe.generate([pipe.encode(p).tolist() for p in prompts])
    assert [r.token_ids for r in as_ids] == [r.token_ids for r in results]


def test_one_prompt_of_token_ids_is_not_a_list_of_prompts():
    assert not is_prompt_list([1, 2, 3]) and not is_prompt_list("t1") and not is_prompt_list([])
    assert is_prompt_list(["a", "b"]) and is_prompt_list([[1, 2], [3]])
    assert is_prompt_list([torch.tensor([1, 2])])
    ids = torch.tensor([5, 9, 13])  # `list(ids)` and `tuple(ids)` give 0-d tensors: token ids
    assert not is_prompt_list(list(ids)) and not is_prompt_list(tuple(ids))
    # chat messages with a stray item: one prompt's messages, the item named as message 1 (it
    # was read as a batch whose prompt[0], a message, was to be 'put in a list')
    assert not is_prompt_list([{"role": "user", "content": "hi"}, "x"])
    assert is_prompt_list([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a"}]])


def test_a_list_of_0d_tensors_is_one_prompt(model_dir: Path):
    pipe = load_pipeline(spec(str(model_dir)))
    ids = torch.tensor([5, 9, 13, 5, 9])
    out = pipe.generate(list(ids))
    assert isinstance(out, Generation)
    assert out.token_ids == pipe.generate(ids).token_ids
    # 0-d arrays too: they were refused with torch's "len() of unsized object"
    import numpy as np

    arrays = [np.array(t) for t in ids.tolist()]
    assert pipe.generate(arrays).token_ids == out.token_ids
    assert pipe.generate(tuple(arrays)).token_ids == out.token_ids
    with pytest.raises(ArgumentError, match=r"prompt: expected int token ids, got torch\.float"):
        pipe.generate([np.array(5.0), np.array(9.0)])


@pytest.mark.parametrize("ref", ["gpt2", "HuggingFaceTB/SmolLM2-135M"])
def test_a_hub_id_explains_how_to_use_a_local_folder(ref: str):
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(ref))
    text = str(info.value)
    assert text.startswith(f"pipeline.target: model {ref!r} not found")
    assert "looks like a Hugging Face Hub id" in text
    name = ref.rsplit("/", 1)[-1]
    assert f"huggingface-cli download {ref} --local-dir models/{name}" in text
    assert "save_pretrained" in text


def test_a_missing_path_gets_no_hub_hint(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(tmp_path / "nope")))
    assert "Hub id" not in str(info.value)


def test_the_tokenizer_key_replaces_the_targets_tokenizer(model_dir: Path, chat_tokenizer_dir):
    pipe = load_pipeline(spec(str(model_dir), tokenizer=str(chat_tokenizer_dir)))
    assert pipe.tokenizer.chat_template == CHAT
    assert pipe.encode("t1 t2").tolist() == [1, 2]  # chat off: plain text
    default = load_pipeline(spec(str(model_dir)))
    assert getattr(default.tokenizer, "chat_template", None) is None


def test_chat_applies_the_template(model_dir: Path, chat_tokenizer_dir: Path):
    decoding = {"max_new_tokens": 4, "dtype": "float64", "device": "cpu", "chat": True}
    pipe = load_pipeline(spec(str(model_dir), tokenizer=str(chat_tokenizer_dir), decoding=decoding))
    assert pipe.encode("t1 t2").tolist() == [60, 1, 2, 61, 62]
    assert pipe.encode([5, 6]).tolist() == [5, 6]  # token ids are used as given
    result = pipe.generate("t1 t2")
    model = pipe.decoder.target.model
    assert list(result.token_ids) == greedy_reference(model, torch.tensor([60, 1, 2, 61, 62]), 4)


def test_chat_without_a_template_is_a_clear_error(model_dir: Path):
    decoding = {"dtype": "float64", "device": "cpu", "chat": True}
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(model_dir), decoding=decoding))
    assert str(info.value).startswith(
        f"pipeline.decoding.chat: the tokenizer of {str(model_dir)!r} has no chat template"
    )


def test_bad_tokenizer_values(model_dir: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"pipeline.tokenizer: expected a tokenizer reference"):
        pipeline_spec_from_dict(spec("zoo:target", tokenizer=3))
    with pytest.raises(ConfigError, match=r"pipeline.tokenizer: cannot load .*not found"):
        load_pipeline(spec(str(model_dir), tokenizer=str(tmp_path / "none")))
    big = tmp_path / "big"
    word_tokenizer(VOCAB * 2).save_pretrained(big)
    with pytest.raises(ConfigError, match=r"has 128 tokens but the target .* vocabulary of 64"):
        load_pipeline(spec(str(model_dir), tokenizer=str(big)))
    with pytest.raises(ConfigError, match=r"pipeline.decoding.chat: expected bool"):
        pipeline_spec_from_dict(spec("zoo:target", decoding={"chat": "yes"}))


def _ordered(first: tuple[str, dict], second: tuple[str, dict]) -> dict:
    return {
        "target": "zoo:target",
        "drafters": dict([first, second]),
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "scheduler": {"name": "layers", "layers": [1]},  # both drafters called every step
        "decoding": {"max_new_tokens": 12, "dtype": "float32", "device": "cpu"},
    }


LM = ("strong", {"name": "hf_lm", "model": "zoo:draft-m"})
NGRAM = ("weak", {"name": "ngram", "max_ngram": 3})


def test_drafters_listed_out_of_cheapest_first_order_warn_once_naming_both():
    """An LM drafter listed before the n-gram drafter (as a key-sorting YAML dump lists
    `strong` before `weak`) still decodes exactly; once both have measured calls, the next
    generation warns, once, naming both paths and the order to use."""
    import warnings

    from treegraft.core.pipeline import DrafterOrderWarning

    pipe = load_pipeline(_ordered(LM, NGRAM))
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [pipe.generate(prompt).token_ids for _ in range(3)]
    order = [w for w in caught if issubclass(w.category, DrafterOrderWarning)]
    assert len(order) == 1, [str(w.message) for w in caught]
    message = str(order[0].message)
    assert "pipeline.drafters.strong" in message and "pipeline.drafters.weak" in message
    assert "list 'weak' before 'strong'" in message
    ids = pipe.encode(prompt)
    want = greedy_reference(pipe.decoder.target.model, ids, 12)
    assert all(list(out) == want for out in outputs)


def test_drafters_listed_cheapest_first_do_not_warn():
    import warnings

    from treegraft.core.pipeline import DrafterOrderWarning

    pipe = load_pipeline(_ordered(NGRAM, LM))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            pipe.generate("def add(a, b):\n    return a + b\n\ndef add(a, b):")
    assert not [w for w in caught if issubclass(w.category, DrafterOrderWarning)]
    assert len(pipe.decoder.times.drafters) == 2  # both were measured, and judged in order


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_a_model_folder_without_tokenizer_files_takes_token_ids(
    tmp_path: Path, model_type: str
) -> None:
    """Transformers builds an empty GPT-2 tokenizer for such a folder (every text becomes no
    tokens) and fails for Llama; the pipeline loads without one, decodes ids exactly and says
    why text is refused."""
    from treegraft.testing import tiny_model

    model = tiny_model(model_type, seed=3, vocab=VOCAB)
    model.save_pretrained(tmp_path)
    pipe = load_pipeline(spec(str(tmp_path)))
    assert pipe.tokenizer is None
    prompt = [5, 9, 5, 9, 5]
    want = greedy_reference(model, torch.tensor(prompt), 6)
    assert list(pipe.generate(prompt).token_ids) == want
    with pytest.raises(TreegraftError, match="no tokenizer \\(none beside the target"):
        pipe.generate("t5 t9")
    with pytest.raises(ArgumentError, match=r"stream: this pipeline has no tokenizer.*steps"):
        next(pipe.stream(prompt))  # text of ids it cannot decode: refused, not empty


def test_tokenizer_files_that_do_not_load_name_the_folder(tmp_path: Path) -> None:
    from treegraft.testing import tiny_model

    tiny_model("llama", seed=3, vocab=VOCAB).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TreegraftError, match=f"the tokenizer files in {tmp_path} do not load"):
        load_pipeline(spec(str(tmp_path)))


def _no_config(folder: Path) -> None:
    (folder / "config.json").write_text("{bad")


def _truncated_weights(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _config_edit(**changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | changes))

    return edit


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_no_config, "config.json is not valid JSON (Expecting property name"),
        (_truncated_weights, "model.safetensors: header length"),
        (_no_weights, "no weights file: expected model.safetensors"),
        (_config_edit(pad_token_id=100), "config.json says pad_token_id 100, outside the vocab"),
        (  # transformers' own refusal, named: not an internal error
            _config_edit(num_attention_heads=3),
            "transformers could not load the model in",
        ),
    ],
    ids=["config", "truncated", "no-weights", "pad-token", "heads"],
)
def test_a_damaged_model_folder_is_named_not_an_internal_error(
    tmp_path: Path, damage, message: str
) -> None:
    from treegraft.testing import tiny_model

    tiny_model("llama", seed=3, vocab=VOCAB).save_pretrained(tmp_path)
    damage(tmp_path)
    with pytest.raises(TreegraftError) as info:
        load_pipeline(spec(str(tmp_path)))
    assert str(info.value).startswith("pipeline.target: "), info.value
    assert message in str(info.value)


def test_a_folder_of_no_causal_lm_or_of_a_headless_checkpoint_is_refused(tmp_path: Path) -> None:
    """A T5 folder cannot load as a causal LM; a BertModel checkpoint loads as BertLMHeadModel
    with its LM head at random (transformers only logs that): both are errors naming why."""
    from transformers import BertConfig, BertModel, T5Config, T5ForConditionalGeneration

    t5 = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(t5).save_pretrained(tmp_path / "t5")
    bert = BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        is_decoder=True,
    )
    BertModel(bert).save_pretrained(tmp_path / "bert")
    with pytest.raises(TreegraftError, match="holds a 't5' model, which transformers does not"):
        load_pipeline(spec(str(tmp_path / "t5")))
    with pytest.raises(
        TreegraftError, match=r"lacks \d+ weight\(s\) of BertLMHeadModel \(e.g. cls.predictions"
    ):
        load_pipeline(spec(str(tmp_path / "bert")))


@pytest.mark.parametrize("generation_eos", [None, "config"], ids=["no-eos", "eos"])
def test_eos_is_read_as_generate_reads_it(tmp_path: Path, generation_eos) -> None:
    """A `generation_config.json` without `eos_token_id` makes `generate` stop at no EOS, even
    where config.json names one: the pipeline stops where `generate` does, in both cases."""
    from transformers import AutoModelForCausalLM

    from treegraft.testing import tiny_model

    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    plain = greedy_reference(tiny_model("llama", seed=3), torch.tensor(prompt), 12)
    eos = plain[4]  # a token greedy decoding emits
    tiny_model("llama", seed=3, eos=eos).save_pretrained(tmp_path)
    generation = {} if generation_eos is None else {"eos_token_id": eos}
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    pipe = load_pipeline(spec(str(tmp_path), decoding={"max_new_tokens": 12, "dtype": "float64"}))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    got = pipe.generate(prompt).token_ids
    assert list(got) == hf_generate(model, torch.tensor(prompt), 12)
    assert len(got) == (plain.index(eos) + 1 if generation_eos else 12)


def test_a_second_generation_while_one_is_open_is_refused(model_dir: Path) -> None:
    """One decoder state: `generate` inside an open `stream()`, or a second `steps()`, raised an
    IndexError or silently decoded the other prompt's state. Refused now; the open one finishes
    exactly, and a closed iterator frees the pipeline."""
    import threading

    from treegraft.core.errors import BusyError

    pipe = load_pipeline(spec(str(model_dir), decoding={"max_new_tokens": 8, "dtype": "float64"}))
    prompt = [5, 9, 13, 5, 9, 13]
    want = pipe.generate(prompt).token_ids
    steps = pipe.steps(prompt)
    first = next(steps)
    with pytest.raises(BusyError, match="a generation of this pipeline is still open"):
        pipe.generate([7, 8, 9])
    with pytest.raises(BusyError):
        next(pipe.steps([7, 8, 9]))
    caught: list[BaseException] = []
    thread = threading.Thread(target=lambda: _record(caught, pipe.generate, [7, 8, 9]))
    thread.start()
    thread.join()
    assert len(caught) == 1 and isinstance(caught[0], BusyError)
    rest = [t for e in steps for t in e.tokens]
    assert (*first.tokens, *rest) == want
    stream = pipe.stream(prompt)
    next(stream)
    stream.close()  # an iterator closed half way frees the pipeline
    assert pipe.generate(prompt).token_ids == want


def test_an_iterator_only_a_reference_cycle_holds_does_not_keep_the_pipeline_busy(
    model_dir: Path,
) -> None:
    """A loop over steps() left by an exception its consumer kept (`except ... as exc: err =
    exc`: the traceback holds the frame, the frame the iterator) left the pipeline busy until
    the cyclic garbage collector happened to run: a BusyError for an iterator nothing reaches.
    It is collected (and closed) before a generation is refused."""
    import gc

    pipe = load_pipeline(spec(str(model_dir)))
    prompt = [5, 9, 13, 5, 9, 13]
    want = pipe.generate(prompt).token_ids

    def consume() -> None:
        steps = pipe.steps(prompt)
        try:
            for _ in steps:
                raise ValueError("the consumer fails")
        except ValueError as exc:
            kept = exc  # noqa: F841 (a cycle: frame -> exc -> traceback -> frame)

    enabled = gc.isenabled()
    gc.disable()  # the collector would otherwise run at a moment of its choosing
    try:
        consume()
        assert pipe.generate(prompt).token_ids == want
        consume()
        assert [t for e in pipe.steps(prompt) for t in e.tokens] == list(want)
    finally:
        if enabled:
            gc.enable()


def _record(caught: list[BaseException], call, *args) -> None:
    try:
        call(*args)
    except BaseException as exc:  # the test reads it
        caught.append(exc)


def test_a_pipeline_refuses_to_be_pickled_or_copied(model_dir: Path) -> None:
    import copy
    import pickle

    pipe = load_pipeline(spec(str(model_dir)))
    for attempt in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="holds loaded models and their caches"):
            attempt(pipe)


def test_prompt_containers(model_dir: Path) -> None:
    import numpy as np

    pipe = load_pipeline(spec(str(model_dir)))
    ids = torch.tensor([5, 9, 13, 5, 9])
    by_list = [g.token_ids for g in pipe.generate([ids.tolist(), ids[:3].tolist()])]
    assert [g.token_ids for g in pipe.generate([ids.numpy(), ids[:3].numpy()])] == by_list
    assert pipe.generate(ids, max_new_tokens=np.int64(3)).token_ids == by_list[0][:3]
    for bad, message in [
        (ids.to("meta"), "prompt: expected token ids in a dense tensor, got a meta tensor"),
        (ids.to_sparse(), "got a torch.sparse_coo tensor"),
        (
            np.array([2**63 + 5], dtype=np.uint64),
            f"prompt: token id {2**63 + 5} at position 0 is outside the target's vocabulary",
        ),
    ]:
        with pytest.raises(TreegraftError, match=message.replace("(", r"\(").replace("[", r"\[")):
            pipe.generate(bad)


def test_a_batch_is_checked_before_any_prompt_is_decoded(model_dir: Path) -> None:
    pipe = load_pipeline(spec(str(model_dir)))
    decoded = pipe.decoder.target.forwards
    with pytest.raises(TreegraftError) as info:
        pipe.generate([[5, 9], [7, 8], [1, 999]])
    assert str(info.value).startswith("prompt[2]: token id 999 at position 1 is outside")
    assert pipe.decoder.target.forwards == decoded  # nothing decoded


@pytest.mark.parametrize(
    "spec", [{"target": "zoo:target"}, None, "ngram-only"], ids=["mapping", "none", "name"]
)
def test_from_spec_refuses_what_is_not_a_spec(spec: Any) -> None:
    """`Pipeline.from_spec({...})` was a raw AttributeError ('dict' has no 'decoding')."""
    with pytest.raises(ArgumentError) as info:
        Pipeline.from_spec(spec)
    assert str(info.value).startswith(
        f"Pipeline.from_spec: spec: expected a PipelineSpec (`pipeline_spec_from_dict`, "
        f"`load_pipeline_spec`), got {type(spec).__name__} {spec!r}; `load_pipeline` takes"
    )


@pytest.mark.parametrize(
    ("source", "shown"),
    [(None, "NoneType None"), (b"ngram-only", "bytes b'ngram-only'"), (5, "int 5")],
    ids=["none", "bytes", "int"],
)
def test_load_pipeline_refuses_a_source_of_another_type(source: Any, shown: str) -> None:
    with pytest.raises(ArgumentError) as info:
        load_pipeline(source)
    assert str(info.value) == (
        "load_pipeline: source: expected a shipped pipeline's name, a path to a YAML file or a "
        f"mapping, got {shown}"
    )


@pytest.mark.parametrize("source", [None, 5, b"ngram-only"], ids=["none", "int", "bytes"])
def test_resolve_pipeline_refuses_a_name_of_another_type(source: Any) -> None:
    """`resolve_pipeline(None)` was a raw TypeError from pathlib."""
    with pytest.raises(ArgumentError, match=r"^resolve_pipeline: name_or_path: expected a file"):
        resolve_pipeline(source)


def test_a_prompt_of_no_tokens_is_named_in_a_batch(model_dir: Path) -> None:
    pipe = load_pipeline(spec(str(model_dir)))
    with pytest.raises(ArgumentError) as info:
        pipe.generate(["t1 t2", ""])
    assert str(info.value) == (
        "prompt[1]: '' is empty after tokenization; expected text the tokenizer turns into at "
        "least one token"
    )
    with pytest.raises(ArgumentError, match=r"^prompt\[1\]: expected text or a sequence of int"):
        pipe.generate(["t1 t2", 3])  # not taken for one prompt's token ids


def test_chat_messages_are_encoded_with_the_template(model_dir: Path, chat_tokenizer_dir: Path):
    pipe = load_pipeline(spec(str(model_dir), tokenizer=str(chat_tokenizer_dir)))  # chat: off
    messages = [{"role": "system", "content": "t3"}, {"role": "user", "content": "t1 t2"}]
    ids = pipe.tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids[:2] == [60, 3] and ids[-1] == 62
    assert pipe.encode(messages).tolist() == ids
    result = pipe.generate(messages)
    want = greedy_reference(pipe.decoder.target.model, torch.tensor(ids), 6)
    assert list(result.token_ids) == want
    empty_answer = [*messages, {"role": "assistant", "content": ""}]  # the generation prompt
    assert pipe.encode(empty_answer).tolist() == ids
    batch = pipe.generate([messages, [{"role": "user", "content": "t4"}]])
    assert batch[0].token_ids == result.token_ids and len(batch) == 2
    for bad, message in [
        ([{"role": "user"}], "prompt: message 0: expected a mapping with a 'role' and a 'content'"),
        ([messages[0], 5], "prompt: message 1: expected a mapping with a 'role' and a 'content'"),
        ([{"role": "user", "content": "t\udcff"}], "prompt: message 0: content: byte 0xff"),
    ]:
        with pytest.raises(ArgumentError) as info:
            pipe.encode(bad)
        assert str(info.value).startswith(message)


def test_one_message_outside_a_list_is_refused_saying_so(model_dir: Path) -> None:
    pipe = load_pipeline(spec(str(model_dir)))
    with pytest.raises(ArgumentError) as info:
        pipe.generate({"role": "user", "content": "t1"})
    assert str(info.value).startswith(
        "prompt: expected text, token ids or a list of chat messages, got one mapping"
    )


def test_chat_messages_without_a_template_are_refused(model_dir: Path) -> None:
    pipe = load_pipeline(spec(str(model_dir)))
    with pytest.raises(ArgumentError) as info:
        pipe.generate([{"role": "user", "content": "t1"}])
    assert str(info.value).startswith("prompt: chat messages need a chat template; the tokenizer")


@pytest.mark.parametrize("where", ["source", "target", "drafter-model", "tokenizer"])
def test_a_path_too_long_for_the_file_system_is_not_found(where: str) -> None:
    """Not an `OSError` (File name too long): a `ConfigError` showing the path shortened."""
    long = "x" * 3000
    base = spec("zoo:target")
    source = {
        "source": long,
        "target": {**base, "target": long},
        "drafter-model": {**base, "drafters": {"s": {"name": "hf_lm", "model": long}}},
        "tokenizer": {**base, "tokenizer": long},
    }[where]
    with pytest.raises(ConfigError) as info:
        load_pipeline(source)
    assert "not found" in str(info.value) and "(3000 characters)" in str(info.value)
    assert len(str(info.value)) < 600


@pytest.mark.parametrize("keyword", ["resources", "registry"])
def test_load_pipeline_refuses_resources_or_registry_of_another_type(keyword: str) -> None:
    with pytest.raises(ArgumentError) as info:
        load_pipeline(spec("zoo:target"), **{keyword: "x"})
    kind = {"resources": "Resources", "registry": "Registry"}[keyword]
    assert str(info.value) == f"load_pipeline: {keyword}: expected a {kind} or None, got str 'x'"


@pytest.mark.parametrize("method", ["stream", "steps"])
def test_stream_and_steps_take_one_prompt(model_dir: Path, method: str) -> None:
    pipe = load_pipeline(spec(str(model_dir)))
    with pytest.raises(ArgumentError) as info:
        getattr(pipe, method)(["t1 t2", "t3"])
    assert str(info.value) == (
        "prompt: steps() and stream() decode one prompt, got a list of 2 prompts: call them "
        "once per prompt, or pass the list to generate()"
    )


def test_prepare_takes_one_prompt(model_dir: Path) -> None:
    """A list of prompts reached the token-id check: "got list (too many dimensions 'str')"."""
    pipe = load_pipeline(spec(str(model_dir)))
    with pytest.raises(ArgumentError) as info:
        pipe.prepare(["t1 t2", "t3"])
    assert str(info.value) == (
        "prompt: prepare() takes one prompt, got a list of 2 prompts: pass one of them (its "
        "length sets the cached context the measurements run at)"
    )
    assert pipe.prepare("t1 t2") >= 0.0


@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_pipeline_name_is_not_found(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"pipeline '{name}' not found: expected a YAML file"):
        load_pipeline(name)


def test_a_pipeline_file_under_home_is_named_with_a_tilde(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_pipeline("~/p.yaml")` was 'not found' where every model reference expands `~`."""
    from treegraft.core.pipeline import resolve_pipeline

    (tmp_path / "p.yaml").write_text("target: zoo:target\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_pipeline("~/p.yaml") == tmp_path / "p.yaml"
    assert resolve_pipeline("ngram-only").name == "ngram-only.yaml"


SAMPLING = {"name": "pointmass", "temperature": 1.5, "top_p": 0.9}
SEED_PROMPT = "t1 t2 t3 t4 t1 t2 t3 t4 t1 t2"


def test_generate_takes_a_seed_as_the_cli_does(tmp_path: Path, model_dir: Path) -> None:
    """`generate(seed=N)` had no seed (only `--seed` and `decoding.seed` set one): it samples
    what `treegraft generate --seed N` samples, for this call alone (the next call without a
    seed samples as a fresh pipeline does), and from the same seed for every prompt of a list."""
    from tests.test_cli import invoke, pipeline_file

    path = pipeline_file(tmp_path, str(model_dir), verifier=SAMPLING)
    pipe = load_pipeline(str(path))
    fresh = load_pipeline(str(path)).generate(SEED_PROMPT).token_ids
    for seed in (3, 2**32 - 1):
        args = ["--pipeline", str(path), "--prompt", SEED_PROMPT, "--json", "--seed", str(seed)]
        cli_ids = json.loads(invoke("generate", *args).stdout)["token_ids"]
        assert list(pipe.generate(SEED_PROMPT, seed=seed).token_ids) == cli_ids
        assert pipe.generate(SEED_PROMPT).token_ids == fresh
        both = pipe.generate([SEED_PROMPT, SEED_PROMPT], seed=seed)
        assert [list(g.token_ids) for g in both] == [cli_ids, cli_ids]
        streamed = "".join(pipe.stream(SEED_PROMPT, seed=seed))
        assert streamed == pipe.generate(SEED_PROMPT, seed=seed).text
    samples = {pipe.generate(SEED_PROMPT, seed=s).token_ids for s in range(6)}
    assert len(samples) > 1  # the seed reaches the sampler


def test_a_greedy_pipeline_takes_a_seed_and_decodes_as_without(model_dir: Path) -> None:
    """As `treegraft generate --seed N` on a greedy pipeline: accepted, no change."""
    pipe = load_pipeline(spec(str(model_dir)))
    assert pipe.generate("t1 t2 t3", seed=9).token_ids == pipe.generate("t1 t2 t3").token_ids


@pytest.mark.parametrize(
    ("seed", "shown"),
    [(-1, "-1"), (2**32, "4294967296"), (1.0, "1.0"), (True, "True"), ("3", "'3'")],
)
def test_a_bad_seed_is_named(model_dir: Path, seed: Any, shown: str) -> None:
    pipe = load_pipeline(spec(str(model_dir)))
    for call in (
        lambda: pipe.generate("t1 t2", seed=seed),
        lambda: pipe.generate(["t1", "t2"], seed=seed),
        lambda: pipe.steps("t1 t2", seed=seed),
        lambda: pipe.stream("t1 t2", seed=seed),
    ):
        with pytest.raises(ArgumentError, match=rf"^seed: expected an int .*got {shown}$"):
            call()


def test_a_numpy_seed_samples_as_the_int_it_equals(tmp_path: Path, model_dir: Path) -> None:
    """`pipe.decoder.seed = np.int64(7)` passed its check (an int, NumPy's too) and then failed
    at the first sample with torch's raw TypeError ('an integer is required')."""
    import numpy as np

    from tests.test_cli import pipeline_file

    pipe = load_pipeline(str(pipeline_file(tmp_path, str(model_dir), verifier=SAMPLING)))
    want = pipe.generate(SEED_PROMPT, seed=7).token_ids
    assert pipe.generate(SEED_PROMPT, seed=np.uint32(7)).token_ids == want
    pipe.decoder.seed = np.int64(7)
    assert pipe.generate(SEED_PROMPT).token_ids == want


@pytest.mark.parametrize("method", ["encode", "prepare", "steps", "stream", "generate"])
def test_the_prompt_type_hints_list_chat_messages(method: str) -> None:
    """steps() and stream() took chat messages but their hints listed text and ids only."""
    import typing
    from collections.abc import Mapping, Sequence

    hint = typing.get_type_hints(getattr(Pipeline, method))["prompt"]
    assert Sequence[Mapping[str, Any]] in typing.get_args(hint) or hint is Any


def test_generate_documents_max_new_tokens_and_stop() -> None:
    doc = Pipeline.generate.__doc__
    assert "`max_new_tokens`" in doc and "`stop`" in doc and "decoding.stop" in doc
