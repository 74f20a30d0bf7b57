"""Feature-level drafter (EAGLE family): a small head over the target's own hidden states.

The target's runner keeps the final-norm hidden state of every committed token
(`CausalLMRunner.track_hidden`), computed by the verification forwards it runs anyway: no extra
target forward. At a step's root `r` (the last committed token) the head predicts the root's
feature from the previous token's, `f^_r = head(f_prev, embed(r))`; a node's children come from
the target's output head applied to the node's predicted feature, and a child's feature from its
parent's, `f^_c = head(f^_p, embed(c))`, so the head drafts any depth from its own predictions
(`treegraft.plugins.drafters.feature_head`). Each node's feature and distribution are computed
once per step, when the tree first shows it; `expand` (top-k children of the frontier) and
`score_tree` (a distribution after every node, one batched pass over the unseen nodes) share
them, so the drafter works as the weak or the strong drafter of a shared tree.

Before the target's first forward of a generation (the first step) there is no feature yet: the
drafter proposes nothing, and scores every token alike (a uniform distribution). Drafts only
steer what the target verifies, so the output stays exactly the target's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor

from treegraft.core.config import Check, between, field
from treegraft.core.interfaces import Drafter
from treegraft.core.model_files import hf_config, json_object, meta_model
from treegraft.core.resources import ModelRefError, Resources, resolve_model_path
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.attention_rules import text_config
from treegraft.core.runner.lean import lean_support
from treegraft.core.tree import DraftTree, Proposal
from treegraft.plugins.drafters.feature_head import (
    FeatureHead,
    HeadError,
    HeadSpec,
    check_weights,
    load_head,
    read_spec,
)
from treegraft.plugins.drafters.hf_lm import most_frequent_ids, scored_rows


@attrs.frozen
class EagleConfig:
    """Hyper-parameters of the feature-level drafter."""

    head: str = field(
        "zoo:head",
        doc="feature head: 'zoo:NAME' or a folder written by `treegraft zoo train-head`",
    )
    temperature: float = field(
        1.0, check=between(0.0, 100.0, open_low=True), doc="softmax temperature of the draft scores"
    )
    top_tokens: int | None = field(
        None,
        check=Check(">= 1 or null", lambda v: v is None or (isinstance(v, int) and v >= 1)),
        doc="score only this many of the most frequent tokens (by `token_counts`) plus the "
        "prompt's tokens; null: the whole vocabulary",
    )
    token_counts: str = field(
        "zoo:token-counts",
        doc="per-token counts ranking the vocabulary for `top_tokens`: 'zoo:token-counts', "
        "'zoo:smollm2-token-counts' or a JSON file written by `treegraft zoo token-counts`",
    )


@attrs.define
class EagleDrafter(Drafter):
    """Drafts from the target's features with a small head (see the module)."""

    Config = EagleConfig
    can_score = True
    reads_target_features = True

    config: EagleConfig
    target: CausalLMRunner
    net: FeatureHead
    #: `[K]` int64 the most frequent token ids (None: the whole vocabulary is scored)
    frequent: Tensor | None = None
    #: output rows scored this generation (`[K]`, None: all) and their weights (rows, bias)
    rows: Tensor | None = attrs.field(default=None, init=False)
    out: tuple[Tensor, Tensor | None] | None = attrs.field(default=None, init=False)
    node_feature: Tensor | None = attrs.field(default=None, init=False)  # [n_seen, hidden]
    node_logp: Tensor | None = attrs.field(default=None, init=False)  # [n_seen, K] scored rows
    #: this generation's prompt, whose tokens join the scored rows (`_head`)
    _prompt: Tensor | None = attrs.field(default=None, init=False)

    @classmethod
    def from_config(cls, config: EagleConfig, resources: Resources) -> EagleDrafter:
        target = getattr(resources, "target_runner", None)
        if target is None:
            raise ValueError(
                "head: the eagle drafter reads the target runner's hidden states; build it in a "
                "pipeline (load_pipeline), which hands the target runner to its drafters"
            )
        if not target.lean:  # checked now, not at the first generation
            why = None if target.forward == "transformers" else lean_support(target.model)
            raise ValueError(_not_lean(resources, why))
        embed = target.model.get_input_embeddings().weight  # [V, hidden]
        _fitting_head(config, resources.target_ref, target.vocab_size, embed.shape[1])
        try:
            net = load_head(config.head, dtype=target.dtype, device=target.device)
        except (FileNotFoundError, HeadError) as exc:  # the pipeline names the drafter's path
            raise ValueError(f"head: {exc}") from None
        frequent = _frequent(config, target.vocab_size, resources)
        return cls(config, target, net, frequent=frequent)

    @classmethod
    def check_config(cls, config: EagleConfig, resources: Resources) -> None:
        """The head loads and was made for the target's vocabulary and hidden size; the token
        counts ranking `top_tokens` fit it (read from the configs and the weights' header; no
        weights load)."""
        target = resources.target_ref
        # the target's forward as the pipeline plans it for a drafter reading its features
        if target and resources.plan.for_model(None, features=True).target == "transformers":
            raise ValueError(_not_lean(resources, None))
        if target and (why := _skeleton_lean_support(target)):
            raise ValueError(_not_lean(resources, why))
        sizes = _config_sizes(resources, target) if target else None
        folder, spec = _fitting_head(config, target, *(sizes or (None, None)))
        try:
            check_weights(config.head, folder, spec)
        except HeadError as exc:
            raise ValueError(f"head: {exc}") from None
        if sizes:
            _frequent(config, sizes[0], resources)

    def with_target(self, target: Any) -> EagleDrafter:
        """A copy reading `target`'s hidden states (same head and settings)."""
        target.track_hidden()
        return EagleDrafter(self.config, target, self.net, frequent=self.frequent)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.target.track_hidden()
        self.rows = self.out = None
        self._prompt = prompt
        self.node_feature = self.node_logp = None

    def _head(self) -> tuple[Tensor, Tensor | None]:
        """The output head's weights (and bias) over the rows scored this generation, gathered
        at its first use, not in `begin`: with `top_tokens` that copies thousands of the
        target's embedding rows, and a generation that never calls the head should not pay it."""
        if self.out is None:
            out = self.target.model.get_output_embeddings()
            weight, bias = out.weight.detach(), None if out.bias is None else out.bias.detach()
            if self.frequent is not None:
                self.rows = scored_rows(self.frequent, self._prompt).to(weight.device)
                weight = weight[self.rows]
                bias = None if bias is None else bias[self.rows]
            self.out = (weight, bias)
        return self.out

    def _previous_feature(self) -> Tensor | None:
        """`[hidden]` the target's feature of the token before the root (None before the first
        target forward, or where the target has not seen every committed token but the root)."""
        t = self.target
        if t.hidden is None or t.n_cached == 0 or t.n_cached != t.n_committed - 1:
            return None
        return t.hidden[t.n_cached - 1]

    def _score(self, tree: DraftTree) -> Tensor:
        """`[n, K]` log-probs over the scored rows (`rows`; all: `[n, V]`) after every node of
        `tree`, computing only the unseen nodes."""
        done = 0 if self.node_logp is None else self.node_logp.shape[0]
        n = tree.n_nodes
        if n > done:
            weight, _ = self._head()
            previous = self._previous_feature()
            if previous is None:  # no information: uniform (finite, so rescoring stays finite)
                k = weight.shape[0]
                logp = torch.full((n - done, k), -math.log(self.target.vocab_size))
            else:
                self.node_feature = self._features(tree, done, previous)  # [n, hidden]
                logp = self._log_probs(self.node_feature[done:])
            self.node_logp = logp if self.node_logp is None else torch.cat([self.node_logp, logp])
        return self.node_logp[:n]

    def _features(self, tree: DraftTree, done: int, previous: Tensor) -> Tensor:
        """`[n, hidden]` predicted features of every node: the known `done`, then the new ones
        a depth at a time (parents first), each from its parent's (the root's from `previous`)."""
        n = tree.n_nodes
        embed = self.target.model.get_input_embeddings().weight
        table = embed.new_empty(n + 1, embed.shape[1])  # row 0: the root's parent
        table[0] = previous
        if done:
            table[1 : done + 1] = self.node_feature
        parents = tree.parents[done:n].to(embed.device) + 1  # rows of `table`
        tokens = tree.tokens[done:n].to(embed.device)
        depth = tree.depth[done:n]
        for d in depth.unique().tolist():
            wave = (depth == d).nonzero().squeeze(1).to(embed.device)
            table[done + 1 + wave] = self.net(table[parents[wave]], embed[tokens[wave]])
        return table[1:]

    def _log_probs(self, features: Tensor) -> Tensor:
        """`[m, K]` float32 log-probs over the scored rows from the target's output head."""
        logits = F.linear(features, *self._head()).float()
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        return torch.log_softmax(logits, dim=-1)

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        if self._previous_feature() is None:  # nothing to draft from (the first step)
            return Proposal.empty(device=tree.device, dtype=tree.score.dtype)
        logp = self._score(tree)[nodes]  # [f, K]
        top = logp.topk(min(k, logp.shape[-1]), dim=-1)
        tokens = top.indices if self.rows is None else self.rows[top.indices]
        return Proposal(
            parents=nodes.repeat_interleave(top.indices.shape[1]),
            tokens=tokens.reshape(-1, 1).to(tree.device),
            logp=top.values.reshape(-1, 1).to(tree.score.dtype),
        )

    def score_tree(self, tree: DraftTree) -> Tensor:
        logp = self._score(tree)
        if self.rows is None:
            return logp
        full = logp.new_full((logp.shape[0], self.target.vocab_size), float("-inf"))
        full[:, self.rows] = logp  # unscored tokens: -inf (the rescorers keep their scores)
        return full

    def rewind(self) -> None:
        self.node_feature = self.node_logp = None

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        self.node_feature = self.node_logp = None  # the target keeps the committed features


