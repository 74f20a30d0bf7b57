"""Briefly distilling a truncated self-drafter of a real target (the LayerSkip / draft-l recipe).

An early exit of a pretrained model is no drafter until it is trained: SmolLM2's exit after 4 of
its 30 layers agrees with the full model on 4.8% of held-out answer tokens (40.7% once trained
here). The recipe trains that exit on the target's own greedy answers (sequence-level
distillation), in three stages (the answers resume where a stopped run left them):

1. `training_prompts`: prompts of the training side of the zoo corpus (never a suite's held-out
   units): the user turns of its task examples (instructions, word problems, questions, summaries,
   two-turn chats) and the signature + docstring of its standalone functions, balanced per kind;
2. `generate_answers`: the target answers each prompt greedily through its chat template, in
   batches (left-padded), written to a JSON-lines file as token ids;
3. `distil`: the first `layers` decoder layers and the final norm learn to predict the target's
   next token on those answers (cross-entropy on the answer positions and, with `label_prompts`,
   on the target's own top-1 at the prompt positions; the tied embedding and head stay frozen, so
   the drafter keeps reading the target's own vocabulary space).

The trained tensors (the kept layers and the final norm, bf16) ship in the zoo under
`zoo/deltas/<name>/`; `treegraft.zoo.truncate.apply_delta` puts them on a freshly truncated copy
of the cached target, which is how `zoo:smollm2-draft-l` is built at first use
(`treegraft.zoo.remote`). The same recipe trains a small drafter from scratch on the target's
embedding and head (`distil(fresh=...)`, `treegraft.zoo.fresh_draft`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from treegraft.zoo.corpus import read_corpus, split_example
from treegraft.zoo.truncate import (
    DELTA_FILE,
    RECORD_FILE,
    check_layers,
    cut_config,
    train_layers_and_norm,
)

log = logging.getLogger(__name__)

#: Kinds of training prompts, by the corpus key's prefix (task examples) or document kind.
KINDS = ("alpaca", "cnndm", "gsm", "qa", "mt", "function")

COUNTS_FILE = "token_counts.json"
ANSWERS_FILE = "answers.jsonl"


@attrs.frozen
class Prompt:
    kind: str
    text: str


def function_prompt(source: str) -> str | None:
    """The signature and docstring of a function's source, up to the docstring's closing quotes
    (as the `humaneval` suite cuts them), or None when it has no docstring or does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if not tree.body or not isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = tree.body[0].body
    first = body[0] if body else None
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and len(body) > 1
    ):
        return None
    lines = source.splitlines(keepends=True)
    cut = sum(len(line) for line in lines[: first.end_lineno - 1]) + first.end_col_offset
    return source[:cut]


def _kind_and_prompt(doc: Any) -> tuple[str, str] | None:
    if doc.kind == "task":
        kind = doc.key.split(":", 1)[0]
        return (kind, split_example(doc.text)[0]) if kind in KINDS else None
    if doc.kind == "function":
        prompt = function_prompt(doc.text)
        return ("function", prompt) if prompt else None
    return None


