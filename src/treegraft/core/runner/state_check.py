"""The load-time probe of a target verified one chain per step (a model with state layers, or
an attention model that takes no draft tree's mask: `chain_models`): its chain runner's
forwards (`StateRunner`'s, `SequenceRunner`'s), with commits that roll drafts back, against
the model's own forward of the sequence up to each chain node (as `model_check.probe_model`
checks a tree runner's), and on a float64 copy of its architecture in half precision."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from treegraft.core.runner.model_check import (
    Unchecked,
    difference,
    first_line,
    non_finite,
    on_wide_copy,
    own_forward,
    tolerance,
)
from treegraft.core.runner.placement import input_device
from treegraft.core.runner.sequence_runner import chain_runner
from treegraft.core.runner.state_runner import StateRunner, forward_problem, probe_length
from treegraft.core.tree import DraftTree

#: the probe's steps: tokens drafted in a chain, and how many of them are kept at commit (a
#: rollback of two, none, all of them, then one more chain after the last rollback)
PROBE_CHAINS = ((4, 2), (3, 3), (2, 0), (3, 1))


def probe_chains(
    model: Any,
    *,
    forward: str = "auto",
    seed: int = 0,
    copies: dict | None = None,
    runner: Callable[..., Any] | None = None,
) -> str | None:
    """None when the chain forwards of `model`'s runner (`runner`, default the one
    `sequence_runner.chain_runner` names, else `StateRunner`), with commits that crop rejected
    drafts off, give at each chain node the logits of its own forward of the tokens up to that
    node; else what differed (and, for a half-precision model, on a float64 copy of its
    architecture too, as `model_check.probe_model`)."""
    if (why := forward_problem(model, forward)) is not None:
        return f"decoding.forward: {why}"
    runner = runner or chain_runner(model) or StateRunner
    try:
        why = probe_chain_steps(model, forward, seed, runner)
    except Unchecked as err:
        return str(err)
    except Exception as err:  # any failure means: not servable; the message says which
        return f"a chain forward failed with {type(err).__name__}: {first_line(err)}"
    if why is None:
        why = on_wide_copy(
            model, lambda wide: probe_chain_steps(wide, forward, seed, runner), copies
        )
    return why


def probe_chain_steps(
    model: Any, forward: str, seed: int, runner: Callable[..., Any] = StateRunner
) -> str | None:
    """`probe_chains`' steps on `model` itself through `runner` (a chain runner's class): what
    differed, None where nothing did; raises where a forward fails, `Unchecked` where the
    model's own logits are not finite."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rng = torch.Generator().manual_seed(seed)
    device = input_device(model)
    sequence = torch.randint(0, vocab, (probe_length(model),), generator=rng)
    chains = runner(model, forward=forward)
    chains.begin(sequence.to(device), max_len=sequence.numel() + 32)
    tol = tolerance(chains.dtype)
    with torch.inference_mode():
        for step, (drafts, kept) in enumerate(PROBE_CHAINS):
            chain = torch.cat([sequence[-1:], torch.randint(0, vocab, (drafts,), generator=rng)])
            tree = DraftTree.from_parents(chain, torch.arange(-1, drafts))
            logits = chains.forward_tree(tree).float()
            own = _own_logits(model, torch.cat([sequence, chain[1:]]).to(device), drafts + 1)
            if (why := non_finite(own, chains.dtype)) is not None:
                raise Unchecked(why)
            for node in range(drafts + 1):
                diff, scale = difference(logits[node], own[node])
                if not diff <= tol * scale:
                    after = "" if step == 0 else f" after {step} commit(s) that rolled drafts back"
                    return (
                        f"a chain forward gives logits that differ from the model's own forward "
                        f"by {diff:.3g} (allowed: {tol * scale:.3g}) at node {node} of the "
                        f"chain{after}"
                    )
            bonus = torch.randint(0, vocab, (1,), generator=rng)
            tokens = torch.cat([chain[1 : kept + 1], bonus])
            chains.commit(torch.arange(kept + 1), tokens)
            sequence = torch.cat([sequence, tokens])
    return None


def _own_logits(model: Any, ids: Tensor, n: int) -> Tensor:
    """`[n, V]` float32 logits of the last `n` tokens of `ids` (`[T]`), each from the model's
    own forward of the tokens up to it: a later token may not change an earlier one's (a
    bidirectional model's would; a whole sequence's forward would hide that)."""
    rows = [
        own_forward(model, ids[: ids.numel() - n + i + 1][None]).logits[0, -1] for i in range(n)
    ]
    return torch.stack(rows).float()
