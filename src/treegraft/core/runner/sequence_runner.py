"""The runner of attention models verified by forwarding the whole sequence: one chain per step.

OpenAI GPT keeps no key/value cache, and its own `generate` forwards the whole sequence at every
step; DeepSeek-V4's cache pools compressed keys that cannot be cropped back (`chain_models`). None can
extend a cache by a draft tree, yet each reproduces its own greedy `generate` with a forward of
the whole sequence: `SequenceRunner` forwards the committed tokens and one draft chain (the
tree's best path, `decoder.trim_to_chain`: `verifies_trees` False) in one forward per step,
without a cache, and reads the chain's logits. The model applies its own causal order, so a
chain node's logits are those of the sequence up to it, which the load-time probe
(`state_check.probe_chains`) checks node by node; `model_check.probe_generate` checks that the
model's own `generate` decodes as that forward does.

A step costs a forward of the whole sequence (as these models' `generate` pays, or their full
forward would): the runner serves these models exactly, not fast. As an LM drafter, which
scores whole trees, such a model stays refused.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

from treegraft.core.errors import ArgumentError
from treegraft.core.runner.chain_models import (
    CACHE_ARGUMENTS,
    OWN_CACHE,
    WHOLE_SEQUENCE,
    chain_route,
)
from treegraft.core.runner.chain_tokens import append_tokens, begin_tokens
from treegraft.core.runner.forwards import quiet_outputs
from treegraft.core.runner.kv_cache import accepted_nodes, output_rows
from treegraft.core.runner.latency import measure_latency
from treegraft.core.runner.placement import input_device
from treegraft.core.runner.state_models import has_state_layers
from treegraft.core.runner.state_runner import StateRunner, chain_problem, forward_problem
from treegraft.core.tree import DraftTree


@attrs.define
class SequenceRunner:
    """Runs an attention model over the whole committed sequence and one draft chain per step.

    Attributes:
        model: an `AutoModelForCausalLM` (eval mode) whose chains `chain_models` routes here.
        forward: `auto` or `transformers` (both: the model's own forward).
        committed: `[capacity]` int64 committed tokens (the prompt's included).
        n_committed: how many of `committed` are valid.
        n_cached: always 0: every forward reads the whole sequence.
        n_seen: chain nodes forwarded this step (the root first; 0: none yet).
        output_rows: `[K]` token ids the logits are returned for (None: the whole vocabulary).
        forwards: model forwards this runner has run.
    """

    model: Any
    forward: str = attrs.field(default="auto", kw_only=True)
    committed: Tensor | None = None
    n_committed: int = 0
    n_cached: int = 0
    n_seen: int = 0
    forwards: int = 0
    output_rows: Tensor | None = None
    _kwargs: dict[str, Any] = attrs.field(init=False, factory=dict)

    #: the decoder verifies one chain per step (the tree's best path) with this runner
    verifies_trees = False
    attention = "sdpa"
    lean = False
    bitwise = True
    hidden = None

    def __attrs_post_init__(self) -> None:
        if (why := forward_problem(self.model, self.forward)) is not None:
            raise ArgumentError(f"forward: {why}")
        params = inspect.signature(self.model.forward).parameters
        self._kwargs = dict(quiet_outputs(self.model))
        if "use_cache" in params:
            self._kwargs["use_cache"] = False
        if CACHE_ARGUMENTS & set(params):
            warnings.warn(slower_than_generate(self.model), WholeSequenceWarning, stacklevel=3)

    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def n_outputs(self) -> int:
        return self.vocab_size if self.output_rows is None else int(self.output_rows.shape[0])

    @property
    def capacity(self) -> int:
        return 0 if self.committed is None else int(self.committed.shape[0])

    def restrict_output(self, rows: Tensor | None) -> None:
        """Return logits only for the token ids `rows` (`[K]`, distinct, in the vocabulary), or
        again for all (None). The model still computes every logit."""
        self.output_rows = None if rows is None else output_rows(rows, self.vocab_size)
        if self.output_rows is not None:
            self.output_rows = self.output_rows.to(self.device)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        """Start a generation from `prompt` (`[T]` token ids; `max_len`: the longest sequence
        it reaches)."""
        self.committed = begin_tokens(
            prompt, max_len, device=self.device, where="SequenceRunner.begin"
        )
        self.n_committed, self.n_seen = prompt.numel(), 0

    def forward_tree(self, tree: DraftTree) -> Tensor:
        """Forward the committed tokens and the chain `tree` (its root the last committed
        token) in one forward. Returns the logits of its nodes `[n, V]` (`[n, K]`
        restricted). A tree with a fork raises `ArgumentError`."""
        where = f"SequenceRunner.forward_tree ({type(self.model).__name__})"
        if self.committed is None:
            raise ArgumentError(f"{where}: no generation begun: call begin(prompt, max_len=...)")
        if not isinstance(tree, DraftTree):
            raise ArgumentError(f"{where}: tree: expected a DraftTree, got {type(tree).__name__}")
        if (why := chain_problem(tree)) is not None:
            raise ArgumentError(
                f"{where}: tree: it verifies one chain per step, but the tree is not a chain: {why}"
            )
        before = self.committed[: self.n_committed - 1]
        ids = torch.cat([before, tree.tokens.to(self.device)])  # [n_committed - 1 + n]
        logits = self._run(ids, n_logits=tree.n_nodes)
        self.n_seen = tree.n_nodes
        return logits

    def _run(self, ids: Tensor, *, n_logits: int) -> Tensor:
        """One forward of the whole sequence `ids`, without a cache, as `generate`'s first
        forward runs (no positions handed: the model numbers the tokens 0 .. n - 1 itself,
        which the probe checks against the positions `generate` hands); the last `n_logits`
        rows."""
        out = self.model(input_ids=ids[None], **self._kwargs)
        self.forwards += 1
        logits = out.logits[0, ids.shape[0] - n_logits :]
        return logits if self.output_rows is None else logits[:, self.output_rows]

    def rewind(self) -> None:
        """Drop this step's forward: nothing is kept from it."""
        self.n_seen = 0

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        """Append `tokens` (the accepted drafts, then the bonus), `accepted` being the chain's
        first nodes (`[a]`: 0 .. a - 1)."""
        nodes = accepted_nodes(accepted, tokens, where="SequenceRunner.commit")
        if nodes != list(range(len(nodes))) or (self.n_seen and len(nodes) > self.n_seen):
            last = self.n_seen - 1 if self.n_seen else "a - 1"
            raise ArgumentError(
                f"SequenceRunner.commit: accepted: expected the first nodes 0 .. {last} of the "
                f"chain forwarded this step, got {nodes}"
            )
        self.committed = append_tokens(self.committed, self.n_committed, tokens)
        self.n_committed, self.n_seen = self.n_committed + len(nodes), 0

    def skip_prefill(self) -> None:
        """For timing (`measure_latency`): nothing to skip, every forward reads the sequence."""
        self.n_seen = 0

    def committed_ids(self) -> Tensor:
        """`[n_committed]` int64 view of the committed tokens."""
        return self.committed[: self.n_committed]

    def track_hidden(self) -> None:
        """Refused: hidden states are kept on the lean forward only, which this model lacks."""
        raise ValueError(
            f"hidden states are kept only on the lean forward, which {type(self.model).__name__} "
            "(verified a chain per step through its own forward) does not take: a "
            "feature-level drafter cannot read this target"
        )

    hidden_states = track_hidden  # refused alike

    def latency_curve(self, queries: Sequence[int], *, context: int, repeats: int = 3) -> Any:
        """This model's `LatencyCurve` over chains of `queries` tokens after `context` tokens,
        measured with a fresh runner."""
        ref = getattr(self.model, "name_or_path", "") or "target"
        fresh = SequenceRunner(self.model, forward=self.forward)
        return measure_latency(fresh, ref, context=context, queries=queries, repeats=repeats)


class WholeSequenceWarning(UserWarning):
    """A target whose own `generate` reads a cache, verified here by whole-sequence forwards."""


def slower_than_generate(model: Any) -> str:
    """The warning for a `SequenceRunner` over a model whose own `generate` keeps a cache
    (DeepSeek-V4): each step re-reads the whole sequence, which its `generate` does not."""
    return (
        f"{type(model).__name__} is verified by forwarding the whole sequence at every step (its "
        "cache cannot roll rejected drafts back), while its own `generate` reads its cache: a "
        "step's cost grows with the context, so on long prompts or outputs expect the pipeline "
        "slower than plain `generate` (the output stays exact)"
    )


def chain_runner(model: Any) -> type | None:
    """The runner class that verifies `model`'s chains as a target: `SequenceRunner` where
    `chain_models.chain_route` says `WHOLE_SEQUENCE`, `StateRunner` where its layers carry a
    state or the route is `OWN_CACHE`; None for a model whose target verifies trees."""
    route = chain_route(model)
    if route == WHOLE_SEQUENCE:
        return SequenceRunner
    if route == OWN_CACHE or has_state_layers(model.config):
        return StateRunner
    return None
