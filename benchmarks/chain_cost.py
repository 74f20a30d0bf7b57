"""What a greedy chain costs an LM drafter to draft: token by token through `expand`, or at once.

The layered builder drafts silent steps' chains (`silent_chain`) with the drafter's `chain`
where it has one (the `hf_lm` drafter: one `CausalLMRunner.forward_chain` per token, no tree
built, no mask on the lean forward), else with one `expand` of the chain's last node per token
(a tree extended, its frontier chosen, the forward's mask built each time). This script drafts
the same chains both ways, side by side: for each zoo LM drafter (the shipped `head: 2048`,
float32, the pipeline's default forward), after `--context` prompt tokens, rounds alternate
between two drafters over the same model, each drafting `--steps` chains of `--length` tokens
(no confidence stop) and committing the first two tokens of each, as a decode would. Prints the
median over rounds of the microseconds per drafted token each way and their ratio, and checks
that both drafted the same tokens. Run from the repository root:

    python benchmarks/chain_cost.py                         # every zoo LM drafter, 5 rounds
    python benchmarks/chain_cost.py draft-s --length 4 --rounds 9
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import torch
import typer

from treegraft.core.resources import Resources
from treegraft.core.tree import DraftTree
from treegraft.plugins.builders.layered import expand_frontier
from treegraft.plugins.drafters.hf_lm import HFLMConfig, HFLMDrafter


def by_expand(drafter: HFLMDrafter, root: int, length: int) -> DraftTree:
    """The chain as one `expand` of its last node per token (the builder without `chain`)."""
    tree = DraftTree.from_root(root)
    frontier = torch.zeros(1, dtype=torch.long)
    for _ in range(length):
        tree, frontier = expand_frontier(drafter, 1, tree, frontier, 1)
    return tree


def at_once(drafter: HFLMDrafter, root: int, length: int) -> DraftTree:
    tree = DraftTree.from_root(root)
    proposal = drafter.chain(tree, length, 1e-30)  # no confidence stop: `length` tokens
    return tree.extend(proposal, 1)[0]


WAYS = {"expand": by_expand, "chain": at_once}


def draft(drafter: HFLMDrafter, way: str, prompt: torch.Tensor, length: int, steps: int):
    """Seconds spent drafting `steps` chains (commits excluded) and the tokens drafted."""
    drafter.begin(prompt, max_len=prompt.numel() + 4 * steps + length + 8)
    root, seconds, tokens = int(prompt[-1]), 0.0, []
    for _ in range(steps):
        start = time.perf_counter()
        tree = WAYS[way](drafter, root, length)
        seconds += time.perf_counter() - start
        chain = tree.tokens[1:].tolist()
        tokens.append(chain)
        new = chain[:2]  # two drafts accepted (the second stands in for the bonus token)
        drafter.commit(torch.arange(len(new)), torch.tensor(new))
        root = new[-1]
    return seconds, tokens


def main(
    models: Annotated[list[str] | None, typer.Argument(help="zoo LM drafter names")] = None,
    length: Annotated[int, typer.Option(min=1, help="tokens per chain")] = 8,
    steps: Annotated[int, typer.Option(min=1, help="chains per round")] = 40,
    context: Annotated[int, typer.Option(min=2, help="prompt tokens")] = 200,
    rounds: Annotated[int, typer.Option(min=1)] = 5,
    threads: Annotated[int, typer.Option(min=1)] = 2,
) -> None:
    torch.set_num_threads(threads)
    res = Resources.create(device="cpu", dtype="float32")
    prompt = torch.randint(8192, (context,), generator=torch.Generator().manual_seed(0))
    for name in models or ["draft-s", "draft-m", "draft-l"]:
        config = HFLMConfig(model=f"zoo:{name}", head=2048)
        drafters = {way: HFLMDrafter.from_config(config, res) for way in WAYS}
        per_token: dict[str, list[float]] = {way: [] for way in WAYS}
        with torch.inference_mode():
            for way, drafter in drafters.items():  # warm-up, untimed
                draft(drafter, way, prompt, length, 2)
            for r in range(rounds):
                drafted = {}
                for way in WAYS if r % 2 == 0 else reversed(WAYS):
                    seconds, drafted[way] = draft(drafters[way], way, prompt, length, steps)
                    per_token[way].append(1e6 * seconds / (steps * length))
                if drafted["expand"] != drafted["chain"]:
                    raise SystemExit(f"{name}: the two ways drafted different tokens")
        median = {way: statistics.median(values) for way, values in per_token.items()}
        print(
            f"{name}: us per drafted token, median of {rounds} rounds: expand "
            f"{median['expand']:.1f}, chain {median['chain']:.1f} "
            f"(expand / chain x{median['expand'] / median['chain']:.2f})"
        )


if __name__ == "__main__":
    typer.run(main)
