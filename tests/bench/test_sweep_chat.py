"""A sweep's `chat: true`: every prompt goes through the target tokenizer's chat template."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_llama, word_tokenizer
from treegraft.bench.config import Pair
from treegraft.bench.sweep import encode_prompt
from treegraft.core.config import ConfigError
from treegraft.core.resources import Resources

TEMPLATE = (
    "{% for m in messages %}t5 {{ m['content'] }} t6 {% endfor %}"
    "{% if add_generation_prompt %}t7{% endif %}"
)


def _target(path, template):
    tiny_llama(seed=1, vocab=16).save_pretrained(path)
    tokenizer = word_tokenizer(16)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return Pair(target=str(path), drafter=str(path))


@pytest.mark.parametrize("chat", [True, False])
def test_encode_prompt_applies_the_chat_template_when_asked(tmp_path, chat):
    pair = _target(tmp_path, TEMPLATE)
    ids = encode_prompt(Resources(), pair, "t1 t2", chat=chat)
    assert ids.tolist() == ([5, 1, 2, 6, 7] if chat else [1, 2])


def test_chat_without_a_template_names_the_pair(tmp_path):
    pair = _target(tmp_path, None)
    with pytest.raises(
        ConfigError,
        match=r"pair .*: chat: the tokenizer .* has no chat template; .* set the sweep's chat: "
        r"false$",
    ):
        encode_prompt(Resources(), pair, "t1", chat=True)


def test_the_real_model_sweep_is_valid():
    from pathlib import Path

    from treegraft.bench.config import BASELINES, load_bench_config
    from treegraft.zoo import SUITES

    cfg = load_bench_config(Path(__file__).resolve().parents[2] / "benchmarks" / "real.yaml")
    assert [(p.target, p.drafter) for p in cfg.pairs] == [
        ("zoo:smollm2", "zoo:smollm2-draft-l"),
        ("zoo:smollm2", "zoo:smollm2-draft"),
    ]
    assert [p.name for p in cfg.pairs] == ["smollm2+smollm2-draft-l", "smollm2+smollm2-draft"]
    s = cfg.settings
    assert (s.suites, s.prompts_per_suite, s.max_new_tokens, s.chat) == (list(SUITES), 10, 96, True)
    assert s.baselines == list(BASELINES)
    assert {p.label or p.pipeline for p in cfg.pipelines} >= {"treegraft", "treegraft-distilled"}
