"""Distil a feature head (the `eagle` drafter's) from a target on the zoo corpus.

The target runs over corpus windows once per batch (no gradient): its final-norm hidden states
`f_t` are the features, its output head's distributions the teacher. The head learns
`f_t ~ head(f_{t-1}, embed(x_t))`, then, fed its own prediction, `f_{t+1} ~ head(f^_t,
embed(x_{t+1}))`, and so on for `unroll` steps (it drafts deeper layers from its own features):
per step a smooth-L1 loss on the feature plus `kl_weight` times KL(target || head) through the
target's output head. Embeddings and output head stay the target's, frozen.

Seeded and resumable like `treegraft.zoo.train` (the batch at step `s` depends only on `(seed,
s)`; a checkpoint every `checkpoint_every` steps and on interruption); logs to
`RUNS/NAME/train.log` with a progress bar on the terminal; exports the head (bf16) when the run
reaches its tokens, with its validation agreement (how often the head's top token is the
target's, at each unrolled depth) in `training.json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from treegraft.core.config import Check, at_least, between, field
from treegraft.plugins.drafters.feature_head import FeatureHead, HeadSpec
from treegraft.zoo.corpus import default_corpus_dir
from treegraft.zoo.recipe import (
    NON_NEGATIVE,
    OPEN_FRACTION,
    ROOT,
    STEPS,
    RecipeError,
    StepsOfTokens,
    check_folder_name,
    check_reference,
    check_windows,
    positive,
    read_recipe_data,
    structure,
)
from treegraft.zoo.train import (
    batch_at,
    check_fresh_start,
    default_runs_dir,
    load_teacher,
    load_tokens,
    log,
    lr_at,
    resume_errors,
    setup_logging,
    split_tokens,
    tokenizer_dir,
    training_progress,
)

CHECKPOINT_FILE = "head-checkpoint.pt"
VALID_SEED = 2**32 - 1


@attrs.frozen(kw_only=True)
class HeadRecipe(StepsOfTokens):
    """Everything that determines a head's distillation run."""

    name: str = field(doc="the run's folder name under --runs")
    target: str = "zoo:target"
    intermediate_size: int = field(768, check=at_least(1, sane_max=262144))
    tokens: int = field(check=at_least(1, sane_max=10**13), doc="training tokens of the run")
    seed: int = field(0, check=at_least(0))
    corpus: str = attrs.field(factory=lambda: str(default_corpus_dir()))
    tokenizer: str | None = None
    unroll: int = field(3, check=at_least(1, sane_max=64), doc="feature steps drafted in a row")
    kl_weight: float = field(1.0, check=NON_NEGATIVE)
    #: the KL runs over this many of the most frequent tokens (zoo token counts), renormalised
    #: (the `eagle` drafter's `top_tokens`); null: the whole vocabulary
    top_tokens: int | None = field(
        None,
        check=Check(">= 1 or null", lambda v: v is None or v >= 1),
        doc="at most the target's vocabulary; null: all of it",
    )
    #: the counts ranking the vocabulary for `top_tokens` (a shipped reference such as
    #: `zoo:smollm2-token-counts` for another target's tokenizer, or a JSON file)
    token_counts: str = "zoo:token-counts"
    seq_len: int = field(256, check=at_least(1, sane_max=1 << 20))
    batch_size: int = field(8, check=at_least(1, sane_max=65536))
    lr: float = field(2e-3, check=positive(sane_max=10))
    min_lr_ratio: float = field(0.1, check=between(0, 1))
    warmup_steps: int = field(20, check=at_least(0, sane_max=10**9))
    decay_fraction: float = field(0.25, check=between(0, 1))
    weight_decay: float = field(0.0, check=NON_NEGATIVE)
    grad_clip: float = field(1.0, check=positive())
    valid_fraction: float = field(0.005, check=OPEN_FRACTION)
    valid_batches: int = field(2, check=STEPS)
    eval_every: int = field(100, check=STEPS)
    checkpoint_every: int = field(20, check=STEPS)
    log_every: int = field(5, check=STEPS)


