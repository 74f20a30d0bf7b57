"""`Pipeline.generate`/`stream`/`steps` arguments are validated like YAML fields: errors name the
argument, the value and what was expected; nothing is silently defaulted or truncated."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.pipeline import Pipeline, load_pipeline

VOCAB = 40
PROMPT = [3, 7, 3, 7, 11]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=4, vocab=VOCAB)


@pytest.fixture(scope="module")
def pipe(target) -> Pipeline:
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "decoding": {"max_new_tokens": 6, "dtype": "float64", "device": "cpu"},
    }
    return load_pipeline(spec, resources=memory_resources(target=target))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "max_new_tokens: expected int with 1 <= value <= 1000000, got 0"),
        (-3, "max_new_tokens: expected int with 1 <= value <= 1000000, got -3"),
        (10**9, "got 1000000000"),
        (True, "max_new_tokens: expected int >= 1, got True"),
        (2.0, "max_new_tokens: expected int >= 1, got 2.0"),
        pytest.param(
            10**5000,
            "max_new_tokens: expected int with 1 <= value <= 1000000, got <int of about",
            id="too-long-to-print",
        ),
        pytest.param("x" * 500, "max_new_tokens: expected int >= 1, got 'xxxxxx", id="long"),
    ],
)
def test_max_new_tokens_must_be_a_positive_int(pipe: Pipeline, value, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        pipe.generate(PROMPT, max_new_tokens=value)
    assert message in str(info.value)
    assert len(str(info.value)) < 200  # a long value is shortened


def test_max_new_tokens_none_means_the_pipelines_value(pipe: Pipeline, target) -> None:
    out = pipe.generate(PROMPT, max_new_tokens=None)
    assert list(out.token_ids) == greedy_reference(target, torch.tensor(PROMPT), 6)
    assert len(pipe.generate(PROMPT, max_new_tokens=2).token_ids) == 2


@pytest.mark.parametrize(
    ("stop", "message"),
    [
        ([""], "stop[0]: expected a non-empty string, got ''"),
        (["ok", 3], "stop[1]: expected a non-empty string, got 3"),
        ("###", "stop: expected a list of non-empty strings, got '###'"),
        (["a\udcff"], "stop[0]: byte 0xff at position 1 is not UTF-8 text"),
    ],
)
def test_stop_strings_must_be_non_empty(pipe: Pipeline, stop, message: str) -> None:
    with pytest.raises(ArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        list(pipe.stream(PROMPT, stop=stop))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([3.0, 7.9], "prompt: expected int token ids, got torch.float32 values"),
        (torch.tensor([1.5, 2.0]), "prompt: expected int token ids, got torch.float32 values"),
        (np.array([1.0, 2.0]), "got torch.float64 values"),
        ([True, False], "got True at position 0 (a boolean, not a token id)"),
        ([3, True], "prompt: expected int token ids, got True at position 1 (a boolean"),
        ([[3, np.True_]], "got np.True_ at position 1 (a boolean, not a token id)"),
        (np.array([True, False]), "got torch.bool values"),
        ([3, None], "prompt: expected int token ids, got None at position 1"),
        ([3, VOCAB], f"token id {VOCAB} at position 1 is outside the target's vocabulary"),
        ([3, -1, 4], "token id -1 at position 1 is outside the target's vocabulary [0, 40)"),
        ([3, 2**70], f"prompt: token id {2**70} at position 1 is outside the target's vocab"),
        ([], "prompt: has no tokens"),
        ([[[1, 2], [3]]], "prompt[0]: expected text or a sequence of int token ids"),
        (torch.tensor([[1, 2], [3, 4]]), "expected one sequence of token ids ([T] or [1, T])"),
        (np.ones((1, 3, 2), dtype=np.int64), "got shape [1, 3, 2]: for several prompts, pass a"),
        ([[[1, 2], [3, 4]]], "got shape [2, 2]"),
        (torch.ones(1, 1, 3, dtype=torch.long), "([T] or [1, T]), got shape [1, 1, 3]"),
        (np.ones((1, 1, 1, 2), dtype=np.int64), "got shape [1, 1, 1, 2]"),
        ("t\udcff", "prompt: byte 0xff at position 1 is not UTF-8 text"),
        (5, "prompt: expected text or a sequence of int token ids ([T] or [1, T]), got int 5"),
        (torch.tensor(5), "([T] or [1, T]), got Tensor tensor(5)"),
        ([[3, 7], 5], "prompt[1]: expected text or a sequence of int token ids ([T] or [1, T])"),
        (bytearray(b"\x03\x07"), "got bytearray bytearray(b'\\x03\\x07'): decode bytes to str"),
        (None, "prompt: expected text or a sequence of int token ids, got NoneType None"),
    ],
    ids=[
        "floats",
        "float-tensor",
        "numpy-floats",
        "bools",
        "bool-among-ints",  # it was read as token id 1
        "numpy-bool-in-a-row",
        "bool-array",
        "none-among-ints",
        "vocab",
        "negative",
        "past-int64",
        "empty",
        "ragged",
        "batch-of-two",
        "batch-inside",
        "nested-list",
        "3d-batch-of-one",  # it was flattened into one prompt
        "4d-batch-of-one",
        "bytes",
        "one-int",
        "0d-tensor",
        "int-in-a-list-of-prompts",
        "bytearray",
        "none",
    ],
)
def test_prompt_ids_must_be_integers_inside_the_vocabulary(pipe: Pipeline, prompt, message) -> None:
    with pytest.raises(TreegraftError) as info:
        pipe.generate(prompt)
    assert message in str(info.value)


def test_integer_prompts_of_any_int_type_decode_alike(pipe: Pipeline) -> None:
    want = pipe.generate(PROMPT).token_ids
    for prompt in (
        np.array(PROMPT, dtype=np.int32),
        torch.tensor(PROMPT, dtype=torch.int16),
        torch.tensor([PROMPT]),  # [1, T]: a batch of one
    ):
        assert pipe.generate(prompt).token_ids == want


def test_stop_values_are_shortened_in_messages(pipe: Pipeline) -> None:
    with pytest.raises(ArgumentError) as info:
        pipe.generate(PROMPT, stop="#" * 5000)
    assert str(info.value).endswith("#' (5000 characters)") and len(str(info.value)) < 200


@pytest.mark.parametrize("method", ["stream", "steps"])
def test_stream_and_steps_check_their_arguments_when_called(pipe: Pipeline, method: str) -> None:
    """Not only once iterated: the error points at the call that passed the value."""
    with pytest.raises(ArgumentError, match=r"^max_new_tokens: expected int with 1 <= value"):
        getattr(pipe, method)(PROMPT, max_new_tokens=0)
    with pytest.raises(ArgumentError, match=r"^prompt: has no tokens"):
        getattr(pipe, method)([])
    if method == "stream":  # good arguments, but no tokenizer to turn the tokens into text
        with pytest.raises(ArgumentError, match=r"^stream: this pipeline has no tokenizer"):
            pipe.stream(PROMPT, max_new_tokens=2)
    assert sum(len(e.tokens) for e in pipe.steps(PROMPT, max_new_tokens=2)) == 2


def test_stop_strings_without_a_tokenizer_are_refused_naming_stop(pipe: Pipeline) -> None:
    with pytest.raises(ArgumentError, match=r"^stop: stop strings need a tokenizer"):
        pipe.generate(PROMPT, stop=["x"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.check_context("5", 4), "prompt_len: expected an int >= 1, got '5'"),
        (lambda p: p.check_context(5, None), "max_new_tokens: expected an int >= 1, got None"),
        (lambda p: p.check_context(5, 2.5), "max_new_tokens: expected an int >= 1, got 2.5"),
        (lambda p: p.decode_text(None), "ids: expected a sequence of int token ids, got NoneType"),
        (lambda p: p.decode_text("t1"), "ids: expected a sequence of int token ids, got str 't1'"),
        (lambda p: p.decode_text([3, 1.0]), "ids[1]: expected an int token id, got 1.0"),
        (lambda p: p.decode_text([3, -1]), "ids: token id -1 at position 1 is outside the target"),
        (
            lambda p: p.text_of([3], stop="ab"),
            "stop: expected a list of non-empty strings, got 'ab'",
        ),
        (lambda p: p.shown_text([3], False, [3]), "stop[0]: expected a non-empty string, got 3"),
    ],
    ids=[
        "len-str",
        "new-none",
        "new-float",
        "ids-none",
        "ids-str",
        "id-float",
        "id-neg",
        "stop-str",
        "stop-int",
    ],
)
def test_the_text_and_context_helpers_check_their_arguments(pipe: Pipeline, call, message) -> None:
    """Once a raw TypeError or OverflowError, or a stop string read as its characters."""
    with pytest.raises(ArgumentError) as info:
        call(pipe)
    assert message in str(info.value)
    assert pipe.decode_text(torch.tensor([3, 7])) == "" and pipe.text_of((3, 7), ["x"]) == ""
