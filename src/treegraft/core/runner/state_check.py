"""The load-time probe of a model with state layers: `StateRunner`'s chain forwards, with
commits that roll drafts back, against the model's own forward (as `model_check.probe_model`
checks a tree runner's), and on a float64 copy of its architecture in half precision."""

from __future__ import annotations

from typing import Any

import torch

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
from treegraft.core.runner.state_runner import StateRunner, forward_problem, probe_length
from treegraft.core.tree import DraftTree

#: the probe's steps: tokens drafted in a chain, and how many of them are kept at commit (a
#: rollback of two, none, all of them, then one more chain after the last rollback)
PROBE_CHAINS = ((4, 2), (3, 3), (2, 0), (3, 1))


def probe_chains(
    model: Any, *, forward: str = "auto", seed: int = 0, copies: dict | None = None
) -> str | None:
    """None when `StateRunner`'s chain forwards of `model`, with commits that crop rejected
    drafts off, give the logits of its own forward of the same tokens in sequence; else what
    differed (and, for a half-precision model, on a float64 copy of its architecture too, as
    `model_check.probe_model`)."""
    if (why := forward_problem(model, forward)) is not None:
        return f"decoding.forward: {why}"
    try:
        why = probe_chain_steps(model, forward, seed)
    except Unchecked as err:
        return str(err)
    except Exception as err:  # any failure means: not servable; the message says which
        return f"a chain forward failed with {type(err).__name__}: {first_line(err)}"
    if why is None:
        why = on_wide_copy(model, lambda wide: probe_chain_steps(wide, forward, seed), copies)
    return why


def probe_chain_steps(model: Any, forward: str, seed: int) -> str | None:
    """`probe_chains`' steps on `model` itself: what differed, None where nothing did; raises
    where a forward fails, `Unchecked` where the model's own logits are not finite."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rng = torch.Generator().manual_seed(seed)
    device = input_device(model)
    sequence = torch.randint(0, vocab, (probe_length(model),), generator=rng)
    runner = StateRunner(model, forward=forward)
    runner.begin(sequence.to(device), max_len=sequence.numel() + 32)
    tol = tolerance(runner.dtype)
    with torch.inference_mode():
        for step, (drafts, kept) in enumerate(PROBE_CHAINS):
            chain = torch.cat([sequence[-1:], torch.randint(0, vocab, (drafts,), generator=rng)])
            tree = DraftTree.from_parents(chain, torch.arange(-1, drafts))
            logits = runner.forward_tree(tree).float()
            ids = torch.cat([sequence, chain[1:]]).to(device)[None]
            own = own_forward(model, ids).logits[0, sequence.numel() - 1 :].float()
            if (why := non_finite(own, runner.dtype)) is not None:
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
            runner.commit(torch.arange(kept + 1), tokens)
            sequence = torch.cat([sequence, tokens])
    return None
