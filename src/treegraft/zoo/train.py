"""Seeded, resumable CPU trainer for the zoo models (pre-training and distillation).

A recipe (YAML, see ``recipes/``) names one or more models that are trained side by side on the
same batches. With a ``teacher`` every model is distilled from it (KL to the teacher's
distribution, mixed with the usual next-token loss), sharing one teacher forward per batch.
The batch at step ``s`` depends only on ``(seed, s)``, so a resumed run sees the same data as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import pickle
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from treegraft.zoo import formats
from treegraft.zoo.corpus import CORPUS_FILE, read_corpus
from treegraft.zoo.recipe import ModelSpec, Recipe, RecipeError, check_windows
from treegraft.zoo.tokenizer import batched

log = logging.getLogger("treegraft.zoo.train")


def default_runs_dir() -> Path:
    """`<cache>/zoo-runs` (the cache: `treegraft.zoo.remote.cache_dir`, read at the call)."""
    from treegraft.zoo.remote import cache_dir

    return cache_dir() / "zoo-runs"


CHECKPOINT_FILE = "checkpoint.pt"
TRAINING_FILE = "training.json"
VALID_SEED = 2**32 - 1  # seed of the fixed validation windows
VALID_BATCH_SIZE = 16


@attrs.define
class TrainState:
    """The mutable state of a run: models, optimisers and counters."""

    models: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    step: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    last_losses: dict[str, float] = attrs.Factory(dict)
    valid_losses: dict[str, float] = attrs.Factory(dict)


# ---------------------------------------------------------------- data


def tokenizer_dir(recipe: Recipe) -> Path:
    """The tokenizer a recipe trains with: a folder, a model's (`zoo:smollm2`, fetched if needed),
    or by default the packaged zoo tokenizer."""
    from treegraft.core.resources import resolve_model_path
    from treegraft.zoo import PREFIX, tokenizer_path

    if recipe.tokenizer and recipe.tokenizer.startswith(PREFIX):
        return resolve_model_path(recipe.tokenizer)
    return Path(recipe.tokenizer).expanduser() if recipe.tokenizer else tokenizer_path()


def load_tokens(corpus: Path, tok_dir: Path) -> np.ndarray:
    """The corpus as one uint16 token stream (documents joined by EOS), cached next to it.

    The cache is keyed by both the tokenizer and the corpus file, so a rebuilt corpus is
    tokenized again. A folder without the corpus file is a `RecipeError` naming `corpus`.
    """
    from transformers import AutoTokenizer

    if not (corpus / CORPUS_FILE).is_file():
        raise RecipeError(
            f"recipe.corpus: {corpus} holds no {CORPUS_FILE}; expected a corpus folder: build "
            f"one with `treegraft zoo build-corpus --out {corpus}`"
        )

    digest = hashlib.sha256()
    digest.update((tok_dir / "tokenizer.json").read_bytes())
    with (corpus / CORPUS_FILE).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    cache = corpus / f"tokens-{digest.hexdigest()[:12]}.npy"
    if cache.exists():
        return np.load(cache, mmap_mode="r")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    eos = tok.convert_tokens_to_ids(formats.EOS)
    parts = []
    for texts in batched(d.text for d in read_corpus(corpus)):
        for ids in tok(texts, add_special_tokens=False)["input_ids"]:
            parts.append(np.asarray([*ids, eos], dtype=np.uint16))
    tokens = np.concatenate(parts)
    np.save(cache, tokens)
    return tokens


def split_tokens(tokens: np.ndarray, valid_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, valid) token streams; the validation stream is the tail of the corpus."""
    cut = int(len(tokens) * (1.0 - valid_fraction))
    return tokens[:cut], tokens[cut:]