def training_prompts(corpus: Path, *, per_kind: int, seed: int = 0) -> list[Prompt]:
    """`per_kind` distinct prompts of each kind in `KINDS` from the corpus (training side only),
    drawn with `seed`, shuffled together."""
    pools: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for doc in read_corpus(corpus):
        found = _kind_and_prompt(doc)
        if found is not None:
            pools[found[0]].add(found[1])
    rng = random.Random(seed)
    prompts = []
    for kind in KINDS:
        pool = sorted(pools[kind])
        if len(pool) < per_kind:
            raise ValueError(
                f"per_kind: the corpus has {len(pool)} distinct {kind!r} prompts, "
                f"fewer than the {per_kind} asked for"
            )
        prompts += [Prompt(kind, text) for text in rng.sample(pool, per_kind)]
    rng.shuffle(prompts)
    return prompts


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def generate_answers(
    model_dir: Path,
    prompts: list[Prompt],
    out: Path,
    *,
    max_new_tokens: int = 96,
    max_prompt_tokens: int = 384,
    batch_size: int = 16,
    progress: Any = None,
) -> int:
    """Append to `out` (JSON lines: index in `prompts`, kind, prompt_len, ids) the target's greedy
    answer to every prompt not answered there yet, through its chat template; return how many
    lines `out` holds.

    Prompts are answered in batches of similar length (left padding); a prompt longer than
    `max_prompt_tokens` keeps its last tokens. `progress(batches done, batches, answer tokens
    so far)` is called after each batch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from treegraft.core.chat import chat_ids

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.eos_token_id
    )
    _check_answerer(
        out, model_dir, max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens
    )
    done = _answered(out, prompts)
    todo = [
        (i, p, chat_ids(tokenizer, p.text)[-max_prompt_tokens:])
        for i, p in enumerate(prompts)
        if i not in done
    ]
    todo.sort(key=lambda item: len(item[2]))
    batches = list(_batches(todo, batch_size))
    log.info(
        "answers: %d prompts, %d answered before, %d batches", len(prompts), len(done), len(batches)
    )
    new_tokens = 0
    if progress is not None:
        progress(0, len(batches), 0)
    with out.open("a") as fh:
        for i, batch in enumerate(batches):
            width = max(len(ids) for _, _, ids in batch)
            ids = torch.tensor([[pad] * (width - len(x)) + x for _, _, x in batch])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for _, _, x in batch])
            with torch.inference_mode():
                full = model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad,
                )
            for (index, prompt, prompt_ids), row in zip(
                batch, full[:, width:].tolist(), strict=True
            ):
                answer = _until_eos(row, model.generation_config.eos_token_id)
                line = {
                    "index": index,
                    "prompt_sha": _sha(prompt.text),
                    "kind": prompt.kind,
                    "prompt_len": len(prompt_ids),
                    "ids": prompt_ids + answer,
                }
                fh.write(json.dumps(line) + "\n")
                new_tokens += len(answer)
            fh.flush()
            if progress is not None:
                progress(i + 1, len(batches), new_tokens)
    return sum(1 for _ in out.open())


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_answerer(out: Path, model_dir: Path, **settings: int) -> None:
    """Refuse to add to `out` answers of another model or settings: its sidecar `<out>.json`
    holds the digest of the answering model's config and weights and the answer settings."""
    digest = hashlib.sha256()
    for file in sorted(model_dir.iterdir()):
        if file.name == "config.json" or file.suffix in (".safetensors", ".bin"):
            digest.update(file.name.encode() + file.read_bytes())
    mine = {"model": digest.hexdigest()[:16], **settings}
    sidecar = out.with_suffix(".json")
    if sidecar.is_file():
        theirs = json.loads(sidecar.read_text())
        changed = sorted(k for k in mine if theirs.get(k) != mine[k])
        if changed and out.exists():
            raise ValueError(
                f"{out}: answers of another {' and '.join(changed)} than this run's "
                f"({', '.join(f'{k} {theirs.get(k)} there, {mine[k]} here' for k in changed)}); "
                "use another work folder or delete the file"
            )
    elif out.exists():
        log.warning("%s: no %s to tell which model wrote these answers", out, sidecar.name)
    sidecar.write_text(json.dumps(mine) + "\n")


def _answered(out: Path, prompts: list[Prompt]) -> set[int]:
    """Indices of the prompts `out` already answers. A last line cut short by a stopped run is
    dropped from the file; answers to other prompts (another seed or `per_kind`) are an error."""
    if not out.exists():
        return set()
    lines = out.read_text().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        out.write_text("".join(lines[:-1]))  # written when the run stopped
        lines = lines[:-1]
    done = set()
    for number, line in enumerate(lines, 1):
        row = json.loads(line)
        index = row["index"]
        if index >= len(prompts) or row.get("prompt_sha") != _sha(prompts[index].text):
            raise ValueError(
                f"{out}:{number}: answers a prompt other than prompt {index} of this run's "
                "(another seed, per_kind or corpus?); use another work folder or delete the file"
            )
        done.add(index)
    return done


def _until_eos(row: list[int], eos: int | list[int] | None) -> list[int]:
    """`row` up to and including its first end-of-sequence token."""
    stops = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    for i, token in enumerate(row):
        if token in stops:
            return row[: i + 1]
    return row


