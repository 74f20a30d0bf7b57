"""The feature head's distillation (treegraft/zoo/train_head.py) on the tiny corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import tiny_llama
from treegraft.plugins.drafters.feature_head import load_head
from treegraft.zoo import ZOO_DIR
from treegraft.zoo.corpus import CorpusConfig, build_corpus
from treegraft.zoo.recipe import RecipeError
from treegraft.zoo.train import batch_at, load_teacher, load_tokens, tokenizer_dir
from treegraft.zoo.train_head import (
    CHECKPOINT_FILE,
    load_head_recipe,
    new_run,
    train_head,
    unrolled_losses,
)

VOCAB = 8192  # the zoo tokenizer's


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tiny_config: CorpusConfig) -> Path:
    out = tmp_path_factory.mktemp("head-corpus")
    build_corpus(tiny_config, out)
    return out


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "t"
    tiny_llama(seed=3, vocab=VOCAB, hidden=32, dtype=torch.float32).save_pretrained(path)
    return path


def write_recipe(path: Path, corpus: Path, teacher: Path, **overrides: object) -> Path:
    recipe = {
        "name": "tiny-head",
        "target": str(teacher),
        "intermediate_size": 16,
        "tokens": 6 * 2 * 32,
        "corpus": str(corpus),
        "unroll": 2,
        "seq_len": 32,
        "batch_size": 2,
        "warmup_steps": 2,
        "valid_fraction": 0.05,
        "valid_batches": 1,
        "eval_every": 3,
        "checkpoint_every": 3,
        "log_every": 1,
        **overrides,
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_resumed_head_run_equals_an_uninterrupted_one_and_exports(tmp_path, corpus, teacher):
    recipe = load_head_recipe(write_recipe(tmp_path / "r.yaml", corpus, teacher))
    whole = train_head(recipe, runs=tmp_path / "a")
    train_head(recipe, runs=tmp_path / "b", max_steps=4)
    assert (tmp_path / "b" / "tiny-head" / CHECKPOINT_FILE).is_file()
    assert not (tmp_path / "b" / "tiny-head" / "export").exists()  # unfinished: not exported
    resumed = train_head(recipe, runs=tmp_path / "b", resume=True)
    assert resumed.step == whole.step == 6
    for key, value in whole.head.state_dict().items():
        torch.testing.assert_close(resumed.head.state_dict()[key], value)
    export = tmp_path / "a" / "tiny-head" / "export"
    record = json.loads((export / "training.json").read_text())
    assert record["steps"] == 6 and len(record["valid_agreement_per_depth"]) == 2
    head = load_head(str(export), dtype=torch.float32)
    assert head.spec.vocab_size == VOCAB and head.spec.hidden_size == 32


def test_head_training_lowers_the_loss(tmp_path, corpus, teacher):
    """On a fixed batch, the trained head's loss is well below the initial head's."""
    recipe = load_head_recipe(
        write_recipe(tmp_path / "r.yaml", corpus, teacher, tokens=40 * 2 * 32, lr=1e-2)
    )
    target = load_teacher(str(teacher))
    tokens = load_tokens(corpus, tokenizer_dir(recipe))
    batch = batch_at(tokens, 0, seed=7, batch_size=4, seq_len=32)
    with torch.no_grad():
        before = float(unrolled_losses(new_run(recipe, target).head, target, batch, recipe)[0])
    run = train_head(recipe, runs=tmp_path / "runs")
    with torch.no_grad():
        after = float(unrolled_losses(run.head, target, batch, recipe)[0])
    assert after < 0.9 * before


def test_cli_train_head(tmp_path, corpus, teacher):
    from typer.testing import CliRunner

    from treegraft.zoo.cli import app

    recipe = write_recipe(tmp_path / "r.yaml", corpus, teacher)
    args = ["train-head", "--recipe", str(recipe), "--runs", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "head")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "head" / "head.safetensors").is_file()


def test_head_recipes_are_strict(tmp_path, corpus, teacher):
    with pytest.raises(RecipeError, match="unroll"):
        load_head_recipe(write_recipe(tmp_path / "r.yaml", corpus, teacher, unroll="two"))
    shipped = load_head_recipe(ZOO_DIR / "recipes" / "heads" / "head.yaml")
    assert shipped.target == "zoo:target" and shipped.unroll >= 1
    smollm2 = load_head_recipe(ZOO_DIR / "recipes" / "heads" / "smollm2-head.yaml")
    assert smollm2.target == smollm2.tokenizer == "zoo:smollm2"
    assert smollm2.token_counts == "zoo:smollm2-token-counts" and smollm2.top_tokens == 4096


def test_the_output_rows_follow_the_recipes_token_counts(tmp_path, corpus, teacher):
    from treegraft.zoo.token_counts import save_counts
    from treegraft.zoo.train_head import output_rows

    target = load_teacher(str(teacher))
    counts = torch.zeros(VOCAB, dtype=torch.long)
    counts[[7, 3, 4000]] = torch.tensor([5, 9, 2])
    save_counts(tmp_path / "c.json", counts.numpy(), source="test")
    recipe = load_head_recipe(
        write_recipe(
            tmp_path / "r.yaml",
            corpus,
            teacher,
            top_tokens=3,
            token_counts=str(tmp_path / "c.json"),
        )
    )
    weight, _ = output_rows(target, recipe)
    assert torch.equal(weight, target.get_output_embeddings().weight[[3, 7, 4000]])
    save_counts(tmp_path / "short.json", counts[:100].numpy(), source="test")
    short = load_head_recipe(
        write_recipe(
            tmp_path / "s.yaml",
            corpus,
            teacher,
            top_tokens=3,
            token_counts=str(tmp_path / "short.json"),
        )
    )
    with pytest.raises(RecipeError, match=r"token_counts: .* counts 100 token ids, the target"):
        output_rows(target, short)


def test_a_recipes_tokenizer_may_name_a_model(tmp_path, corpus, teacher):
    from treegraft import zoo

    named = load_head_recipe(
        write_recipe(tmp_path / "r.yaml", corpus, teacher, tokenizer="zoo:draft-m")
    )
    assert tokenizer_dir(named) == zoo.resolve("zoo:draft-m")
    assert tokenizer_dir(load_head_recipe(write_recipe(tmp_path / "d.yaml", corpus, teacher))) == (
        zoo.tokenizer_path()
    )
    wrong = write_recipe(tmp_path / "w.yaml", corpus, teacher, tokenizer="zoo:nope")
    with pytest.raises(RecipeError, match=r"recipe.tokenizer: unknown zoo model 'zoo:nope'"):
        load_head_recipe(wrong)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"target": "zoo:nosuch"}, r"recipe.target: unknown zoo model 'zoo:nosuch'"),
        ({"top_tokens": 0}, r"recipe.top_tokens: expected int >= 1, or null, got 0"),
        ({"unroll": 0}, r"recipe.unroll: expected int >= 1, got 0"),
        ({"batch_size": 0}, r"recipe.batch_size: expected int >= 1, got 0"),
        ({"name": "../up"}, r"recipe.name: expected a plain folder name"),
        (
            {"top_tokens": 16, "token_counts": "/nope.json"},
            r"recipe.token_counts: expected one of 'zoo:token-counts', .* got '/nope.json' "
            r"\(no such file\)",
        ),
        (  # every unrolled step needs a position to predict: was NaN losses, a NaN head
            {"seq_len": 2, "unroll": 2},
            r"recipe.seq_len: expected more than unroll \(2\) tokens, got 2",
        ),
    ],
    ids=["target", "top0", "unroll0", "batch0", "name", "counts", "seq_len-unroll"],
)
def test_head_recipe_errors_name_file_field_value(tmp_path, teacher, overrides, message):
    path = write_recipe(tmp_path / "r.yaml", Path("/nonexistent"), teacher, **overrides)
    with pytest.raises(RecipeError, match=rf"^{path}: {message}"):
        load_head_recipe(path)


def test_top_tokens_above_the_targets_vocabulary_is_refused(tmp_path, corpus, teacher):
    from typer.testing import CliRunner

    from treegraft.cli import app

    path = write_recipe(tmp_path / "r.yaml", corpus, teacher, top_tokens=100000)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*args, "--max-steps", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert (
        f"{path}: recipe.top_tokens: expected at most the vocabulary of the target "
        f"'{teacher}' ({VOCAB} tokens), or null for all of it, got 100000"
    ) in result.stderr
    assert not (tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE).exists()


def test_a_corpus_folder_without_the_corpus_is_named(tmp_path, teacher):
    from typer.testing import CliRunner

    from treegraft.cli import app

    path = write_recipe(tmp_path / "r.yaml", tmp_path / "nocorpus", teacher)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*args, "--max-steps", "1"])
    assert result.exit_code == 2, result.output
    assert (
        f"{path}: recipe.corpus: {tmp_path / 'nocorpus'} holds no corpus.jsonl; expected a corpus "
        f"folder: build one with `treegraft zoo build-corpus --out {tmp_path / 'nocorpus'}`"
    ) in result.stderr


def test_a_run_without_resume_does_not_overwrite_an_earlier_checkpoint(tmp_path, corpus, teacher):
    from typer.testing import CliRunner

    from treegraft.cli import app

    path = write_recipe(tmp_path / "r.yaml", corpus, teacher)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    assert CliRunner().invoke(app, [*args, "--max-steps", "2"]).exit_code == 0
    ckpt = tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE
    before = ckpt.read_bytes()
    result = CliRunner().invoke(app, [*args, "--max-steps", "1"])  # --resume forgotten
    assert result.exit_code == 2, result.output
    assert (
        f"--resume: {ckpt.parent} holds an earlier run's checkpoint ({CHECKPOINT_FILE}); "
        "pass --resume to continue it"
    ) in result.stderr
    assert ckpt.read_bytes() == before  # was: restarted at step 0 and saved over it
    result = CliRunner().invoke(app, [*args, "--max-steps", "1", "--resume"])
    assert result.exit_code == 0 and "step 3, last loss" in result.stdout, result.output


def test_resuming_with_other_model_settings_is_named(tmp_path, corpus, teacher):
    from typer.testing import CliRunner

    from treegraft.cli import app

    runs = ["--runs", str(tmp_path / "runs"), "--max-steps", "1"]
    path = write_recipe(tmp_path / "r.yaml", corpus, teacher)
    assert (
        CliRunner().invoke(app, ["zoo", "train-head", "--recipe", str(path), *runs]).exit_code == 0
    )
    path = write_recipe(tmp_path / "r.yaml", corpus, teacher, intermediate_size=24)
    args = ["zoo", "train-head", "--recipe", str(path), *runs, "--resume"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "internal error" not in result.stderr, result.output
    ckpt = tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE
    assert f"--resume: cannot continue from {ckpt}: Error(s) in loading state_dict" in result.stderr
    assert "written by a recipe with other model settings, or is damaged" in result.stderr


@pytest.mark.parametrize("threads", ["0", str(2**70)])
def test_train_head_refuses_a_thread_count_before_any_work(tmp_path: Path, threads: str):
    """`--threads` past 64 bits was an internal error (torch's overflow); it is checked as the
    other commands' `--threads` are: from 1 to the CPUs this process may use."""
    from typer.testing import CliRunner

    from treegraft.cli import app

    recipe = tmp_path / "head.yaml"
    recipe.write_text("name: h\n")
    result = CliRunner().invoke(
        app, ["zoo", "train-head", "--recipe", str(recipe), "--threads", threads]
    )
    assert result.exit_code == 2, result.output
    assert "--threads: expected int with 1 <= value <= " in result.stderr
    assert f"got {threads}" in result.stderr


@pytest.mark.parametrize("arch", ["gemma", "gpt2"])
def test_a_target_the_eagle_drafter_cannot_serve_is_refused_before_training(tmp_path, corpus, arch):
    """The eagle drafter runs on targets the lean forward runs (Llama, Mistral, Qwen2, Qwen3):
    a head trained on another would be refused by every pipeline, so the run is refused first,
    naming recipe.target and why (was: 6 steps trained for nothing, or an AttributeError)."""
    from transformers import GemmaConfig, GemmaForCausalLM, GPT2Config, GPT2LMHeadModel
    from typer.testing import CliRunner

    from treegraft.cli import app

    if arch == "gemma":
        cfg = GemmaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        )  # fmt: skip
        model = GemmaForCausalLM(cfg)
    else:
        cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=64)
        model = GPT2LMHeadModel(cfg)
    model.save_pretrained(tmp_path / arch)
    path = write_recipe(tmp_path / "r.yaml", corpus, tmp_path / arch)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*args, "--max-steps", "1"])
    assert result.exit_code == 2, result.output
    assert f"{path}: recipe.target: '{tmp_path / arch}' " in result.stderr
    assert f"{type(model).__name__} is not one of LlamaForCausalLM" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE).exists()


