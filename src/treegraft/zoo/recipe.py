"""Training recipes of the zoo trainers (`treegraft zoo train`, `train-head`), read strictly.

A recipe is a YAML mapping: malformed YAML, a repeated key, an unknown key, a value of the wrong
type or outside its range, a model shape that does not divide, a run name that is not a plain
folder name, and a model or token-counts reference naming nothing are each a `RecipeError`
naming the file, the field, the value and what was expected, before anything is written.
Problems only the data can show (a corpus shorter than a window) are raised when the run
starts; the command line names the recipe file in front of them (`recipe_errors`).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from treegraft.core.config import Check, ConfigError, at_least, between, field, parse_yaml
from treegraft.core.config import structure_config as _structure_config
from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.inputs import read_text
from treegraft.zoo.corpus import default_corpus_dir

ROOT = "recipe"
#: a run's (and an exported model's) folder name: no separators, no `..`
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class RecipeError(TreegraftError, ValueError):
    """A recipe file does not describe a valid recipe (the message names the field)."""


def positive(*, sane_max: float | None = None) -> Check:
    """A finite value > 0."""
    return Check("> 0", lambda v: math.isfinite(v) and v > 0, sane_max)


#: a finite value >= 0
NON_NEGATIVE = Check(">= 0", lambda v: math.isfinite(v) and v >= 0)
#: a fraction strictly between 0 and 1
OPEN_FRACTION = Check("with 0 < value < 1", lambda v: 0 < v < 1)
STEPS = at_least(1, sane_max=10**9)


@attrs.frozen(kw_only=True)
class ModelSpec:
    """Shape of one Llama-architecture model."""

    hidden_size: int = field(check=at_least(1, sane_max=65536), doc="a multiple of num_heads")
    num_layers: int = field(check=at_least(1, sane_max=1024))
    num_heads: int = field(check=at_least(1, sane_max=1024), doc="a multiple of num_kv_heads")
    num_kv_heads: int = field(check=at_least(1, sane_max=1024))
    intermediate_size: int = field(check=at_least(1, sane_max=262144))
    max_positions: int = field(1024, check=at_least(1, sane_max=1 << 20), doc=">= seq_len")
    #: ``zoo:NAME`` or a model directory of the same width: start from its embeddings, its
    #: first ``num_layers`` decoder layers and its final norm instead of a random init
    init_from: str | None = None


class StepsOfTokens:
    """The optimiser steps of a recipe with `tokens`, `batch_size` and `seq_len` fields."""

    tokens: int
    batch_size: int
    seq_len: int

    @property
    def tokens_per_step(self) -> int:
        """Training tokens per optimiser step."""
        return self.batch_size * self.seq_len

    @property
    def steps(self) -> int:
        """Number of optimiser steps to reach ``tokens``."""
        return math.ceil(self.tokens / self.tokens_per_step)


@attrs.frozen(kw_only=True)
class Recipe(StepsOfTokens):
    """Everything that determines a training run."""

    name: str = field(doc="the run's folder name under --runs")
    models: dict[str, ModelSpec] = field(doc="model names mapped to their shapes")
    tokens: int = field(check=at_least(1, sane_max=10**13), doc="training tokens of the run")
    seed: int = field(0, check=at_least(0))
    corpus: str = attrs.field(factory=lambda: str(default_corpus_dir()))
    tokenizer: str | None = None
    teacher: str | None = None
    kd_weight: float = field(0.0, check=between(0, 1), doc="needs a teacher when > 0")
    kd_temperature: float = field(1.0, check=positive(sane_max=100))
    seq_len: int = field(512, check=at_least(1, sane_max=1 << 20))
    batch_size: int = field(16, check=at_least(1, sane_max=65536))
    lr: float = field(2e-3, check=positive(sane_max=10))
    min_lr_ratio: float = field(0.1, check=between(0, 1))
    warmup_steps: int = field(50, check=at_least(0, sane_max=10**9))
    decay_fraction: float = field(0.25, check=between(0, 1))
    weight_decay: float = field(0.1, check=NON_NEGATIVE)
    grad_clip: float = field(1.0, check=positive())
    valid_fraction: float = field(0.005, check=OPEN_FRACTION)
    valid_batches: int = field(4, check=STEPS)
    eval_every: int = field(200, check=STEPS)
    checkpoint_every: int = field(50, check=STEPS)
    log_every: int = field(10, check=STEPS)


# ---------------------------------------------------------------- reading


def read_recipe_data(path: Path, required: tuple[str, ...]) -> Mapping[str, Any]:
    """The parsed mapping of a recipe file; unreadable text, malformed YAML, a repeated key, an
    empty file or anything but a mapping is a `RecipeError` naming the file."""
    try:
        data = parse_yaml(read_text(Path(path), "--recipe"), str(path))
    except (ArgumentError, ConfigError) as exc:
        raise RecipeError(str(exc)) from None
    keys = ", ".join(required)
    if data is None:
        raise RecipeError(f"{path}: the recipe is empty; expected a mapping with keys {keys}, ...")
    if not isinstance(data, Mapping):
        raise RecipeError(
            f"{path}: expected a mapping with keys {keys}, ..., got a {type(data).__name__} "
            f"({_short(data)})"
        )
    return data


def structure(cls: type, data: Any, source: Path | str, path: str = ROOT) -> Any:
    """`data` as `cls`, strictly (`core.config_fields.structure_config`), errors naming `source`."""
    try:
        return _structure_config(cls, data, path)
    except ConfigError as exc:
        raise RecipeError(f"{source}: {exc}") from None


def load_recipe(path: Path) -> Recipe:
    """Read and check a `treegraft zoo train` recipe file (see the module docstring)."""
    data = read_recipe_data(path, ("name", "models", "tokens"))
    recipe = structure(Recipe, {**data, "models": {}} if "models" in data else data, path)
    recipe = attrs.evolve(recipe, models=_model_specs(data["models"], path))
    check_recipe(recipe, path)
    return recipe


def _model_specs(raw: Any, source: Path) -> dict[str, ModelSpec]:
    where = f"{source}: {ROOT}.models"
    if not isinstance(raw, Mapping) or not raw:
        raise RecipeError(
            f"{where}: expected a non-empty mapping of model names to shapes (hidden_size, "
            f"num_layers, num_heads, num_kv_heads, intermediate_size), got {_short(raw)}"
        )
    specs = {}
    for name, spec in raw.items():
        check_folder_name(name, f"{where}: model name", source)
        specs[name] = structure(ModelSpec, spec, source, f"{ROOT}.models.{name}")
    return specs


def check_recipe(recipe: Recipe, source: Path | str) -> None:
    """The checks across fields: name, model shapes against each other and `seq_len`, the
    teacher against `kd_weight`, and every model reference."""
    check_folder_name(recipe.name, f"{source}: {ROOT}.name", source)
    for name, spec in recipe.models.items():
        where = f"{source}: {ROOT}.models.{name}"
        for big, small in (("hidden_size", "num_heads"), ("num_heads", "num_kv_heads")):
            if getattr(spec, big) % getattr(spec, small):
                raise RecipeError(
                    f"{where}.{big}: expected a multiple of {small} ({getattr(spec, small)}), "
                    f"got {getattr(spec, big)}"
                )
        if recipe.seq_len > spec.max_positions:
            raise RecipeError(
                f"{source}: {ROOT}.seq_len: expected <= models.{name}.max_positions "
                f"({spec.max_positions}), got {recipe.seq_len}"
            )
        check_reference(spec.init_from, f"{where}.init_from", source)
    check_reference(recipe.teacher, f"{source}: {ROOT}.teacher", source)
    if recipe.kd_weight > 0 and recipe.teacher is None:
        raise RecipeError(
            f"{source}: {ROOT}.kd_weight: {recipe.kd_weight} distils from a teacher, but the "
            "recipe names none; add `teacher: zoo:NAME` (or a model folder) or set kd_weight: 0"
        )
    if recipe.teacher is not None and recipe.kd_weight == 0:
        raise RecipeError(
            f"{source}: {ROOT}.teacher: {recipe.teacher!r} is not used with kd_weight 0; set "
            "kd_weight (0 < kd_weight <= 1) or leave the teacher out"
        )
    if recipe.kd_weight == 0 and recipe.kd_temperature != 1.0:
        raise RecipeError(
            f"{source}: {ROOT}.kd_temperature: {recipe.kd_temperature} softens a teacher's "
            "targets, which kd_weight 0 leaves unused; set kd_weight (0 < kd_weight <= 1) with "
            "a teacher, or leave kd_temperature out"
        )
    check_reference(recipe.tokenizer, f"{source}: {ROOT}.tokenizer", source, "tokenizer.json")


def check_folder_name(name: Any, where: str, source: Path | str) -> None:
    """A run or model name is used as a folder name: a plain one, never a path."""
    if not isinstance(name, str) or not FOLDER_NAME.fullmatch(name) or ".." in name:
        raise RecipeError(
            f"{where}: expected a plain folder name (letters, digits, '.', '-', '_'; no '/' or "
            f"'..'), got {name!r}"
        )


def check_reference(ref: str | None, where: str, source: Path | str, file: str = "") -> None:
    """`ref` (when given) is `zoo:NAME` of a known zoo model or a folder holding `file` (default
    a model's `config.json`); nothing is fetched or loaded."""
    from treegraft import zoo

    if ref is None:
        return
    if ref.startswith(zoo.PREFIX):
        try:
            zoo.check_name(ref)
        except zoo.UnknownZooModelError as exc:
            raise RecipeError(f"{where}: {exc}") from None
        return
    want = file or "config.json"
    if not (Path(ref).expanduser() / want).is_file():
        raise RecipeError(
            f"{where}: expected 'zoo:NAME' or a folder holding {want}, got {ref!r} "
            f"({'no ' + want + ' there' if Path(ref).expanduser().is_dir() else 'no such folder'})"
        )


def check_windows(train: int, valid: int, *, seq_len: int, valid_fraction: float) -> None:
    """The corpus's training and validation streams (`train`, `valid` tokens) hold a window of
    `seq_len + 1` tokens (a batch is random windows)."""
    need = seq_len + 2
    if train < need or valid < need:
        raise RecipeError(
            f"{ROOT}.seq_len: {seq_len} needs at least {need} tokens in both the training and the "
            f"validation part of the corpus; it has {train} and {valid} (valid_fraction "
            f"{valid_fraction}); use a smaller seq_len, a larger valid_fraction or a larger corpus"
        )


@contextlib.contextmanager
def recipe_errors(source: Path) -> Iterator[None]:
    """Name the recipe file in front of a `RecipeError` raised during a run (a check only the
    data or the loaded models can make)."""
    try:
        yield
    except RecipeError as exc:
        if str(exc).startswith(f"{source}:"):
            raise
        raise RecipeError(f"{source}: {exc}") from None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