def _not_lean(resources: Resources, why: str | None) -> str:
    """Why the eagle drafter cannot read the target's hidden states: the target `why` cannot
    run the lean forward (None: `decoding.forward` forwards it through transformers)."""
    kept = (
        "the eagle drafter reads the target's hidden states, and hidden states are kept only "
        "on the lean forward"
    )
    if why is not None:
        return f"{kept}, which the target {resources.target_ref!r} cannot run: {why}"
    return (
        f"{kept}; decoding.forward {resources.forward!r} forwards the target through "
        f"transformers here ({resources.plan.describe()}): use 'lean'"
    )


def _skeleton_lean_support(ref: str) -> str | None:
    """Why the model folder `ref` cannot run the lean forward, judged from its config (a
    meta-device skeleton; None: it can, or its config does not build, which the model checks
    tell)."""
    try:
        folder = resolve_model_path(ref)
    except ModelRefError:
        return None
    config = hf_config(folder)
    model = config if isinstance(config, str) else meta_model(folder, config)
    return None if isinstance(model, str) else lean_support(model.eval(), skeleton=True)


def _fitting_head(
    config: EagleConfig, target: str, vocab: int | None, hidden: int | None
) -> tuple[Path, HeadSpec]:
    """The folder and shape of the head `config.head`, refused (`ValueError` at `head`) unless
    it was made for a target of `vocab` tokens and `hidden` features (None: not known)."""
    try:
        folder, spec = read_spec(config.head)
    except (FileNotFoundError, HeadError) as exc:
        raise ValueError(f"head: {exc}") from None
    if vocab not in (None, spec.vocab_size) or hidden not in (None, spec.hidden_size):
        made = f" (distilled from {spec.target!r})" if spec.target else ""
        raise ValueError(
            f"head: {config.head!r} was made for a vocabulary of {spec.vocab_size} and hidden "
            f"size {spec.hidden_size}{made}; the target {target!r} has {vocab} and {hidden}: "
            "use a head distilled from this target (`treegraft zoo train-head`)"
        )
    return folder, spec


def _config_sizes(resources: Resources, ref: str) -> tuple[int, int | None]:
    """The vocabulary and hidden size of the model `ref` as its config states them (no weights
    load; hidden size None where the config states none)."""
    vocab = resources.vocab_size(ref)
    if ref in resources.models:
        config: Any = text_config(resources.models[ref].config).to_dict()
    else:
        config = json_object(resolve_model_path(ref) / "config.json")[0] or {}
        config = config.get("text_config", config)
    hidden = config.get("hidden_size") if isinstance(config, dict) else None
    ok = isinstance(hidden, int) and not isinstance(hidden, bool) and hidden > 0
    return vocab, hidden if ok else None


def _frequent(config: EagleConfig, vocab_size: int, resources: Resources) -> Tensor | None:
    """The `config.top_tokens` most frequent token ids (None without `top_tokens`)."""
    if config.top_tokens is None:
        return None
    owner = f"the target {resources.target_ref!r}" if resources.target_ref else "the target"
    return most_frequent_ids(
        resources, config.token_counts, config.top_tokens, vocab_size, owner, "top_tokens"
    )
