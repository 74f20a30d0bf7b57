"""Tests for the zoo trainer (treegraft/zoo/train.py) on a tiny corpus and tiny models."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import attrs
import numpy as np
import pytest
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from treegraft.core.errors import ArgumentError
from treegraft.zoo import ZOO_DIR
from treegraft.zoo.corpus import CorpusConfig, build_corpus
from treegraft.zoo.recipe import RecipeError, load_recipe
from treegraft.zoo.train import CHECKPOINT_FILE, TRAINING_FILE, export_run, lr_at, train

TINY_MODEL = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 64,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tiny_config: CorpusConfig) -> Path:
    out = tmp_path_factory.mktemp("train-corpus")
    build_corpus(tiny_config, out)
    return out


def write_recipe(path: Path, corpus: Path, **overrides: object) -> Path:
    """A 6-step recipe for a 1-layer model on the tiny corpus."""
    recipe = {
        "name": "tiny",
        "models": {"m": TINY_MODEL},
        "tokens": 6 * 2 * 32,
        "corpus": str(corpus),
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


def weights(run: Path, name: str = "m") -> dict:
    return load_file(str(run / "export" / name / "model.safetensors"))


def test_resumed_run_equals_uninterrupted_run(tmp_path: Path, corpus: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", corpus))
    train(recipe, runs=tmp_path / "straight")
    first = train(recipe, runs=tmp_path / "resumed", max_steps=3)
    assert first.step == 3 and (tmp_path / "resumed" / "tiny" / CHECKPOINT_FILE).exists()
    assert not (tmp_path / "resumed" / "tiny" / "export").exists()
    second = train(recipe, runs=tmp_path / "resumed", resume=True)
    assert second.step == 6
    a, b = weights(tmp_path / "straight" / "tiny"), weights(tmp_path / "resumed" / "tiny")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    log = (tmp_path / "resumed" / "tiny" / "train.log").read_text()
    assert "resumed tiny at step 3" in log and "step 6/6" in log
    # a finished run started again without --resume is refused, its checkpoint kept
    before = (tmp_path / "resumed" / "tiny" / CHECKPOINT_FILE).read_bytes()
    with pytest.raises(ArgumentError, match=r"^--resume: .* holds an earlier run's checkpoint"):
        train(recipe, runs=tmp_path / "resumed", max_steps=1)
    assert (tmp_path / "resumed" / "tiny" / CHECKPOINT_FILE).read_bytes() == before


def test_export_is_loadable_with_tokenizer_and_record(tmp_path: Path, corpus: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", corpus))
    train(recipe, runs=tmp_path)
    out = tmp_path / "tiny" / "export" / "m"
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.num_hidden_layers == 1
    assert (out / "tokenizer.json").read_bytes() == (
        ZOO_DIR / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    record = json.loads((out / TRAINING_FILE).read_text())
    assert record["tokens"] == 6 * 64 and record["steps"] == 6 and record["valid_loss"] > 0


def test_distillation_and_partial_export(tmp_path: Path, corpus: Path) -> None:
    teacher_recipe = load_recipe(write_recipe(tmp_path / "t.yaml", corpus))
    train(teacher_recipe, runs=tmp_path)
    teacher = tmp_path / "tiny" / "export" / "m"
    students = {"a": TINY_MODEL, "b": {**TINY_MODEL, "hidden_size": 16}}
    path = write_recipe(
        tmp_path / "s.yaml", corpus, name="kd", models=students, teacher=str(teacher), kd_weight=0.5
    )
    recipe = load_recipe(path)
    state = train(recipe, runs=tmp_path, max_steps=3)
    assert set(state.last_losses) == {"a", "b"}
    paths = export_run(recipe, tmp_path / "partial", runs=tmp_path)
    assert [p.name for p in paths] == ["a", "b"]
    record = json.loads((tmp_path / "partial" / "b" / TRAINING_FILE).read_text())
    assert (
        record["teacher"] == str(teacher) and record["tokens"] == 3 * 64 < record["planned_tokens"]
    )


def test_recipe_rejects_unknown_keys(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(
        RecipeError, match=r"recipe.learning_rate: unknown key; expected keys: .* lr,"
    ):
        load_recipe(write_recipe(tmp_path / "r.yaml", corpus, learning_rate=1.0))


def test_shipped_recipes_parse() -> None:
    recipes = {p.stem: load_recipe(p) for p in (ZOO_DIR / "recipes").glob("*.yaml")}
    assert {"target", "drafters", "draft-l"} <= set(recipes)
    assert recipes["drafters"].teacher == recipes["draft-l"].teacher == "zoo:target"
    assert recipes["draft-l"].models["draft-l"].init_from == "zoo:target"


def test_wsd_schedule(tmp_path: Path, corpus: Path) -> None:
    recipe = load_recipe(
        write_recipe(tmp_path / "r.yaml", corpus, tokens=100 * 64, warmup_steps=10)
    )
    lrs = [lr_at(s, recipe) for s in range(recipe.steps)]
    assert lrs[0] < lrs[9] == recipe.lr == lrs[74]
    assert all(a >= b for a, b in itertools.pairwise(lrs[75:]))
    assert lrs[-1] == pytest.approx(
        recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) / 25)
    )


def test_cli_train_then_export(tmp_path: Path, corpus: Path) -> None:
    from typer.testing import CliRunner

    from treegraft.zoo.cli import app

    recipe = write_recipe(tmp_path / "r.yaml", corpus)
    runner = CliRunner()
    args = ["--recipe", str(recipe), "--runs", str(tmp_path / "runs")]
    result = runner.invoke(app, ["train", *args, "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["export", *args, "--dest", str(tmp_path / "models")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "models" / "m" / "model.safetensors").is_file()


def test_export_names_a_dest_file_and_a_damaged_checkpoint(tmp_path: Path, corpus: Path) -> None:
    from typer.testing import CliRunner

    from treegraft.cli import app

    recipe = write_recipe(tmp_path / "r.yaml", corpus)
    args = ["zoo", "export", "--recipe", str(recipe), "--runs", str(tmp_path / "runs")]
    train(load_recipe(recipe), runs=tmp_path / "runs", max_steps=1)
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(app, [*args, "--dest", str(tmp_path / "afile")])
    assert result.exit_code == 2, result.output
    assert f"--dest: {tmp_path / 'afile'} is a file; expected a directory" in result.stderr
    ckpt = tmp_path / "runs" / "tiny" / CHECKPOINT_FILE
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # truncated
    result = CliRunner().invoke(app, [*args, "--dest", str(tmp_path / "models")])
    assert result.exit_code == 2 and "internal error" not in result.stderr, result.output
    assert f"export: cannot continue from {ckpt}: " in result.stderr


def test_token_cache_follows_the_corpus(tmp_path: Path, tiny_config: CorpusConfig) -> None:
    from treegraft.zoo.corpus import CORPUS_FILE
    from treegraft.zoo.train import load_tokens

    tok_dir = ZOO_DIR / "tokenizer"
    build_corpus(tiny_config, tmp_path)
    first = np.asarray(load_tokens(tmp_path, tok_dir))
    assert np.array_equal(np.asarray(load_tokens(tmp_path, tok_dir)), first)  # cached
    # a rebuilt corpus with other content must be tokenized again, not read from the old cache
    corpus = tmp_path / CORPUS_FILE
    corpus.write_text(corpus.read_text().replace("multiplied", "divided"))
    second = np.asarray(load_tokens(tmp_path, tok_dir))
    assert len(list(tmp_path.glob("tokens-*.npy"))) == 2
    assert not np.array_equal(second, first)


def test_init_from_a_truncated_model(tmp_path: Path, corpus: Path) -> None:
    from treegraft.zoo.train import build_model, tokenizer_dir

    two = {**TINY_MODEL, "num_layers": 2}
    train(load_recipe(write_recipe(tmp_path / "t.yaml", corpus, models={"m": two})), runs=tmp_path)
    source_dir = tmp_path / "tiny" / "export" / "m"
    source = AutoModelForCausalLM.from_pretrained(str(source_dir)).state_dict()
    recipe = load_recipe(write_recipe(tmp_path / "s.yaml", corpus))
    spec = attrs.evolve(recipe.models["m"], init_from=str(source_dir))
    student = build_model(spec, tokenizer_dir(recipe), seed=5).state_dict()
    assert student["model.layers.0.mlp.up_proj.weight"].equal(
        source["model.layers.0.mlp.up_proj.weight"]
    )
    assert student["model.embed_tokens.weight"].equal(source["model.embed_tokens.weight"])
    assert student["model.norm.weight"].equal(source["model.norm.weight"])
    assert not any(k.startswith("model.layers.1.") for k in student)
    fresh = build_model(recipe.models["m"], tokenizer_dir(recipe), seed=5).state_dict()
    assert not fresh["model.layers.0.mlp.up_proj.weight"].equal(
        source["model.layers.0.mlp.up_proj.weight"]
    )
    # only the number of layers may differ, and only downwards
    with pytest.raises(RecipeError, match="hidden_size is 32 there, 16 here"):
        build_model(attrs.evolve(spec, hidden_size=16), tokenizer_dir(recipe), seed=5)
    with pytest.raises(RecipeError, match=r"has 2 layers .* need at least 3 layers"):
        build_model(attrs.evolve(spec, num_layers=3), tokenizer_dir(recipe), seed=5)