def load_head_recipe(path: Path) -> HeadRecipe:
    """Read and check a head recipe file (`treegraft.zoo.recipe`: every error a `RecipeError`
    naming the file and the field)."""
    recipe = structure(HeadRecipe, read_recipe_data(path, ("name", "tokens")), path)
    check_folder_name(recipe.name, f"{path}: {ROOT}.name", path)
    check_reference(recipe.target, f"{path}: {ROOT}.target", path)
    check_reference(recipe.tokenizer, f"{path}: {ROOT}.tokenizer", path, "tokenizer.json")
    if recipe.top_tokens is not None:
        check_counts(recipe.token_counts, f"{path}: {ROOT}.token_counts")
    if recipe.seq_len <= recipe.unroll:  # unrolled step d predicts seq_len - d positions
        raise RecipeError(
            f"{path}: {ROOT}.seq_len: expected more than unroll ({recipe.unroll}) tokens, got "
            f"{recipe.seq_len}"
        )
    return recipe


def check_counts(ref: str, where: str) -> None:
    """`ref` names shipped token counts or an existing file (read when the run starts)."""
    from treegraft.zoo.token_counts import named_counts

    named = named_counts()
    if ref not in named and not Path(ref).expanduser().is_file():
        raise RecipeError(
            f"{where}: expected one of {', '.join(map(repr, named))} or a token counts JSON file "
            f"(written by `treegraft zoo token-counts`), got {ref!r} (no such file)"
        )