def test_a_corpus_tokenized_beyond_the_targets_vocabulary_is_refused(tmp_path, corpus):
    """The recipe's tokenizer (default: the zoo's, 8192 ids) must be the target's: ids past the
    target's embedding are refused naming recipe.tokenizer and both sizes (was: IndexError)."""
    from typer.testing import CliRunner

    from treegraft.cli import app

    small = tmp_path / "small"
    tiny_llama(seed=3, vocab=64, hidden=32, dtype=torch.float32).save_pretrained(small)
    path = write_recipe(tmp_path / "r.yaml", corpus, small)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*args, "--max-steps", "1"])
    assert result.exit_code == 2, result.output
    assert f"{path}: recipe.tokenizer: " in result.stderr
    assert f"the target '{small}' has 64" in result.stderr
    assert not (tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE).exists()


def test_a_truncated_or_foreign_checkpoint_is_named_on_resume(tmp_path, corpus, teacher):
    """An interrupted copy of the checkpoint (torch raises OSError) or a file holding another
    object (TypeError) is named as --resume's checkpoint, not an internal error."""
    from typer.testing import CliRunner

    from treegraft.cli import app

    path = write_recipe(tmp_path / "r.yaml", corpus, teacher)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    assert CliRunner().invoke(app, [*args, "--max-steps", "1"]).exit_code == 0
    ckpt = tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE
    whole = ckpt.read_bytes()
    torch.save([1, 2], tmp_path / "list.pt")
    for content in (whole[: len(whole) // 2], (tmp_path / "list.pt").read_bytes()):
        ckpt.write_bytes(content)
        result = CliRunner().invoke(app, [*args, "--max-steps", "1", "--resume"])
        assert result.exit_code == 2, result.output
        assert f"--resume: cannot continue from {ckpt}: " in result.stderr, result.stderr
        assert "internal error" not in result.stderr


def test_an_out_that_is_a_file_is_refused_before_training(tmp_path, corpus, teacher):
    """Was: the whole run trained, then `error: FILE: File exists` without naming --out."""
    from typer.testing import CliRunner

    from treegraft.cli import app

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    path = write_recipe(tmp_path / "r.yaml", corpus, teacher)
    args = ["zoo", "train-head", "--recipe", str(path), "--runs", str(tmp_path / "runs")]
    for out in (blocker, blocker / "head"):
        result = CliRunner().invoke(app, [*args, "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert "--out: " in result.stderr and str(out) in result.stderr, result.stderr
        assert not (tmp_path / "runs" / "tiny-head" / CHECKPOINT_FILE).exists()