def read_answers(path: Path) -> list[tuple[list[int], int]]:
    """`(ids, prompt_len)` of every answered prompt in a `generate_answers` file."""
    rows = []
    with path.open() as fh:
        for line in fh:
            row = json.loads(line)
            rows.append((row["ids"], row["prompt_len"]))
    return rows


# ---------------------------------------------------------------- training


def truncated_student(base_dir: Path, layers: int) -> Any:
    """The model of `base_dir` cut to its first `layers` decoder layers, float32, with only those
    layers and the final norm trainable (the embedding and the tied head frozen)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    check_layers(layers, model.config.num_hidden_layers)
    model.model.layers = model.model.layers[:layers]
    cut_config(model.config, layers)
    return train_layers_and_norm(model)


def split_rows(
    rows: list[tuple[list[int], int]], valid_fraction: float
) -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]]]:
    """(train, valid): every `round(1 / valid_fraction)`-th row is held out."""
    every = max(2, round(1 / valid_fraction))
    return (
        [r for i, r in enumerate(rows) if i % every],
        [r for i, r in enumerate(rows) if not i % every],
    )


def token_batches(rows: list[Any], batch_tokens: int, rng: random.Random | None) -> list[list[Any]]:
    """Rows grouped by length into batches of at most `batch_tokens` padded tokens (a row longer
    than that is a batch of its own); shuffled with `rng` when given."""
    if not rows:
        return []
    order = sorted(rows, key=lambda r: len(r[0]))
    batches: list[list[Any]] = [[]]
    for row in order:
        width = max([len(row[0]), *(len(r[0]) for r in batches[-1])])
        if batches[-1] and width * (len(batches[-1]) + 1) > batch_tokens:
            batches.append([])
        batches[-1].append(row)
    if rng is not None:
        rng.shuffle(batches)
    return batches


#: A training row: (token ids, first supervised position, the token expected at each position
#: from `first` on, predicted from the tokens before it).
Row = tuple[list[int], int, list[int]]


def answer_rows(rows: list[tuple[list[int], int]]) -> list[Row]:
    """Rows supervised on the answers only: each answer token is the target's greedy choice."""
    return [(ids, n, ids[n:]) for ids, n in rows]


def teacher_rows(
    teacher: Any, rows: list[tuple[list[int], int]], pad: int, batch_tokens: int
) -> list[Row]:
    """Rows supervised at every position: the answers' tokens (the target's greedy choices), and
    in the prompt the target's own top-1 after each prefix (one forward of the target per batch,
    bf16 autocast) — twice and more the supervised positions of `answer_rows`."""
    import torch

    labelled = []
    with torch.no_grad():
        for batch in token_batches(rows, batch_tokens, None):
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                top = teacher(input_ids=ids, attention_mask=mask).logits.argmax(-1).tolist()
            for (tokens, n), best in zip(batch, top, strict=True):
                labelled.append((tokens, 1, best[: n - 1] + tokens[n:]))
    return labelled


def _loss(model: Any, batch: list[Row], pad: int) -> tuple[Any, int, int]:
    """(mean cross-entropy, correct top-1, positions) of `model` predicting each supervised token
    of `batch` from the tokens before it; the head runs on supervised positions only."""
    import torch
    import torch.nn.functional as F

    width = max(len(ids) for ids, _, _ in batch)
    ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _, _ in batch])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in batch])
    select = torch.zeros_like(ids, dtype=torch.bool)  # positions whose next token is supervised
    for row, (tokens, first, _) in enumerate(batch):
        select[row, first - 1 : len(tokens) - 1] = True
    targets = torch.tensor([t for _, _, expected in batch for t in expected])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model.lm_head(hidden[select])
    logits = logits.float()
    loss = F.cross_entropy(logits, targets)
    return loss, int((logits.argmax(-1) == targets).sum()), int(targets.numel())


