"""Chat-formatted prompts: `decoding.chat`, `treegraft generate --chat`, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from tests.conftest import greedy_reference, tiny_llama, word_tokenizer
from treegraft import cli
from treegraft.core.chat import NoChatTemplateError, chat_ids, messages_of
from treegraft.core.config import ConfigError
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import load_pipeline

VOCAB = 64
TEMPLATE = (
    "{% for m in messages %}t5 {{ m['content'] }} t6 {% endfor %}"
    "{% if add_generation_prompt %}t7{% endif %}"
)


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    for console in (cli.out, cli.console):
        monkeypatch.setattr(console, "_width", 1000)


def _model_dir(path: Path, template: str | None) -> Path:
    tiny_llama(seed=7, vocab=VOCAB).save_pretrained(path)
    tokenizer = word_tokenizer(VOCAB)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_dir(tmp_path_factory.mktemp("chat-model"), TEMPLATE)


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_dir(tmp_path_factory.mktemp("plain-model"), None)


def _pipeline(tmp_path: Path, target: Path, *, chat: bool) -> Path:
    data = {
        "target": str(target),
        "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"max_new_tokens": 10, "dtype": "float64", "device": "cpu", "chat": chat},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_chat_ids_wrap_the_text_as_one_user_turn(chat_model):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    assert chat_ids(tokenizer, "t1 t2 t3") == [5, 1, 2, 3, 6, 7]


def test_chat_ids_without_a_template_name_the_tokenizer(plain_model):
    tokenizer = AutoTokenizer.from_pretrained(plain_model)
    with pytest.raises(NoChatTemplateError, match=r"chat: the tokenizer .* has no chat template"):
        chat_ids(tokenizer, "t1")


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "plain"])
def test_decoding_chat_switches_the_encoding(tmp_path, chat_model, chat):
    pipe = load_pipeline(_pipeline(tmp_path, chat_model, chat=chat))
    want = [5, 1, 2, 6, 7] if chat else [1, 2]
    assert pipe.encode("t1 t2").tolist() == want


def test_generate_chat_decodes_the_greedy_continuation_of_the_chat_prompt(tmp_path, chat_model):
    pipeline = _pipeline(tmp_path, chat_model, chat=False)
    result = CliRunner().invoke(
        cli.app, ["generate", "--pipeline", str(pipeline), "--prompt", "t1 t2 t1 t2", "--chat"]
    )
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    model = AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float64)
    ids = torch.tensor(chat_ids(tokenizer, "t1 t2 t1 t2"))
    want = tokenizer.decode(greedy_reference(model, ids, 10), skip_special_tokens=True)
    assert result.stdout.strip() == want.strip()


@pytest.mark.parametrize("flag", [True, False], ids=["flag", "yaml"])
def test_chat_without_a_template_is_a_clear_cli_error(tmp_path, plain_model, flag):
    pipeline = _pipeline(tmp_path, plain_model, chat=not flag)
    args = ["generate", "--pipeline", str(pipeline), "--prompt", "t1"] + (
        ["--chat"] if flag else []
    )
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2
    assert "has no chat template" in result.stderr
    # the advice names what the user set: the flag, or the pipeline's key
    assert ("leave out --chat" in result.stderr) == flag
    assert ("decoding.chat: false" in result.stderr) == (not flag)


def test_messages_of_reads_the_zoo_suites_turn_markers():
    text = "<|user|>\nWhich module?\n<|assistant|>\n`inspect`.\n<|user|>\nIts signature?\n<|assistant|>\n"
    assert messages_of(text) == [
        {"role": "user", "content": "Which module?"},
        {"role": "assistant", "content": "`inspect`."},
        {"role": "user", "content": "Its signature?"},
    ]


@pytest.mark.parametrize("text", ["def f(x):\n    return x", "a <|user|>\nb", "plain"])
def test_messages_of_other_text_is_one_user_turn(text):
    assert messages_of(text) == [{"role": "user", "content": text}]


@pytest.mark.parametrize("template", ["", "{% for m in messages %}{{ m['content'] }"])
def test_an_empty_or_broken_template_is_refused_when_the_pipeline_is_built(tmp_path, template):
    target = _model_dir(tmp_path / "model", template)
    with pytest.raises(ConfigError) as info:
        load_pipeline(_pipeline(tmp_path, target, chat=True))
    message = str(info.value)
    assert message.startswith(f"pipeline.decoding.chat: the tokenizer of {str(target)!r}")
    assert ("no chat template" if not template else "does not compile: unexpected '}'") in message


def test_a_template_refusing_the_prompts_turns_is_an_argument_error(tmp_path):
    """Templates that check the roles alternate (Llama 2's, Mistral's) raise for a zoo-formatted
    prompt starting with an assistant turn: the error names the template and its reason."""
    template = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
        "t5 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}t7{% endif %}"
    )
    target = _model_dir(tmp_path / "model", template)
    pipe = load_pipeline(_pipeline(tmp_path, target, chat=True))
    assert pipe.encode("t1 t2").tolist() == [5, 1, 2, 7]
    with pytest.raises(ArgumentError) as info:
        pipe.generate("<|assistant|>\nt1\n<|user|>\nt2\n<|assistant|>\n")
    assert str(info.value) == (
        f"chat: the chat template of {str(target)!r} refused the prompt's 2 message(s): "
        "TemplateError: roles must alternate user/assistant"
    )


def test_messages_of_reads_a_system_turn():
    assert messages_of("<|system|>\nBe brief.\n<|user|>\nt1\n<|assistant|>\n") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "t1"},
    ]
    assert messages_of("<|system|>\nBe brief.\n") == [{"role": "system", "content": "Be brief."}]


def test_messages_of_reads_windows_line_ends():
    text = "<|system|>\r\nBe brief.\r\n<|user|>\r\nt1\r\nt2\r\n<|assistant|>\r\n"
    assert messages_of(text) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "t1\r\nt2"},
    ]


def test_a_last_assistant_turn_with_text_is_continued(chat_model):
    """The answer's beginning is in the prompt: the template's text stops inside that turn (no
    end of turn, no new generation prompt)."""
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    assert chat_ids(tokenizer, "<|user|>\nt1\n<|assistant|>\nt2 t3") == [5, 1, 6, 5, 2, 3]
    assert chat_ids(tokenizer, "<|user|>\nt1\n<|assistant|>\n") == [5, 1, 6, 7]


def test_a_prompt_of_only_the_generation_prompt_is_an_argument_error(chat_model):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    with pytest.raises(ArgumentError) as info:
        chat_ids(tokenizer, "<|assistant|>\n")
    assert str(info.value).startswith(
        "chat: the prompt '<|assistant|>\\n' holds no message, only the empty assistant turn"
    )


def test_no_chat_switches_off_the_pipelines_chat(tmp_path, chat_model, plain_model):
    """`decoding.chat: true` in a pipeline could not be switched off from the command line
    (there was `--chat` only): `--no-chat` encodes the prompt as plain text, and lets a pipeline
    whose tokenizer has no template run at all."""
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    model = AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float64)
    want = greedy_reference(model, torch.tensor([1, 2, 1, 2]), 10)
    args = ["--prompt", "t1 t2 t1 t2", "--json", "--no-chat"]
    result = CliRunner().invoke(
        cli.app, ["generate", "--pipeline", str(_pipeline(tmp_path, chat_model, chat=True)), *args]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token_ids"] == want
    assert tokenizer("t1 t2 t1 t2", add_special_tokens=False)["input_ids"] == [1, 2, 1, 2]
    (tmp_path / "plain").mkdir()
    pipeline = _pipeline(tmp_path / "plain", plain_model, chat=True)
    result = CliRunner().invoke(cli.app, ["generate", "--pipeline", str(pipeline), *args])
    assert result.exit_code == 0, result.output
    assert "--no-chat" in CliRunner().invoke(cli.app, ["generate", "--help"]).stdout


def _bos_model_dir(path: Path) -> Path:
    """A checkpoint whose tokenizer starts every text with its BOS `t0` (a post-processor, as
    Llama's, Gemma's and Mistral's tokenizer.json have) and ends none with EOS."""
    from tokenizers import processors

    tiny_llama(seed=7, vocab=VOCAB).save_pretrained(path)
    tokenizer = word_tokenizer(VOCAB)
    tokenizer.bos_token = "t0"
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="t0 $A", pair="t0 $A $B", special_tokens=[("t0", 0)]
    )
    tokenizer.save_pretrained(path)
    return path


