"""Do no harm: a pipeline whose LM drafters never agree with the target, against plain decoding.

Speculation must not cost much where it cannot pay. This script builds, for every `hf_lm` drafter
of a shipped pipeline, a copy of its model whose embedding rows (tied to its output head) are
shuffled by a seeded permutation: it still drafts confident chains at the same cost, but almost
never the target's tokens. It then decodes the first `--per-suite` prompts of each suite with
plain greedy decoding through the pipeline's runner (`ar-runner`, the same forward), the pipeline
with its own drafters, and the pipeline with the never-agreeing copies, side by side per prompt
(the order rotating), each pipeline's decoder carried from prompt to prompt and suite to suite as
in a sweep. It prints per suite the geometric mean over prompts of each pipeline's speedup over
plain decoding on the same prompt, and its tokens per target forward (tau); every output must
equal plain decoding's: the script stops at one that does not, unless the first differing token
is a float32 near-tie (the target's two best logits there less than `NEAR_TIE` apart: a tree
forward sums in another order than a one-token forward), which it lists after the table. Run
from the repository root, on an idle machine:

    python benchmarks/do_no_harm.py                              # treegraft, 10 prompts per suite
    python benchmarks/do_no_harm.py --per-suite 30 --suites qa,alpaca
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
import yaml
from rich.console import Console
from rich.progress import Progress
from safetensors.torch import load_file, save_file

from treegraft.bench.measure import exactness
from treegraft.bench.methods import AR_RUNNER, PipelineMethod, RunnerMethod
from treegraft.bench.stats import geometric_mean
from treegraft.core.pipeline import load_pipeline, resolve_pipeline
from treegraft.core.resources import Resources, resolve_model_path
from treegraft.zoo import SUITES, load_suite

#: a first differing token whose two best logits (plain decoding's prefix) lie closer than this
#: is a float32 rounding flip, not a bug (the zoo's known one: 4.8e-7)
NEAR_TIE = 1e-4


def never_agreeing_copy(ref: str, out: Path, seed: int) -> Path:
    """A copy of the model `ref` in `out` whose embedding rows (and, if untied, output-head rows)
    are shuffled: same architecture and cost, drafts that are almost never the target's."""
    src = resolve_model_path(ref)
    shutil.copytree(src, out)
    weights = load_file(str(out / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    shuffled = [k for k in weights if "embed_tokens" in k or "lm_head" in k]
    if not shuffled:
        raise SystemExit(f"{ref}: no embedding or output-head weights to shuffle in {src}")
    for key in shuffled:
        rows = torch.randperm(weights[key].shape[0], generator=generator)
        weights[key] = weights[key][rows].contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def with_never_agreeing_drafters(spec: dict[str, Any], folder: Path, seed: int) -> dict[str, Any]:
    """`spec` with each `hf_lm` drafter's model replaced by its never-agreeing copy."""
    spec = yaml.safe_load(yaml.safe_dump(spec, sort_keys=False))  # keeps the drafters' order
    copies: dict[str, str] = {}
    for role, drafter in spec["drafters"].items():
        if drafter.get("name") != "hf_lm":
            continue
        ref = drafter["model"]
        if ref not in copies:
            out = folder / f"never-{len(copies)}"
            copies[ref] = str(never_agreeing_copy(ref, out, seed + len(copies)))
        drafter["model"] = copies[ref]
        typer.echo(f"drafters.{role}: {ref} -> never-agreeing copy", err=True)
    if not copies:
        raise SystemExit("the pipeline has no hf_lm drafter to replace")
    return spec


def main(
    pipeline: Annotated[str, typer.Option(help="shipped pipeline name or YAML file")] = "treegraft",
    suites: Annotated[str, typer.Option(help="comma-separated zoo suites")] = (
        "qa,alpaca,mt_bench,humaneval"
    ),
    per_suite: Annotated[int, typer.Option(min=1)] = 10,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    threads: Annotated[int, typer.Option(min=1)] = 2,
    seed: Annotated[int, typer.Option(help="seed of the embedding shuffles")] = 0,
) -> None:
    torch.set_num_threads(threads)
    names = [s.strip() for s in suites.split(",") if s.strip()]
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        raise typer.BadParameter(f"unknown suite(s) {unknown}; expected some of {list(SUITES)}")
    spec = yaml.safe_load(resolve_pipeline(pipeline).read_text())
    res = Resources.create(device="cpu", dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        never = with_never_agreeing_drafters(spec, Path(tmp), seed)
        pipes = {
            "own drafters": load_pipeline(spec, resources=res),
            "never agreeing": load_pipeline(never, resources=res),
        }
        own = pipes["own drafters"]
        # the harness's `ar-runner`: a runner of its own over the target, forwarding as it does
        runner = res.runner(spec["target"], forward=own.decoder.target.forward)
        methods = {AR_RUNNER: RunnerMethod(AR_RUNNER, runner, own.eos_ids)} | {
            k: PipelineMethod.create(k, p) for k, p in pipes.items()
        }
        target = res.model(spec["target"])
        rows, flips = [], []
        # redrawn between prompts only: no refresh thread while a method is timed
        progress = Progress(console=Console(stderr=True), transient=True, auto_refresh=False)
        task = progress.add_task("prompts", total=len(names) * per_suite)
        progress.start()
        for suite in names:
            ratios: dict[str, list[float]] = {k: [] for k in pipes}
            tokens = {k: 0 for k in pipes}
            forwards = {k: 0 for k in pipes}
            for i, item in enumerate(load_suite(suite)[:per_suite]):
                prompt = own.encode(item["prompt"])
                order = list(methods)
                order = order[i % len(order) :] + order[: i % len(order)]
                seconds, outputs = {}, {}
                for name in order:
                    run = methods[name].run(prompt, max_new_tokens)
                    seconds[name] = run.wall_s
                    outputs[name] = list(run.output_ids)
                    if name in pipes:
                        tokens[name] += len(run.output_ids)
                        forwards[name] += run.steps
                for name in pipes:
                    flip = differs(target, prompt, outputs[AR_RUNNER], outputs[name])
                    if flip is not None:
                        where = (
                            f"{suite} prompt {i}: {name} differs from plain decoding at token "
                            f"{flip.position} ({flip.got} for {flip.expected}; the target's two "
                            f"best logits {flip.margin:.1e} apart)"
                        )
                        if flip.margin >= NEAR_TIE:
                            raise SystemExit(where)
                        flips.append(where)
                    ratios[name].append(seconds[AR_RUNNER] / seconds[name])
                progress.advance(task)
                progress.refresh()
            rows.append(
                (
                    suite,
                    {k: (geometric_mean(v), tokens[k] / forwards[k]) for k, v in ratios.items()},
                )
            )
            progress.console.print(f"{suite} done")
        progress.stop()
    typer.echo(
        f"`{pipeline}`, {per_suite} prompt(s) per suite, {max_new_tokens} new tokens, "
        f"{threads} thread(s), float32; speedup over plain decoding through the runner "
        "(geometric mean over prompts), tau in parentheses"
    )
    typer.echo("| suite | own drafters | never-agreeing LM drafters |")
    typer.echo("|---|---|---|")
    for suite, cells in rows:
        good, bad = cells["own drafters"], cells["never agreeing"]
        typer.echo(f"| {suite} | {good[0]:.3f}x ({good[1]:.2f}) | {bad[0]:.3f}x ({bad[1]:.2f}) |")
    for where in flips:
        typer.echo(f"near-tie: {where}")


def differs(model: Any, prompt: torch.Tensor, plain: list[int], got: list[int]) -> Any:
    """None where `got` is plain decoding's output, else where and how it differs (`Mismatch`:
    position, tokens, the target's top-two logit margin there)."""
    same, mismatch = exactness(model, prompt, plain, got)
    return None if same else mismatch


if __name__ == "__main__":
    typer.run(main)