def evaluate(
    model: Any, rows: list[tuple[list[int], int]], pad: int, batch_tokens: int
) -> tuple[float, float]:
    """(agreement, loss) on answers: the fraction of answer positions where `model`'s top-1 is
    the target's greedy token, and the mean cross-entropy of those tokens."""
    import torch

    correct = total = 0
    loss = 0.0
    with torch.no_grad():
        for batch in token_batches(answer_rows(rows), batch_tokens, None):
            mean, c, n = _loss(model, batch, pad)
            correct, total, loss = correct + c, total + n, loss + float(mean) * n
    return correct / max(1, total), loss / max(1, total)


def distil(
    base_dir: Path,
    answers: Path,
    out: Path,
    *,
    layers: int,
    epochs: int = 2,
    lr: float = 3e-4,
    batch_tokens: int = 4096,
    valid_fraction: float = 0.05,
    seed: int = 0,
    label_prompts: bool = False,
    fresh: Mapping[str, Any] | None = None,
    windows: Sequence[list[int]] = (),
    progress: Any = None,
) -> dict[str, Any]:
    """Train the first `layers` layers and final norm of `base_dir`'s model on the answers file
    (`generate_answers`) and write them to `out/delta.safetensors` (bf16) with a training record;
    return the record. With `label_prompts` the prompts' positions are supervised too, by the
    target's own top-1 (`teacher_rows`). With `fresh` (shape changes, `{}` for none) the layers
    start at random instead (`fresh_draft.fresh_student`); `windows` (token ids, e.g.
    `fresh_draft.corpus_windows`) are trained on with the target's top-1 at every position. The
    learning rate warms up over 5% of the steps, then decays linearly.
    `progress(step, steps, loss, supervised tokens so far)` follows each step."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    rows = read_answers(answers)
    train_rows, valid_rows = split_rows(rows, valid_fraction)
    if not train_rows or not valid_rows:
        raise ValueError(f"answers: {answers} holds {len(rows)} answers, too few to train on")
    if fresh is None:
        model = truncated_student(base_dir, layers)
    else:
        from treegraft.zoo.fresh_draft import fresh_student

        model = fresh_student(base_dir, layers, fresh, seed)
    pad = int(
        model.config.eos_token_id
        if model.config.pad_token_id is None
        else model.config.pad_token_id
    )
    train_set = answer_rows(train_rows)
    if label_prompts or windows:
        from transformers import AutoModelForCausalLM

        teacher = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        if label_prompts:
            train_set = teacher_rows(teacher, train_rows, pad, batch_tokens)
        train_set += teacher_rows(teacher, [(w, len(w)) for w in windows], pad, batch_tokens)
        del teacher
    before, loss_before = evaluate(model, valid_rows, pad, batch_tokens)
    log.info(
        "before: agreement %.4f, loss %.4f on %d valid answers",
        before,
        loss_before,
        len(valid_rows),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng = random.Random(seed)
    plan = [token_batches(train_set, batch_tokens, rng) for _ in range(epochs)]
    steps = sum(len(p) for p in plan)
    warm = max(1, steps // 20)
    start = time.perf_counter()
    step = seen = 0
    model.train()
    for epoch, batches in enumerate(plan):
        for batch in batches:
            scale = min((step + 1) / warm, max(0.0, (steps - step) / max(1, steps - warm)))
            for group in opt.param_groups:
                group["lr"] = lr * scale
            loss, correct, n = _loss(model, batch, pad)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            value = float(loss.detach())
            seen += n
            log.info(
                "epoch %d step %d/%d loss %.4f acc %.3f", epoch, step, steps, value, correct / n
            )
            if progress is not None:
                progress(step, steps, value, seen)
    model.eval()
    after, loss_after = evaluate(model, valid_rows, pad, batch_tokens)
    log.info("after: agreement %.4f, loss %.4f", after, loss_after)
    out.mkdir(parents=True, exist_ok=True)
    state = {
        name: param.detach().to(torch.bfloat16).contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }
    save_file(state, out / DELTA_FILE, metadata={"format": "pt"})
    record = {
        "base": str(base_dir),
        "layers": layers,
        "init": "truncated" if fresh is None else "fresh",
        "config": {} if fresh is None else dict(fresh),
        "recipe": "sequence-level distillation: cross-entropy on the target's greedy answers"
        + (", and on its top-1 at every prompt position" if label_prompts else "")
        + (", and at every position of corpus windows" if windows else ""),
        "label_prompts": label_prompts,
        "corpus_windows": len(windows),
        "corpus_tokens": sum(len(w) for w in windows),
        "supervised_tokens": sum(len(t) for _, _, t in train_set),
        "answers": len(rows),
        "train_answers": len(train_rows),
        "answer_tokens": sum(len(ids) - p for ids, p in train_rows),
        "epochs": epochs,
        "steps": steps,
        "lr": lr,
        "batch_tokens": batch_tokens,
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 1),
        "valid_agreement_before": round(before, 4),
        "valid_agreement_after": round(after, 4),
        "valid_loss_before": round(loss_before, 4),
        "valid_loss_after": round(loss_after, 4),
        "tensors": sorted(state),
    }
    (out / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def answer_counts(rows: list[tuple[list[int], int]], vocab_size: int) -> Any:
    """`[vocab_size]` int64 occurrences of each token id in the answers (the tokens a drafter of
    this target must propose): they rank the vocabulary for `hf_lm`'s restricted `head`."""
    import numpy as np

    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, prompt_len in rows:
        counts += np.bincount(np.asarray(ids[prompt_len:], dtype=np.int64), minlength=vocab_size)[
            :vocab_size
        ]
    return counts