def batch_at(
    tokens: np.ndarray, step: int, *, seed: int, batch_size: int, seq_len: int
) -> torch.Tensor:
    """The batch of step ``step``: ``batch_size`` random windows of ``seq_len + 1`` tokens."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
    rows = np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(rows)  # [batch, seq_len + 1]


# ---------------------------------------------------------------- models


def build_model(spec: ModelSpec, tok_dir: Path, seed: int) -> torch.nn.Module:
    """A freshly initialised ``LlamaForCausalLM`` of shape ``spec`` for the zoo tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    eos = tok.convert_tokens_to_ids(formats.EOS)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tok.convert_tokens_to_ids(formats.PAD),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    if spec.init_from:
        init_from_truncated(model, spec.init_from)
    return model


def init_from_truncated(model: torch.nn.Module, ref: str) -> None:
    """Copy embeddings, the first layers and the final norm of ``ref`` into ``model``.

    The shapes must match except for the number of layers, which may only be smaller (a
    layer-truncated copy of the target is a drafter that starts out aligned with it).
    """
    source = load_teacher(ref)
    src, dst = source.config, model.config
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if getattr(src, key) != getattr(dst, key):
            raise RecipeError(
                f"init_from {ref!r}: {key} is {getattr(src, key)} there, {getattr(dst, key)} here;"
                " only num_layers may differ"
            )
    if dst.num_hidden_layers > src.num_hidden_layers or src.vocab_size != dst.vocab_size:
        raise RecipeError(
            f"init_from {ref!r}: has {src.num_hidden_layers} layers and vocabulary"
            f" {src.vocab_size}; need at least {dst.num_hidden_layers} layers and vocabulary"
            f" {dst.vocab_size}"
        )
    wanted = model.state_dict()
    state = {k: v for k, v in source.state_dict().items() if k in wanted}
    missing = set(wanted) - set(state) - {"lm_head.weight"}  # tied to the embeddings
    if missing:
        raise RecipeError(f"init_from {ref!r}: no weights for {sorted(missing)[:4]}")
    model.load_state_dict(state, strict=False)


def load_teacher(ref: str) -> torch.nn.Module:
    """The frozen teacher: a zoo reference (``zoo:NAME``) or a model directory."""
    from transformers import AutoModelForCausalLM

    from treegraft.zoo import resolve

    path = resolve(ref) if ref.startswith("zoo:") else Path(ref).expanduser()
    teacher = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    teacher.config._attn_implementation = "sdpa"
    return teacher.eval().requires_grad_(False)