def test_plain_text_keeps_the_tokenizers_bos_as_generate_receives_it(tmp_path):
    """`tokenizer(text)` starts with the BOS; the pipeline decodes those ids, as `generate` does
    from `tokenizer(text, return_tensors="pt")`, not the text without its BOS."""
    target = _bos_model_dir(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer("t1 t2 t3")["input_ids"] == [0, 1, 2, 3]
    pipe = load_pipeline(_pipeline(tmp_path, target, chat=False))
    assert pipe.encode("t1 t2 t3").tolist() == [0, 1, 2, 3]
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64)
    want = greedy_reference(model, torch.tensor([0, 1, 2, 3]), 10)
    assert list(pipe.generate("t1 t2 t3").token_ids) == want
    with pytest.raises(ArgumentError, match=r"^prompt: '' is empty after tokenization"):
        pipe.encode("")  # the BOS alone is no prompt


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (
            {"tool_use": TEMPLATE, "rag": TEMPLATE},
            "it holds 2 named chat templates (rag, tool_use) and none named 'default', which a "
            "chat prompt would use; name one of them 'default' in its tokenizer_config.json, or "
            "save it as chat_template.jinja",
        ),
        (5, "its chat template is not text: expected a Jinja template, got 5"),
    ],
    ids=["named-without-default", "not-text"],
)
def test_a_template_transformers_cannot_apply_is_refused_when_the_pipeline_is_built(
    tmp_path, template, reason
):
    """transformers refuses these before rendering (ValueError, TypeError): a chat pipeline
    names the tokenizer and why; chat messages to a plain pipeline are an ArgumentError."""
    import json

    target = _model_dir(tmp_path / "model", TEMPLATE)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "chat_template.jinja").unlink(missing_ok=True)
    if isinstance(template, dict):
        template = [{"name": name, "template": text} for name, text in template.items()]
    (target / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    with pytest.raises(ConfigError) as info:
        load_pipeline(_pipeline(tmp_path, target, chat=True))
    assert str(info.value) == f"pipeline.decoding.chat: the tokenizer of {str(target)!r}: {reason}"
    pipe = load_pipeline(_pipeline(tmp_path, target, chat=False))
    with pytest.raises(ArgumentError, match=r"^chat: the chat template of .* refused the prompt"):
        pipe.generate([{"role": "user", "content": "t1"}])