def features_of(target: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """`[batch, seq, hidden]` final-norm hidden states of the target (no gradient)."""
    with torch.no_grad():
        return target.model(input_ids=inputs).last_hidden_state.float()


def output_rows(target: torch.nn.Module, recipe: HeadRecipe) -> tuple[torch.Tensor, ...]:
    """The output head's (weight, bias) rows the KL runs over (`recipe.top_tokens`)."""
    out = target.get_output_embeddings()
    weight, bias = out.weight.detach(), None if out.bias is None else out.bias.detach()
    if recipe.top_tokens is None:
        return weight, bias
    from treegraft.zoo.token_counts import load_counts, most_frequent

    vocab = weight.shape[0]
    if recipe.top_tokens > vocab:
        raise RecipeError(
            f"{ROOT}.top_tokens: expected at most the vocabulary of the target {recipe.target!r} "
            f"({vocab} tokens), or null for all of it, got {recipe.top_tokens}"
        )
    try:
        counts = load_counts(recipe.token_counts)
    except (OSError, ValueError) as exc:
        raise RecipeError(f"{ROOT}.token_counts: {exc}") from None
    if counts.shape[0] != weight.shape[0]:
        raise RecipeError(
            f"{ROOT}.token_counts: {recipe.token_counts!r} counts {counts.shape[0]} token ids, the "
            f"target {recipe.target!r} has {weight.shape[0]}"
        )
    rows = torch.from_numpy(most_frequent(counts, recipe.top_tokens).copy())
    return weight[rows], None if bias is None else bias[rows]


def unrolled_losses(
    head: FeatureHead,
    target: torch.nn.Module,
    batch: torch.Tensor,
    recipe: HeadRecipe,
    rows: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, list[float]]:
    """The loss of `batch` summed over the unrolled steps, and the top-1 agreement per step
    (over the output `rows`, default `output_rows`)."""
    inputs = batch[:, :-1]
    feats = features_of(target, inputs)  # [B, L, H]
    embed = target.get_input_embeddings().weight.detach()
    weight, bias = rows if rows is not None else output_rows(target, recipe)
    emb = F.embedding(inputs, embed)  # [B, L, H]
    feature, total, agree = feats, 0.0, []
    for depth in range(1, recipe.unroll + 1):
        pred = head(feature[:, :-1], emb[:, depth:])  # predicts feats[:, depth:]
        want = feats[:, depth:]
        teacher = F.log_softmax(F.linear(want, weight, bias), dim=-1)
        student = F.log_softmax(F.linear(pred, weight, bias), dim=-1)
        kl = F.kl_div(
            student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean"
        )
        total = total + F.smooth_l1_loss(pred, want) + recipe.kl_weight * kl
        agree.append(float((student.argmax(-1) == teacher.argmax(-1)).float().mean()))
        feature = pred
    return total, agree


@attrs.define
class HeadRun:
    """The mutable state of a head's run."""

    head: FeatureHead
    optimizer: torch.optim.Optimizer
    step: int = 0
    wall_seconds: float = 0.0
    last_loss: float = 0.0
    agreement: list[float] = attrs.Factory(list)

    def save(self, path: Path) -> None:
        state = {
            "head": self.head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "wall_seconds": self.wall_seconds,
            "agreement": self.agreement,
        }
        torch.save(state, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)

    def load(self, path: Path) -> None:
        state = torch.load(path, weights_only=True)
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.wall_seconds = int(state["step"]), float(state["wall_seconds"])
        self.agreement = list(state["agreement"])


def check_head_target(target: torch.nn.Module, recipe: HeadRecipe, tokens: np.ndarray) -> None:
    """The eagle drafter serves targets the lean forward runs: a head distilled from another
    would be refused by every pipeline, so its run is refused before the first step; and the
    corpus' tokens (`recipe.tokenizer`'s) must be ids of the target's vocabulary."""
    from treegraft.core.runner.lean import lean_support

    vocab = int(target.get_input_embeddings().weight.shape[0])
    if tokens.size and int(tokens.max()) >= vocab:
        raise RecipeError(
            f"recipe.tokenizer: {str(tokenizer_dir(recipe))!r} writes the corpus in token ids up "
            f"to {int(tokens.max())}, the target {recipe.target!r} has {vocab}; expected the "
            "target's tokenizer (name its folder as `tokenizer`)"
        )
    why = lean_support(target)
    if why is not None:
        raise RecipeError(
            f"recipe.target: {recipe.target!r} cannot carry a feature head ({why}); expected a "
            "model the lean forward runs (Llama, Mistral, Qwen2 or Qwen3), the only targets "
            "the eagle drafter drafts for"
        )


def new_run(recipe: HeadRecipe, target: torch.nn.Module) -> HeadRun:
    cfg = target.config
    spec = HeadSpec(
        hidden_size=int(cfg.hidden_size),
        intermediate_size=recipe.intermediate_size,
        vocab_size=int(cfg.vocab_size),
        target=recipe.target,
        eps=float(cfg.rms_norm_eps),
    )
    torch.manual_seed(recipe.seed)
    head = FeatureHead(spec)
    opt = torch.optim.AdamW(
        head.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay
    )
    return HeadRun(head, opt)


def validate(
    run: HeadRun, target: torch.nn.Module, valid: np.ndarray, recipe: HeadRecipe
) -> list[float]:
    """Mean top-1 agreement with the target per unrolled depth on fixed validation windows."""
    run.head.eval()
    rows, out = [], output_rows(target, recipe)
    with torch.no_grad():
        for b in range(recipe.valid_batches):
            batch = batch_at(
                valid, b, seed=VALID_SEED, batch_size=recipe.batch_size, seq_len=recipe.seq_len
            )
            rows.append(unrolled_losses(run.head, target, batch, recipe, out)[1])
    run.head.train()
    return [round(float(np.mean(col)), 4) for col in zip(*rows, strict=True)]


def train_head(
    recipe: HeadRecipe,
    *,
    resume: bool = False,
    runs: Path | None = None,
    max_steps: int | None = None,
    out: Path | None = None,
) -> HeadRun:
    """Run (or resume) a head recipe; exports the head to `out` (default `RUNS/NAME/export`)
    once the run reaches `recipe.steps`. `max_steps` stops this call early (resumable)."""
    folder = (runs or default_runs_dir()) / recipe.name
    ckpt = folder / CHECKPOINT_FILE
    check_fresh_start(ckpt, resume)
    folder.mkdir(parents=True, exist_ok=True)
    setup_logging(folder / "train.log")
    tokens = load_tokens(Path(recipe.corpus).expanduser(), tokenizer_dir(recipe))
    train, valid = split_tokens(tokens, recipe.valid_fraction)
    check_windows(
        len(train), len(valid), seq_len=recipe.seq_len, valid_fraction=recipe.valid_fraction
    )
    target = load_teacher(recipe.target)
    check_head_target(target, recipe, tokens)
    output_rows(target, recipe)  # the counts and top_tokens checked before the first step
    run = new_run(recipe, target)
    if resume and ckpt.exists():
        with resume_errors(ckpt):
            run.load(ckpt)
        log.info("resumed %s at step %d", recipe.name, run.step)
    log.info(
        "head recipe %s: %d steps of %d tokens", recipe.name, recipe.steps, recipe.tokens_per_step
    )
    try:
        _loop(run, recipe, target, train, valid, ckpt, max_steps)
    finally:
        run.save(ckpt)
    if run.step >= recipe.steps:
        run.agreement = validate(run, target, valid, recipe)
        run.save(ckpt)
        export_head(run, recipe, out or folder / "export")
    return run


def _loop(run, recipe, target, train, valid, ckpt, max_steps) -> None:
    stop = recipe.steps if max_steps is None else min(recipe.steps, run.step + max_steps)
    run.head.train()
    out = output_rows(target, recipe)
    with training_progress() as bar:
        task = bar.add_task(recipe.name, total=recipe.steps, completed=run.step, loss="-", tps=0.0)
        while run.step < stop:
            start = time.perf_counter()
            batch = batch_at(
                train,
                run.step,
                seed=recipe.seed,
                batch_size=recipe.batch_size,
                seq_len=recipe.seq_len,
            )
            for group in run.optimizer.param_groups:
                group["lr"] = lr_at(run.step, recipe)
            loss, agree = unrolled_losses(run.head, target, batch, recipe, out)
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.head.parameters(), recipe.grad_clip)
            run.optimizer.step()
            run.step += 1
            dt = time.perf_counter() - start
            run.wall_seconds += dt
            run.last_loss = float(loss.detach())
            bar.update(
                task,
                completed=run.step,
                loss=f"{run.last_loss:.3f}",
                tps=recipe.tokens_per_step / dt,
            )
            if run.step % recipe.log_every == 0:
                log.info("step %d/%d loss %.4f agree %s tok/s %.0f", run.step, recipe.steps,
                         run.last_loss, [round(a, 3) for a in agree], recipe.tokens_per_step / dt)  # fmt: skip
            if run.step % recipe.eval_every == 0:
                run.agreement = validate(run, target, valid, recipe)
                log.info("step %d valid agreement %s", run.step, run.agreement)
            if run.step % recipe.checkpoint_every == 0:
                run.save(ckpt)


def export_head(run: HeadRun, recipe: HeadRecipe, dest: Path) -> Path:
    """Write the head (bf16) and its `training.json` into `dest`."""
    run.head.save(dest)
    record = {
        "recipe": recipe.name,
        "target": recipe.target,
        "parameters": sum(p.numel() for p in run.head.parameters()),
        "steps": run.step,
        "tokens": run.step * recipe.tokens_per_step,
        "planned_tokens": recipe.steps * recipe.tokens_per_step,
        "wall_seconds": round(run.wall_seconds, 1),
        "valid_agreement_per_depth": run.agreement,
    }
    (dest / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    log.info("exported %s: %s", dest, record)
    return dest
