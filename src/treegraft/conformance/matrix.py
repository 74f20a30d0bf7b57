"""The architecture conformance matrix: every causal LM `transformers` can build, in both roles.

For each model type of the causal-LM auto mapping, `check_architecture` builds a tiny
random-weight model (`tiny.tiny_model`) and decodes with it

- as the **target**, with the n-gram drafter and a second model of the same architecture as
  the LM drafter (a TreeGraft tree that calls it every layer; a model with state layers, which
  serves as a target only, verifies the chains of a tiny Llama drafter), and
- as the **LM drafter** of a tiny Llama target,

on a short prompt and on a long one (`LONG_PROMPT` tokens: more than three sliding windows, and
enough for the runner to prefill it as one causal block), comparing each output with the
target's own `generate(do_sample=False)`. A role ends as `exact` (every output
equal), `refused` (the pipeline refused the model at build time, with its reason) or `WRONG`
(an output differed: the bug this matrix exists to catch). Architectures the tiny factory cannot
build are `skipped` with the reason. Composite models are saved and loaded from a folder, as a
user's checkpoint; a model whose own `generate` fails in float64 is checked in float32, and where
it fails in every dtype only a build-time refusal can be checked (else the row is `skipped`).
`render_table` writes the support table of docs/architectures.md.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import torch

from treegraft.conformance.tiny import VOCAB, WINDOW, causal_lm_types, sub_configs, tiny_model
from treegraft.core.runner.causal_lm import CAUSAL_MIN_ROWS
from treegraft.core.runner.sequence_runner import chain_runner

EXACT, REFUSED, WRONG, SKIPPED = "exact", "refused", "WRONG", "skipped"
#: tokens generated per output
NEW_TOKENS = 10
SHORT_PROMPT = 9
#: past three windows (a sliding-window layer must forget the start) and past the length from
#: which the runner prefills a prompt as one causal block before a lone root
LONG_PROMPT = max(3 * WINDOW + 3, CAUSAL_MIN_ROWS + 6)
#: dtypes a model is checked in: the first in which its own `generate` runs
DTYPES = (torch.float64, torch.float32)


@attrs.frozen
class RoleResult:
    """How one architecture fared in one role."""

    status: str
    reason: str = ""


@attrs.frozen
class ArchResult:
    """One row of the matrix."""

    model_type: str
    model_class: str
    target: RoleResult
    drafter: RoleResult


def pipeline_spec(target: str, drafter: str) -> dict[str, Any]:
    """A TreeGraft pipeline over in-memory models that calls the LM drafter at every layer."""
    return {
        "target": target,
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 3, "chain_len": 2},
            "strong": {"name": "hf_lm", "model": drafter},
        },
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "rescorer": {"name": "overwrite"},
        "grafter": {"name": "reselect", "lookback": 1},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": NEW_TOKENS, "dtype": "float64", "stop_at_eos": False},
    }


def prompts(vocab: int, seed: int = 0) -> list[torch.Tensor]:
    """A short prompt and a repetitive one of `LONG_PROMPT` tokens (the n-gram drafter finds
    matches in it; a sliding-window layer must forget its start; the runner prefills it
    causally)."""
    rng = torch.Generator().manual_seed(seed)
    short = torch.randint(0, vocab, (SHORT_PROMPT,), generator=rng)
    motif = torch.randint(0, vocab, (7,), generator=rng)
    long = torch.cat([motif.repeat(LONG_PROMPT // 7 - 1), short])[:LONG_PROMPT]
    return [short, long]


def reference(model: Any, prompt: torch.Tensor, max_new_tokens: int = NEW_TOKENS) -> list[int]:
    """The model's own greedy continuation (`generate`, no sampling, past any EOS), without the
    generation-config settings the pipeline does not apply (`plain_generation`: BART's family
    forces its EOS token at the last step), as every comparison with plain decoding runs it."""
    from treegraft.core.generation_settings import plain_generation

    with torch.inference_mode(), plain_generation(model):
        out = model.generate(
            prompt[None],
            attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, prompt.numel() :].tolist()


def run_role(
    target: Any, drafter: Any, *, dtype: torch.dtype = torch.float64, note: str = ""
) -> RoleResult:
    """Decode the prompts with `target` verifying `drafter`'s trees; compare with `generate`.
    `note` is kept as the reason of an exact result."""
    with tempfile.TemporaryDirectory() as folder:
        pipeline = build_pipeline(target, drafter, dtype, Path(folder))
        return pipeline if isinstance(pipeline, RoleResult) else compare(pipeline, target, note)


def compare(pipeline: Any, target: Any, note: str = "") -> RoleResult:
    """`EXACT` when `pipeline` decodes both prompts as `target.generate` does, else `WRONG`."""
    for prompt in prompts(VOCAB):
        got = list(pipeline.generate(prompt).token_ids)
        want = reference(target, prompt)
        if len(want) < NEW_TOKENS:  # `generate` stopped at a token of its own config
            got = got[: len(want)]
        if got != want:
            return RoleResult(WRONG, f"{prompt.numel()}-token prompt: {got} != generate {want}")
    return RoleResult(EXACT, note)


def build_pipeline(target: Any, drafter: Any, dtype: torch.dtype, folder: Path) -> Any:
    """The matrix's pipeline over `target` and `drafter`, or the `REFUSED` result of its build.
    A composite model (sub-configs beside its decoder's) is saved under `folder` and loaded
    from there, as a user's checkpoint is; others are handed over in memory."""
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline
    from treegraft.core.resources import Resources

    resources = Resources(dtype=dtype)
    refs = [
        _place(resources, m, name, folder) for m, name in ((target, "target"), (drafter, "drafter"))
    ]
    spec = pipeline_spec(*refs)
    spec["decoding"]["dtype"] = str(dtype).removeprefix("torch.")
    try:
        return load_pipeline(spec, resources=resources)
    except ConfigError as err:  # reasons name a saved model by its folder's name
        return RoleResult(REFUSED, str(err).replace(f"{folder}{os.sep}", ""))


def _place(resources: Any, model: Any, name: str, folder: Path) -> str:
    if not sub_configs(model.config):
        resources.add_model(f"mem:{name}", model)
        return f"mem:{name}"
    from treegraft.testing import word_tokenizer

    model.save_pretrained(folder / name)
    word_tokenizer(VOCAB).save_pretrained(folder / name)
    return str(folder / name)


def refusal_only(target: Any, drafter: Any, dtype: torch.dtype, failure: str) -> RoleResult:
    """For a model whose own `generate` fails (nothing to compare with): `REFUSED` when the
    pipeline refuses it at build time, else `SKIPPED` with `failure`."""
    with tempfile.TemporaryDirectory() as folder:
        built = build_pipeline(target, drafter, dtype, Path(folder))
    return built if isinstance(built, RoleResult) else RoleResult(SKIPPED, failure)


def check_architecture(model_type: str, llama: Callable[..., Any]) -> ArchResult:
    """The matrix row of `model_type`; `llama(seed, dtype)` builds the tiny Llama of the drafter
    role. Models are float64; one whose own `generate` fails in float64 (parts computed in
    float32, a float32 mask constant) is checked in float32."""
    failure = ""
    for dtype in DTYPES:
        try:
            target = tiny_model(model_type, seed=0, dtype=dtype)
            drafter = tiny_model(model_type, seed=1, dtype=dtype)
        except Exception as err:  # the tiny factory could not build it: listed with the reason
            skipped = RoleResult(SKIPPED, f"{type(err).__name__}: {_first_line(err)}")
            return ArchResult(model_type, "", skipped, skipped)
        try:
            reference(target, prompts(VOCAB)[0])
            break
        except Exception as err:  # its own generate fails: try the next dtype
            failure = failure or f"its own generate fails: {type(err).__name__}: {_first_line(err)}"
    else:
        with warnings.catch_warnings():  # nothing to compare with: only a refusal is checked
            warnings.simplefilter("ignore")
            return ArchResult(
                model_type,
                type(target).__name__,
                refusal_only(target, drafter, dtype, failure),
                refusal_only(llama(2, dtype), target, dtype, failure),
            )
    note = "" if dtype == DTYPES[0] else f"checked in {str(dtype)[6:]} (in float64, {failure})"
    if chain_runner(target) is not None:  # a target only: the tiny Llama drafts for it
        drafter = llama(1, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        as_target = run_role(target, drafter, dtype=dtype, note=note)
        as_drafter = run_role(llama(2, dtype), target, dtype=dtype, note=note)
    return ArchResult(model_type, type(target).__name__, as_target, as_drafter)


def run_matrix(
    model_types: Iterable[str] | None = None, *, progress: Callable[[str], None] | None = None
) -> list[ArchResult]:
    """Rows for `model_types` (default: every causal-LM type of `transformers`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    rows = []
    for model_type in model_types if model_types is not None else causal_lm_types():
        if progress is not None:
            progress(model_type)
        rows.append(check_architecture(model_type, tiny_llama))
    return rows


def tiny_llama(seed: int, dtype: torch.dtype = torch.float64) -> Any:
    return tiny_model("llama", seed=seed, dtype=dtype)


def render_table(rows: Iterable[ArchResult]) -> str:
    """The markdown support table (architecture x role)."""
    lines = [
        "| model type | class | as target | as LM drafter | reason |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        reason = row.target.reason or row.drafter.reason
        lines.append(
            f"| `{row.model_type}` | {row.model_class or '-'} | {row.target.status} | "
            f"{row.drafter.status} | {_cell(reason)} |"
        )
    return "\n".join(lines) + "\n"


def read_table(markdown: str) -> dict[str, tuple[str, str, str]]:
    """(class, target status, drafter status) by model type, from a page holding `render_table`'s
    table."""
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
    return rows


#: the markers around the generated table in docs/architectures.md
BEGIN, END = "<!-- conformance table: begin -->", "<!-- conformance table: end -->"


def write_table(page: str, table: str) -> str:
    """`page` with the text between `BEGIN` and `END` replaced by `table`."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def _cell(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= 160 else text[:157] + "..."


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else ""
