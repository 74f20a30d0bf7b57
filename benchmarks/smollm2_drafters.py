"""Truncated self-drafters of SmolLM2: top-1 agreement with the target and forward cost, per depth.

For each zoo suite, the target (`zoo:smollm2`) greedily continues the suite's first prompts (chat
template, `--tokens` new tokens). One forward of the full model over prompt + continuation gives
every layer's hidden states; the early exit after layer L (final norm + tied head, exactly what
`truncate_model` builds) is the L-layer drafter's prediction. Agreement = fraction of continuation
positions where its top-1 equals the target's greedy token (teacher-forced, the quantity a chain of
one draft token accepts). Cost = median time of a forward of 1 and 16 tokens after `--context`
cached tokens, truncated model over full model, rounds interleaved so load drifts hit both.
`--drafter REF` measures a drafter model the same way (e.g. the distilled `zoo:smollm2-draft-l`);
with `--head K` its agreement and cost are also reported with `hf_lm`'s restricted head: the `K`
most frequent tokens by `--token-counts` plus the prompt's tokens. Run from the repository root
(needs the cached or fetchable zoo:smollm2):

    OMP_NUM_THREADS=1 python benchmarks/smollm2_drafters.py --layers 2 --layers 4
    OMP_NUM_THREADS=1 python benchmarks/smollm2_drafters.py --layers 4 \
        --drafter zoo:smollm2-draft-l --head 4096
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Annotated

import torch
import typer
from transformers import AutoModelForCausalLM, AutoTokenizer

from treegraft import zoo
from treegraft.core.chat import chat_ids
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.latency import chain_tree


def continuations(model, tokenizer, prompts: int, tokens: int) -> list[tuple[list[int], int]]:
    """`(prompt + greedy continuation ids, prompt length)` for the first prompts of each suite."""
    out = []
    for suite in zoo.SUITES:
        for row in zoo.load_suite(suite)[:prompts]:
            ids = torch.tensor([chat_ids(tokenizer, row["prompt"])])
            full = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False
            )
            out.append((full[0].tolist(), ids.shape[1]))
    return out


def agreement(model, seqs: list[tuple[list[int], int]], layers: list[int]) -> dict[int, float]:
    """Per depth L, the fraction of continuation positions where the L-layer exit's top-1 equals
    the target's next token."""
    hits = dict.fromkeys(layers, 0)
    total = 0
    for ids, n_prompt in seqs:
        x = torch.tensor([ids])
        hidden = model(x, output_hidden_states=True).hidden_states  # L+1 x [1, T, H]
        target = x[0, n_prompt:]  # [n_new] the greedy tokens
        for layer in layers:
            h = hidden[layer][0, n_prompt - 1 : -1]  # [n_new, H]
            hits[layer] += int((model.lm_head(model.model.norm(h)).argmax(-1) == target).sum())
        total += target.numel()
    return {layer: hits[layer] / total for layer in layers}


def drafter_agreement(
    drafter, seqs: list[tuple[list[int], int]], frequent: torch.Tensor | None
) -> tuple[float, float | None]:
    """(agreement over the whole vocabulary, agreement with the restricted head or None): the
    fraction of continuation positions where `drafter`'s top-1 is the target's greedy token."""
    hits = head_hits = total = 0
    for ids, n_prompt in seqs:
        x = torch.tensor([ids])
        logits = drafter(x).logits[0, n_prompt - 1 : -1]  # [n_new, V]
        target = x[0, n_prompt:]
        hits += int((logits.argmax(-1) == target).sum())
        if frequent is not None:
            rows = torch.unique(torch.cat([frequent, x[0, :n_prompt]]))
            head_hits += int((rows[logits[:, rows].argmax(-1)] == target).sum())
        total += target.numel()
    return hits / total, None if frequent is None else head_hits / total


def truncated(model, layers: int):
    """An in-memory copy of `model` cut to its first `layers` layers (same as truncate_model)."""
    cut = copy.deepcopy(model)
    cut.model.layers = cut.model.layers[:layers]
    cut.config.num_hidden_layers = layers
    return cut