def parameter_count(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": recipe.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, 0.95))


def lr_at(step: int, recipe: Recipe) -> float:
    """Warm-up, stable, decay ("WSD"): linear warm-up, constant ``lr``, then a linear decay to
    ``min_lr_ratio * lr`` over the last ``decay_fraction`` of the steps.

    Until the decay starts the schedule does not depend on the run length, so ``tokens`` can be
    changed while a run is in its stable phase and the run resumed.
    """
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    decay_start = int(recipe.steps * (1.0 - recipe.decay_fraction))
    if step < decay_start:
        return recipe.lr
    progress = min(1.0, (step - decay_start) / max(1, recipe.steps - decay_start))
    return recipe.lr * (1.0 - (1.0 - recipe.min_lr_ratio) * progress)


# ---------------------------------------------------------------- losses and steps


def logits_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Next-token logits under bf16 autocast.  # [batch, seq, vocab]"""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=inputs).logits


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def teacher_log_probs(
    teacher: torch.nn.Module, inputs: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The teacher's log-distribution at ``temperature``, computed once per batch.  # [tokens, vocab]"""
    with torch.no_grad():
        return F.log_softmax(logits_of(teacher, inputs).float().flatten(0, 1) / temperature, dim=-1)


def kd_loss(student: torch.Tensor, teacher_logp: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) at ``temperature``, scaled by ``temperature**2``, mean per token."""
    s = F.log_softmax(student.float().flatten(0, 1) / temperature, dim=-1)
    return F.kl_div(s, teacher_logp, log_target=True, reduction="batchmean") * temperature**2


def train_step(
    state: TrainState, batch: torch.Tensor, recipe: Recipe, teacher: torch.nn.Module | None
) -> dict[str, float]:
    """One optimiser step for every model on ``batch``; returns the next-token loss per model."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    teacher_logp = (
        None if teacher is None else teacher_log_probs(teacher, inputs, recipe.kd_temperature)
    )
    lr = lr_at(state.step, recipe)
    losses = {}
    for name, model in state.models.items():
        logits = logits_of(model, inputs)
        loss = lm_loss(logits, targets)
        total = loss
        if teacher_logp is not None:
            kd = kd_loss(logits, teacher_logp, recipe.kd_temperature)
            total = recipe.kd_weight * kd + (1 - recipe.kd_weight) * loss
        _apply(state.optimizers[name], model, total, lr, recipe.grad_clip)
        losses[name] = float(loss.detach())
    return losses


def _apply(
    opt: torch.optim.Optimizer, model: torch.nn.Module, loss: torch.Tensor, lr: float, clip: float
) -> float:
    """Backward, clip, step and zero the gradients; returns the loss value (synchronises)."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def evaluate(
    models: dict[str, torch.nn.Module], valid: np.ndarray, recipe: Recipe
) -> dict[str, float]:
    """Mean next-token loss of each model on fixed validation windows.

    The windows depend only on ``valid_batches`` and ``seq_len`` (batches of
    :data:`VALID_BATCH_SIZE`), so runs with different training batch sizes stay comparable.
    """
    out = {}
    for name, model in models.items():
        model.eval()
        total = 0.0
        for i in range(recipe.valid_batches):
            batch = batch_at(
                valid, i, seed=VALID_SEED, batch_size=VALID_BATCH_SIZE, seq_len=recipe.seq_len
            )
            total += float(lm_loss(logits_of(model, batch[:, :-1]), batch[:, 1:]))
        out[name] = total / recipe.valid_batches
        model.train()
    return out


# ---------------------------------------------------------------- checkpoints and export


def run_dir(recipe: Recipe, runs: Path | None = None) -> Path:
    """Where a recipe's checkpoints, logs and exports live (`runs`: `default_runs_dir()`)."""
    return (runs or default_runs_dir()) / recipe.name


def check_fresh_start(ckpt: Path, resume: bool) -> None:
    """A run started without `--resume` over an earlier run's checkpoint would overwrite it
    from step 0: an `ArgumentError` instead, before anything is written."""
    from treegraft.core.errors import ArgumentError

    if ckpt.exists() and not resume:
        raise ArgumentError(
            f"--resume: {ckpt.parent} holds an earlier run's checkpoint ({ckpt.name}); pass "
            "--resume to continue it, or delete that folder (or choose another --runs) to "
            "start over"
        )


@contextlib.contextmanager
def resume_errors(ckpt: Path, what: str = "--resume") -> Iterator[None]:
    """A checkpoint `--resume` (or `what`) cannot load (written for other model sizes, or
    damaged) is an `ArgumentError` naming it, not a raw loading error."""
    from treegraft.core.errors import ArgumentError

    try:
        yield
    except (
        RuntimeError,
        KeyError,
        ValueError,
        EOFError,
        pickle.UnpicklingError,
        OSError,
        TypeError,
        IndexError,
        AttributeError,
    ) as exc:  # OSError: an interrupted copy; TypeError: a file holding another object
        reason = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
        reason = reason or (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ArgumentError(
            f"{what}: cannot continue from {ckpt}: {reason}; it was written by a recipe with "
            f"other model settings, or is damaged: restore that recipe, or delete {ckpt.parent} "
            "to start over"
        ) from None


def save_checkpoint(state: TrainState, path: Path) -> None:
    """Atomically write models, optimisers and counters to ``path``."""
    payload = {
        "models": {k: m.state_dict() for k, m in state.models.items()},
        "optimizers": {k: o.state_dict() for k, o in state.optimizers.items()},
        "counters": {
            "step": state.step,
            "cpu_seconds": state.cpu_seconds,
            "wall_seconds": state.wall_seconds,
        },
        "valid_losses": state.valid_losses,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def load_checkpoint(state: TrainState, path: Path) -> None:
    """Restore ``state`` in place from a checkpoint written by :func:`save_checkpoint`."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    for name, model in state.models.items():
        model.load_state_dict(payload["models"][name])
        state.optimizers[name].load_state_dict(payload["optimizers"][name])
    counters = payload["counters"]
    state.step = int(counters["step"])
    state.cpu_seconds = float(counters["cpu_seconds"])
    state.wall_seconds = float(counters["wall_seconds"])
    state.valid_losses = dict(payload.get("valid_losses", {}))


def export_models(state: TrainState, recipe: Recipe, out: Path) -> list[Path]:
    """Save every model in Hugging Face format (bf16 safetensors + tokenizer + training.json)."""
    tok_dir = tokenizer_dir(recipe)
    paths = []
    for name, model in state.models.items():
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(dest)
        model.to(torch.float32)
        for f in tok_dir.iterdir():
            if f.is_file():
                shutil.copy2(f, dest / f.name)
        (dest / TRAINING_FILE).write_text(
            json.dumps(_training_record(state, recipe, name), indent=2) + "\n"
        )
        paths.append(dest)
    return paths


def _training_record(state: TrainState, recipe: Recipe, name: str) -> dict[str, Any]:
    """What the zoo card reports about how a model was trained."""
    return {
        "recipe": recipe.name,
        "parameters": parameter_count(state.models[name]),
        "steps": state.step,
        "tokens": state.step * recipe.tokens_per_step,
        "planned_tokens": recipe.steps * recipe.tokens_per_step,
        "seq_len": recipe.seq_len,
        "teacher": recipe.teacher,
        "cpu_seconds": round(state.cpu_seconds, 1),
        "wall_seconds": round(state.wall_seconds, 1),
        "valid_loss": state.valid_losses.get(name),
        "spec": attrs.asdict(recipe.models[name]),
    }


# ---------------------------------------------------------------- the run


def prepare(recipe: Recipe) -> tuple[TrainState, np.ndarray, np.ndarray]:
    """Fresh models and optimisers plus the (train, valid) token streams of a recipe."""
    tok_dir = tokenizer_dir(recipe)
    tokens = load_tokens(Path(recipe.corpus).expanduser(), tok_dir)
    train, valid = split_tokens(tokens, recipe.valid_fraction)
    check_windows(
        len(train), len(valid), seq_len=recipe.seq_len, valid_fraction=recipe.valid_fraction
    )
    models = {
        name: build_model(spec, tok_dir, recipe.seed + i)
        for i, (name, spec) in enumerate(recipe.models.items())
    }
    optimizers = {name: make_optimizer(m, recipe) for name, m in models.items()}
    return TrainState(models, optimizers), train, valid


def setup_logging(path: Path, logger: logging.Logger = log) -> None:
    """Send ``logger``'s records (default: this module's) to ``path``, appending (resumes)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def training_progress():
    """A Rich progress bar with loss and tokens/s fields."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(),
    )


def train(
    recipe: Recipe,
    *,
    resume: bool = False,
    runs: Path | None = None,
    max_steps: int | None = None,
) -> TrainState:
    """Run (or resume) a recipe to its end, checkpointing along the way, then export it.

    ``max_steps`` stops early after that many steps of this call (for tests and time budgets);
    the run stays resumable and is exported only when it reaches ``recipe.steps``.
    """
    out = run_dir(recipe, runs)
    ckpt = out / CHECKPOINT_FILE
    check_fresh_start(ckpt, resume)
    out.mkdir(parents=True, exist_ok=True)
    setup_logging(out / "train.log")
    torch.manual_seed(recipe.seed)
    state, train_tokens, valid_tokens = prepare(recipe)
    if resume and ckpt.exists():
        with resume_errors(ckpt):
            load_checkpoint(state, ckpt)
        log.info("resumed %s at step %d", recipe.name, state.step)
    teacher = load_teacher(recipe.teacher) if recipe.teacher else None
    params = {k: parameter_count(m) for k, m in state.models.items()}
    log.info(
        "recipe %s: %d steps of %d tokens, params %s",
        recipe.name,
        recipe.steps,
        recipe.tokens_per_step,
        params,
    )
    try:
        _loop(state, recipe, train_tokens, valid_tokens, teacher, ckpt, max_steps)
    finally:
        save_checkpoint(state, ckpt)  # also on Ctrl-C: the run stays resumable
    if state.step >= recipe.steps:
        state.valid_losses = evaluate(state.models, valid_tokens, recipe)
        save_checkpoint(state, ckpt)
        paths = export_models(state, recipe, out / "export")
        log.info("done: valid %s, exported %s", state.valid_losses, [str(p) for p in paths])
    return state


def _loop(
    state: TrainState,
    recipe: Recipe,
    train_tokens: np.ndarray,
    valid_tokens: np.ndarray,
    teacher: torch.nn.Module | None,
    ckpt: Path,
    max_steps: int | None,
) -> None:
    """The step loop with progress bar, periodic logging, evaluation and checkpoints."""
    stop = recipe.steps if max_steps is None else min(recipe.steps, state.step + max_steps)
    with training_progress() as bar:
        task = bar.add_task(
            recipe.name, total=recipe.steps, completed=state.step, loss="-", tps=0.0
        )
        while state.step < stop:
            wall, cpu = time.perf_counter(), time.process_time()
            batch = batch_at(
                train_tokens,
                state.step,
                seed=recipe.seed,
                batch_size=recipe.batch_size,
                seq_len=recipe.seq_len,
            )
            state.last_losses = train_step(state, batch, recipe, teacher)
            state.step += 1
            dt = time.perf_counter() - wall
            state.wall_seconds += dt
            state.cpu_seconds += time.process_time() - cpu
            loss_text = " ".join(f"{v:.3f}" for v in state.last_losses.values())
            bar.update(task, completed=state.step, loss=loss_text, tps=recipe.tokens_per_step / dt)
            _periodic(state, recipe, valid_tokens, ckpt, dt)


def _periodic(
    state: TrainState, recipe: Recipe, valid_tokens: np.ndarray, ckpt: Path, dt: float
) -> None:
    """Log, evaluate and checkpoint at their configured intervals."""
    if state.step % recipe.log_every == 0:
        log.info(
            "step %d/%d tokens %d loss %s lr %.2e tok/s %.0f",
            state.step, recipe.steps, state.step * recipe.tokens_per_step,
            {k: round(v, 4) for k, v in state.last_losses.items()}, lr_at(state.step - 1, recipe),
            recipe.tokens_per_step / dt,
        )  # fmt: skip
    if state.step % recipe.eval_every == 0:
        state.valid_losses = evaluate(state.models, valid_tokens, recipe)
        log.info(
            "step %d valid %s", state.step, {k: round(v, 4) for k, v in state.valid_losses.items()}
        )
    if state.step % recipe.checkpoint_every == 0 or state.step == recipe.steps:
        save_checkpoint(state, ckpt)


def export_run(recipe: Recipe, dest: Path, *, runs: Path | None = None) -> list[Path]:
    """Export a run's latest checkpoint (finished or not) to ``dest`` in Hugging Face format."""
    runs = runs or default_runs_dir()
    ckpt = run_dir(recipe, runs) / CHECKPOINT_FILE
    if not ckpt.is_file():
        raise RecipeError(
            f"no checkpoint of recipe {recipe.name!r} to export: {ckpt} does not exist; train "
            f"this recipe first (`treegraft zoo train --recipe ... --runs {runs}`)"
        )
    state, _, valid = prepare(recipe)
    with resume_errors(ckpt, "export"):
        load_checkpoint(state, ckpt)
    if not state.valid_losses:
        state.valid_losses = evaluate(state.models, valid, recipe)
    return export_models(state, recipe, dest)
