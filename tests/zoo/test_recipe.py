"""Training recipes read strictly (treegraft/zoo/recipe.py): every mistake a `RecipeError` naming
the file, the field, the value and what was expected; on the command line exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.test_cli import wide_consoles  # noqa: F401
from tests.zoo.test_train import TINY_MODEL, corpus, write_recipe  # noqa: F401
from treegraft.cli import app
from treegraft.zoo import ZOO_DIR
from treegraft.zoo.recipe import RecipeError, check_windows, load_recipe

CORPUS = Path("/nonexistent-corpus")  # never read: these recipes fail before any data


def text_recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: p\nmodels: {m: [\n", r"r.yaml: malformed YAML at line 3, column 1"),
        ("name: p\ntokens: 1\ntokens: 2\n", r"r.yaml: duplicate key 'tokens' at line 3 \(first"),
        ("- a\n- b\n", r"r.yaml: expected a mapping with keys name, models, tokens, .*got a list"),
        ("", r"r.yaml: the recipe is empty; expected a mapping with keys name, models, tokens"),
        ("name: p\ntokens: 1\n", r"r.yaml: recipe.models: missing required key"),
    ],
    ids=["malformed", "duplicate-key", "list", "empty", "no-models"],
)
def test_recipe_file_errors_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load_recipe(text_recipe(tmp_path, text))


def test_a_recipe_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"name: p\xff\n")
    with pytest.raises(RecipeError, match=r"r.yaml is not UTF-8 text: byte 0xff at offset 7"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 0}, r"recipe.batch_size: expected int >= 1, got 0"),
        ({"lr": -1}, r"recipe.lr: expected float > 0, got -1"),
        ({"tokens": -5}, r"recipe.tokens: expected int >= 1, got -5"),
        ({"valid_fraction": 1.0}, r"recipe.valid_fraction: expected float with 0 < value < 1"),
        ({"eval_every": 0}, r"recipe.eval_every: expected int >= 1, got 0"),
        ({"seed": -1}, r"recipe.seed: expected int >= 0, got -1"),
        ({"models": {}}, r"recipe.models: expected a non-empty mapping of model names .* got \{\}"),
        (
            {"models": {"m": {**TINY_MODEL, "hidden_size": 30, "num_heads": 4}}},
            r"recipe.models.m.hidden_size: expected a multiple of num_heads \(4\), got 30",
        ),
        (
            {"models": {"m": {**TINY_MODEL, "num_heads": 2, "num_kv_heads": 3}}},
            r"recipe.models.m.num_heads: expected a multiple of num_kv_heads \(3\), got 2",
        ),
        (
            {"models": {"m": {**TINY_MODEL, "num_layers": 0}}},
            r"recipe.models.m.num_layers: expected int >= 1, got 0",
        ),
        (
            {"seq_len": 100000},
            r"recipe.seq_len: expected <= models.m.max_positions \(1024\), got 100000",
        ),
        ({"teacher": "zoo:nosuch", "kd_weight": 0.5}, r"recipe.teacher: unknown zoo model"),
        ({"teacher": "/no/such/model", "kd_weight": 0.5}, r"recipe.teacher: expected 'zoo:NAME'"),
        ({"kd_weight": 0.5}, r"recipe.kd_weight: 0.5 distils from a teacher, but .* names none"),
        ({"teacher": "zoo:target"}, r"recipe.teacher: 'zoo:target' is not used with kd_weight 0"),
        (  # silently unused: no teacher's targets to soften
            {"kd_temperature": 2.0},
            r"recipe.kd_temperature: 2.0 softens a teacher's targets, which kd_weight 0 leaves",
        ),
        (
            {"models": {"m": {**TINY_MODEL, "init_from": "zoo:nosuch"}}},
            r"recipe.models.m.init_from: unknown zoo model 'zoo:nosuch'",
        ),
        ({"tokenizer": "/no/such/dir"}, r"recipe.tokenizer: expected 'zoo:NAME' or a folder"),
        ({"name": "../escape"}, r"recipe.name: expected a plain folder name .* got '../escape'"),
        ({"name": "a/b"}, r"recipe.name: expected a plain folder name"),
        ({"models": {"../m": TINY_MODEL}}, r"recipe.models: model name: expected a plain folder"),
        (
            {"learning_rate": 1.0},
            r"recipe.learning_rate: unknown key; expected keys: name, models, tokens",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)),
)
def test_recipe_field_errors_name_file_field_value(tmp_path, overrides, message) -> None:
    path = write_recipe(tmp_path / "r.yaml", CORPUS, **overrides)
    with pytest.raises(RecipeError, match=rf"^{tmp_path / 'r.yaml'}: {message}"):
        load_recipe(path)


def test_shipped_recipes_pass_the_checks() -> None:
    for path in (ZOO_DIR / "recipes").glob("*.yaml"):
        assert load_recipe(path).steps >= 1


def test_a_window_longer_than_the_corpus_is_a_recipe_error() -> None:
    with pytest.raises(RecipeError, match=r"recipe.seq_len: 500 needs at least 502 tokens .*"):
        check_windows(10_000, 300, seq_len=500, valid_fraction=0.005)
    check_windows(502, 502, seq_len=500, valid_fraction=0.005)


def run_cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stderr


def test_cli_train_refuses_a_bad_recipe_with_exit_2(tmp_path: Path) -> None:
    path = write_recipe(tmp_path / "r.yaml", CORPUS, name="../escape", batch_size=0)
    code, err = run_cli("zoo", "train", "--recipe", str(path), "--runs", str(tmp_path / "runs"))
    assert code == 2 and f"{path}: recipe.batch_size: expected int >= 1, got 0" in err, err
    assert "internal error" not in err and not (tmp_path / "runs").exists()
    assert not (tmp_path / "escape").exists()
    bad = text_recipe(tmp_path, yaml.safe_dump(["a", "b"]))
    code, err = run_cli("zoo", "train", "--recipe", str(bad))
    assert code == 2 and "expected a mapping with keys name, models, tokens" in err, err


def test_cli_train_names_the_recipe_for_a_window_the_corpus_cannot_fill(
    tmp_path: Path,
    corpus: Path,  # noqa: F811
) -> None:
    model = {**TINY_MODEL, "max_positions": 1 << 20}
    path = write_recipe(tmp_path / "r.yaml", corpus, models={"m": model}, seq_len=100000)
    code, err = run_cli("zoo", "train", "--recipe", str(path), "--runs", str(tmp_path / "runs"))
    assert code == 2, err
    assert f"{path}: recipe.seq_len: 100000 needs at least 100002 tokens" in err, err


@pytest.mark.parametrize("command", ["train", "train-head"])
def test_cli_train_names_a_runs_folder_that_cannot_be_made(tmp_path: Path, command: str) -> None:
    """`--runs` under a file was 'RUNS/NAME: Not a directory' once the corpus had loaded."""
    path = write_recipe(tmp_path / "r.yaml", CORPUS)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = run_cli("zoo", command, "--recipe", str(path), "--runs", str(blocker / "runs"))
    assert code == 2, err
    assert f"--runs: cannot create {blocker / 'runs'}: {blocker} is a file" in err, err


def test_cli_export_without_a_checkpoint_says_to_train_first(
    tmp_path: Path,
    corpus: Path,  # noqa: F811
) -> None:
    path = write_recipe(tmp_path / "r.yaml", corpus)
    runs = tmp_path / "runs"
    code, err = run_cli("zoo", "export", "--recipe", str(path), "--runs", str(runs))
    assert code == 2 and "rerun with --debug" not in err, err
    want = f"{path}: no checkpoint of recipe 'tiny' to export: {runs / 'tiny' / 'checkpoint.pt'}"
    assert want in err and f"treegraft zoo train --recipe ... --runs {runs}" in err, err


def test_the_default_corpus_and_runs_follow_the_cache_setting(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    corpus: Path,  # noqa: F811
) -> None:
    """`TREEGRAFT_CACHE` moves every default of the zoo tools (the models, datastores and deltas
    moved; the corpus and the run folders stayed in ~/.cache/treegraft)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TREEGRAFT_CACHE", str(cache))
    path = text_recipe(
        tmp_path, yaml.safe_dump({"name": "p", "models": {"m": TINY_MODEL}, "tokens": 1})
    )
    assert load_recipe(path).corpus == str(cache / "corpus")
    path = write_recipe(tmp_path / "r.yaml", corpus)
    code, err = run_cli("zoo", "export", "--recipe", str(path))
    assert code == 2 and str(cache / "zoo-runs" / "tiny" / "checkpoint.pt") in err, err
    code, err = run_cli("zoo", "token-counts")
    assert code == 2 and f"--corpus: {cache / 'corpus'} holds no corpus.jsonl" in err, err