def run(
    base_ref: str,
    corpus: Path,
    work: Path,
    out: Path,
    *,
    layers: int,
    per_kind: int,
    max_new_tokens: int = 96,
    batch_size: int = 32,
    seed: int = 0,
    corpus_tokens: int = 0,
    **training: Any,
) -> dict[str, Any]:
    """The whole recipe for the target `base_ref` (`zoo:NAME` or a model directory): prompts from
    `corpus`, the target's answers in `work/answers.jsonl` (resumed where an earlier run stopped),
    the distilled layers and the answers' token counts in `out`; a log in `work/train.log`;
    returns the training record. `corpus_tokens`: that many tokens of corpus windows trained on
    too (`fresh_draft.corpus_windows`). `training`: `distil`'s options (epochs, lr, fresh, ...)."""
    from treegraft.core.resources import resolve_model_path
    from treegraft.zoo.token_counts import save_counts
    from treegraft.zoo.train import setup_logging, training_progress

    work.mkdir(parents=True, exist_ok=True)
    setup_logging(work / "train.log", log)
    base = resolve_model_path(base_ref)
    config = json.loads((base / "config.json").read_text())
    check_layers(layers, int(config["num_hidden_layers"]))  # before the answers, not after
    prompts = training_prompts(corpus, per_kind=per_kind, seed=seed)
    answers = work / ANSWERS_FILE
    with training_progress() as bar:
        task = bar.add_task("answers (batches)", total=None, loss="-", tps=0.0)
        start = time.perf_counter()
        generate_answers(
            base,
            prompts,
            answers,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            progress=lambda i, n, tokens: bar.update(
                task, completed=i, total=n, tps=tokens / (time.perf_counter() - start)
            ),
        )
        from treegraft.zoo.fresh_draft import corpus_windows

        windows = corpus_windows(corpus, base, tokens=corpus_tokens, seed=seed)
        task = bar.add_task("distil (steps)", total=None, loss="-", tps=0.0)
        start = time.perf_counter()
        record = distil(
            base,
            answers,
            out,
            layers=layers,
            seed=seed,
            windows=windows,
            **training,
            progress=lambda i, n, loss, tokens: bar.update(
                task,
                completed=i,
                total=n,
                loss=f"{loss:.3f}",
                tps=tokens / (time.perf_counter() - start),
            ),
        )
    counts = answer_counts(read_answers(answers), int(config["vocab_size"]))
    save_counts(
        out / COUNTS_FILE,
        counts,
        source=f"{base_ref}'s greedy answers to {len(prompts)} zoo-corpus prompts",
    )
    source = base / "treegraft-source.json"  # a fetched base: the exact file it came from
    record = {
        **record,
        "base": base_ref,
        "base_source": json.loads(source.read_text()) if source.is_file() else None,
        "per_kind": per_kind,
        "max_new_tokens": max_new_tokens,
    }
    (out / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record