def forward_ms(
    model, context: torch.Tensor, q: int, repeats: int, rows: torch.Tensor | None = None
) -> float:
    """Median ms of a q-token chain forward through the project's runner after `context` cached
    tokens (the same chain each time, rewound after each); `rows`: a restricted output head."""
    runner = CausalLMRunner(model, forward="auto")
    runner.begin(context, max_len=context.numel() + 64)
    if rows is not None:
        runner.restrict_output(rows)
    vocab = int(model.config.vocab_size)
    runner.forward_tree(chain_tree(context[-1], 1, vocab, torch.Generator()))  # prefill
    runner.commit(torch.zeros(1, dtype=torch.long), torch.tensor([5]))
    tree = chain_tree(runner.committed_ids()[-1], q, vocab, torch.Generator().manual_seed(q))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.forward_tree(tree)
        times.append(time.perf_counter() - start)
        runner.rewind()
    return 1000 * statistics.median(times)


def main(
    layers: Annotated[list[int], typer.Option(help="depths to measure")] = [2, 4, 6, 8, 12],  # noqa: B006
    prompts: Annotated[int, typer.Option(help="prompts per suite")] = 1,
    tokens: Annotated[int, typer.Option(help="greedy tokens per prompt")] = 48,
    context: Annotated[int, typer.Option(help="cached tokens before a timed forward")] = 256,
    rounds: Annotated[int, typer.Option(help="interleaved timing rounds")] = 3,
    repeats: Annotated[int, typer.Option(help="timed forwards per round")] = 5,
    drafter: Annotated[list[str], typer.Option(help="drafter models to measure too")] = [],  # noqa: B006
    head: Annotated[int | None, typer.Option(help="restricted head size for --drafter")] = None,
    token_counts: Annotated[
        str, typer.Option(help="counts ranking the head's tokens")
    ] = "zoo:smollm2-token-counts",
) -> None:
    torch.manual_seed(0)
    path = zoo.resolve("zoo:smollm2")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.inference_mode():
        seqs = continuations(model, tokenizer, prompts, tokens)
        agree = agreement(model, seqs, layers)
        n = sum(len(ids) - p for ids, p in seqs)
        print(f"{len(seqs)} prompts, {n} continuation tokens; top-1 agreement per depth: {agree}")
        ctx = torch.tensor(seqs[0][0] * (context // len(seqs[0][0]) + 1))[:context]
        cuts = {layer: truncated(model, layer) for layer in layers}
        frequent = None
        if head is not None:
            from treegraft.zoo.token_counts import load_counts, most_frequent

            frequent = torch.from_numpy(most_frequent(load_counts(token_counts), head).copy())
        drafters = {
            ref: AutoModelForCausalLM.from_pretrained(zoo.resolve(ref), dtype=torch.float32).eval()
            for ref in drafter
        }
        drafter_agree = {ref: drafter_agreement(m, seqs, frequent) for ref, m in drafters.items()}
        head_rows = None if frequent is None else torch.unique(torch.cat([frequent, ctx]))
        for ref, m in drafters.items():
            cuts[ref] = m
            if head_rows is not None:
                cuts[(ref, "head")] = m
        ratios: dict[tuple[int, int], list[float]] = {}
        full_ms: dict[int, list[float]] = {}
        for _ in range(rounds):
            for q in (1, 16):
                full = forward_ms(model, ctx, q, repeats)
                full_ms.setdefault(q, []).append(full)
                for layer, cut in cuts.items():
                    rows = head_rows if isinstance(layer, tuple) else None
                    ratios.setdefault((layer, q), []).append(
                        forward_ms(cut, ctx, q, repeats, rows) / full
                    )
    ms1, ms16 = statistics.median(full_ms[1]), statistics.median(full_ms[16])
    print(
        f"full model forward after {context} tokens: 1 token {ms1:.1f} ms, 16 tokens {ms16:.1f} ms"
    )
    print("| layers | top-1 agreement | cost, 1 token | cost, 16 tokens |")
    print("| --- | --- | --- | --- |")
    for layer in layers:
        c1, c16 = (statistics.median(ratios[(layer, q)]) for q in (1, 16))
        print(f"| {layer} | {agree[layer]:.3f} | {c1:.2f} | {c16:.2f} |")
    for ref, (whole, restricted) in drafter_agree.items():
        c1, c16 = (statistics.median(ratios[(ref, q)]) for q in (1, 16))
        print(f"| {ref} | {whole:.3f} | {c1:.2f} | {c16:.2f} |")
        if restricted is not None:
            c1, c16 = (statistics.median(ratios[((ref, "head"), q)]) for q in (1, 16))
            print(f"| {ref}, head {head} | {restricted:.3f} | {c1:.2f} | {c16:.2f} |")


if __name__ == "__main__":
    typer.run(main)
