"""The runner of models whose layers carry a state: verification of one chain per step.

A recurrent, linear-attention or convolutional layer (Mamba, Qwen3-Next's and Qwen3.5's gated
delta nets, Jamba, LFM2's short convolutions, ...) folds each token into a state carried to the
next one. A draft tree would need that state branched at every fork, which the model's own
layers cannot do; a chain needs none: its tokens follow one another as in decoding. So
`StateRunner` verifies the draft as one chain per step (`verifies_trees` False: the decoder keeps
the tree's best path, `decoder.trim_to_chain`), through the model's **own** cache and forward,
as its own assisted `generate` does: the chain is forwarded after the committed tokens with past
recording on (`Cache.activate_past_recording`: the layers keep the states of the chain's last
tokens), and the rejected tail is cropped off at commit (`Cache.crop`). A model whose cache
cannot crop its state (`state_models.rollback_by_snapshot`: ZAYA, MiniMax, RWKV, xLSTM)
is rolled back by snapshot instead: its state tensors are copied before the step's forward
(`state_snapshot`), and where drafts are rejected they are put back, the attention keys cut
back by length, and the kept tokens forwarded again (a lone kept root waits for the next
step's forward instead). The model builds its own masks and positions, so every attention rule
it has (windows, chunks, per-layer types) is its own. Which models qualify and which cannot
(their forward cannot continue a chain, or their state lies beyond any rollback) is
`state_models`' to say; the load-time probe `state_check.probe_chains` checks each model's
chain forwards and rollbacks against its own forward, as `model_check.probe_model` checks
trees.

A state model serves as the **target**; not as an LM drafter, whose forwards score trees.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

from treegraft.core.errors import ArgumentError
from treegraft.core.runner.chain_tokens import append_tokens, begin_tokens
from treegraft.core.runner.forwards import generate_hands_positions, quiet_outputs
from treegraft.core.runner.kv_cache import accepted_nodes, output_rows
from treegraft.core.runner.latency import measure_latency
from treegraft.core.runner.placement import input_device
from treegraft.core.runner.state_models import (
    cache_keyword,
    has_state_layers,
    new_state_cache,
    rollback_by_snapshot,
)
from treegraft.core.runner.state_snapshot import crop_keys, restore_snapshot, take_snapshot
from treegraft.core.tree import DraftTree
from treegraft.kernels.tree_attention.hf import IMPLEMENTATION

#: forwards a state model's runner takes (`decoding.forward`): its own, through `transformers`
STATE_FORWARDS = ("auto", "transformers")


def forward_problem(model: Any, forward: str) -> str | None:
    """Why `model`, verified one chain per step (its layers carry a state, or its attention
    takes no draft tree's mask: `chain_models`), cannot run with the runner forward `forward`
    (None: it can): it runs its own forward only (`decoding.forward: auto` or `transformers`)."""
    name = type(model).__name__
    if forward not in STATE_FORWARDS:
        return (
            f"{name} {_chain_cause(model)} and runs only its own forward "
            "(the lean forward, which decoding.forward lean and lean-fast run, serves attention "
            f"layers only); expected one of {', '.join(STATE_FORWARDS)}, got the runner "
            f"forward {forward!r}"
        )
    if getattr(model.config, "_attn_implementation", None) == IMPLEMENTATION:
        return _tree_problem(model)
    return None


def setting_problem(model: Any, setting: str) -> str | None:
    """`forward_problem` for the setting `decoding.forward: setting` (before the model loads:
    `treegraft validate` reads a skeleton of it)."""
    if setting == "tree":
        return _tree_problem(model)
    return forward_problem(model, "lean" if setting in ("lean", "lean-fast") else setting)


def _tree_problem(model: Any) -> str:
    return (
        f"{type(model).__name__} {_chain_cause(model)} and verifies one chain per step "
        "through its own forward, which the tree-attention kernel does not serve "
        "(decoding.forward: tree): use auto or transformers"
    )


def _chain_cause(model: Any) -> str:
    """Why `model` verifies chains: its layers' state, or its attention (`chain_models`)."""
    if has_state_layers(model.config):
        return "keeps a recurrent state in its layers"
    return "takes no draft tree's attention mask"


def chain_problem(tree: DraftTree, start: int = 0) -> str | None:
    """Why the nodes `start ..` of `tree` do not extend a chain from its root (each node the
    child of the one before it); None where they do."""
    parents = tree.parents[start:].tolist()
    for offset, parent in enumerate(parents):
        node = start + offset
        if node > 0 and parent != node - 1:
            return f"node {node}'s parent is {parent}, not {node - 1}"
    return None


@attrs.define
class StateRunner:
    """Runs a model with state layers over committed tokens and one draft chain per step.

    Attributes:
        model: an `AutoModelForCausalLM` whose layers carry a state (eval mode).
        forward: `auto` or `transformers` (both: the model's own forward; the lean forwards
            read attention layers only).
        cache: the model's own cache of this generation (None until `begin`, and until the
            first forward where the model builds its own).
        committed: `[n_committed]` int64 committed tokens (the prompt's included).
        n_committed: how many of `committed` are valid.
        n_cached: committed tokens the cache holds (all but the last after a step's commit).
        n_pending: committed tokens forwarded in this step's block before the chain.
        n_seen: chain nodes forwarded this step (the root first).
        output_rows: `[K]` token ids the logits are returned for (None: the whole vocabulary).
        forwards: model forwards this runner has run (a rollback by snapshot's forward of the
            kept tokens counted).
        snapshots: whether rejected drafts are rolled back by snapshot rather than by crop
            (`state_models.rollback_by_snapshot`).
    """

    model: Any
    forward: str = attrs.field(default="auto", kw_only=True)
    cache: Any = None
    committed: Tensor | None = None
    n_committed: int = 0
    n_cached: int = 0
    n_pending: int = 0
    n_seen: int = 0
    forwards: int = 0
    output_rows: Tensor | None = None
    snapshots: bool = attrs.field(init=False, default=False)
    #: the state tensors before this step's forward (rollback by snapshot; None: none taken)
    _snapshot: list[Tensor] | None = attrs.field(init=False, default=None)
    #: the chain's states the cache keeps for a rollback (grown when a longer chain comes)
    _recorded: int = attrs.field(init=False, default=0)
    _cache_kwarg: str = attrs.field(init=False, default="cache")
    _quiet: dict[str, bool] = attrs.field(init=False, factory=dict)
    _positions: bool = attrs.field(init=False, default=False)
    _logits_to_keep: bool = attrs.field(init=False, default=True)

    #: the decoder verifies one chain per step (the tree's best path) with this runner
    verifies_trees = False
    attention = "sdpa"
    lean = False
    bitwise = True
    hidden = None

    def __attrs_post_init__(self) -> None:
        if (why := forward_problem(self.model, self.forward)) is not None:
            raise ArgumentError(f"forward: {why}")
        self._cache_kwarg = cache_keyword(self.model)
        self._quiet = quiet_outputs(self.model)
        self._positions = generate_hands_positions(self.model)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.snapshots = rollback_by_snapshot(self.model)

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
        if rows is None:
            self.output_rows = None
            return
        rows = output_rows(rows, self.vocab_size)
        self.output_rows = rows.to(self.device)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        """Start a generation with a fresh cache (`max_len`: the longest sequence it reaches)."""
        self.committed = begin_tokens(
            prompt, max_len, device=self.device, where="StateRunner.begin"
        )
        self.cache, self._recorded, self._snapshot = new_state_cache(self.model), 0, None
        self.n_committed = prompt.numel()
        self.n_cached = self.n_pending = self.n_seen = 0

    def forward_tree(self, tree: DraftTree) -> Tensor:
        """Forward the chain `tree` (its root the last committed token), after the committed
        tokens the cache lacks, in one forward per step. Returns the logits of its nodes
        `[n, V]` (`[n, K]` restricted). A tree with a fork, or a second forward in a step (the
        model's layers do not roll back across forwards exactly), raises `ArgumentError`."""
        where = f"StateRunner.forward_tree ({type(self.model).__name__}, a model with state layers)"
        if self.committed is None:
            raise ArgumentError(f"{where}: no generation begun: call begin(prompt, max_len=...)")
        if self.n_seen:
            raise ArgumentError(
                f"{where}: this step's chain is forwarded already; it verifies one chain per "
                "step in one forward (commit or rewind first)"
            )
        if (why := chain_problem(tree)) is not None:
            raise ArgumentError(
                f"{where}: it verifies one chain per step, but the tree is not a chain: {why}"
            )
        n = tree.n_nodes
        pending = self.committed[self.n_cached : self.n_committed - 1]
        if self.n_cached == 0 and pending.numel():  # the prompt: its states are never rolled back
            self._run(pending, n_logits=0)
            self.n_cached, pending = int(pending.numel()), pending[:0]
        self.n_pending = int(pending.numel())
        if self.snapshots:
            self._snapshot = None if self.n_cached == 0 else take_snapshot(self.cache)
        else:
            self._record(self.n_pending + n)
        logits = self._run(torch.cat([pending, tree.tokens.to(self.device)]), n_logits=n)
        self.n_seen = n
        return logits

    def _record(self, tokens: int) -> None:
        """Have the cache keep the states of the last `tokens` tokens forwarded this step, so
        that any of them can be cropped off at commit (past recording is switched on after the
        prompt's forward: its states are never rolled back)."""
        if tokens <= self._recorded:
            return
        self._recorded = max(tokens, 2 * self._recorded, 8)
        layers = getattr(self.cache, "layers", ())
        if not any(getattr(layer, "record_past", False) for layer in layers):
            self.cache.activate_past_recording(recurrent_states_to_keep=self._recorded)
            _separate_histories(self.cache)
        for layer in layers:  # a longer chain: more states kept, those recorded so far too
            if getattr(layer, "record_past", False):
                layer.recurrent_states_to_keep = self._recorded

    def _run(self, ids: Tensor, *, n_logits: int) -> Tensor:
        """One forward of `ids` after the cached tokens, as `generate` runs one: the cache under
        the name the forward reads, positions where `generate` hands them (Bamba numbers a
        forward's tokens from 0 without), and no attention mask (FalconMamba's would have to
        span the forward's tokens alone; all ones is none for the others). A model that builds
        its own cache at its first forward returns it under the keyword it takes it by."""
        total = self.n_cached  # the tokens the cache holds: this step's pending ones are in `ids`
        q = int(ids.shape[0])
        kwargs: dict[str, Any] = {self._cache_kwarg: self.cache, **self._quiet}
        if self._positions:
            kwargs["position_ids"] = torch.arange(total, total + q, device=self.device)[None]
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = max(n_logits, 1)
        out = self.model(input_ids=ids[None], use_cache=True, **kwargs)
        self.forwards += 1
        if self.cache is None:
            self.cache = out[self._cache_kwarg]
        logits = out.logits[0, -n_logits:] if n_logits else out.logits[0, :0]
        return logits if self.output_rows is None else logits[:, self.output_rows]

    def rewind(self) -> None:
        """Drop this step's forwards (pending tokens and chain); the next forward redoes them."""
        if not self.snapshots:
            self._crop(self.n_pending + self.n_seen)
        elif self.n_pending + self.n_seen:
            self._restore(self.n_pending + self.n_seen)
        self.n_pending = self.n_seen = 0

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        """Append `tokens` (the accepted drafts, then the bonus) and keep the states of the
        accepted chain nodes `accepted` (`[a]`: 0 .. a - 1), rolling the rest back."""
        nodes = accepted_nodes(accepted, tokens, where="StateRunner.commit")
        if nodes != list(range(len(nodes))):
            raise ArgumentError(
                f"StateRunner.commit: accepted: expected a chain's first nodes 0 .. "
                f"{len(nodes) - 1}, got {nodes}"
            )
        if self.n_seen and len(nodes) > self.n_seen:
            raise ArgumentError(
                f"StateRunner.commit: accepted: expected nodes of the chain forwarded this step "
                f"(0 .. {self.n_seen - 1}), got {nodes}"
            )
        self.committed = append_tokens(self.committed, self.n_committed, tokens)
        self.n_committed += len(nodes)
        if self.n_seen:  # else nothing of this step was forwarded
            kept = self.n_pending + min(len(nodes), self.n_seen)
            if self.snapshots:
                self._keep(self.n_pending + self.n_seen, kept)
            else:
                self._crop(self.n_pending + self.n_seen - kept)
                self.n_cached += kept
        self.n_pending = self.n_seen = 0

    def _crop(self, tokens: int) -> None:
        """Roll the cache back by the last `tokens` tokens forwarded (none: the layers drop
        the states recorded for a rollback)."""
        if self.n_pending + self.n_seen:
            self.cache.crop(-tokens)

    def _keep(self, forwarded: int, kept: int) -> None:
        """Rollback by snapshot: keep the first `kept` of the `forwarded` tokens of this step's
        forward (pending ones, then the chain's). All kept: nothing to undo. Else the state
        before the forward is put back and the kept tokens are forwarded again, in one forward;
        a lone kept root (every draft rejected, nothing pending) is left pending instead, for
        the next step's forward to carry."""
        if kept < forwarded:
            self._restore(forwarded)
            if not replay_tokens(forwarded, kept):
                return
            self._run(self.committed[self.n_cached : self.n_cached + kept], n_logits=0)
        self.n_cached += kept

    def _restore(self, forwarded: int) -> None:
        """Rollback by snapshot: the state tensors put back as they were before this step's
        forward, and the attention keys and values of its `forwarded` tokens cut off (a cache
        that held nothing then is started afresh)."""
        if self._snapshot is None:
            self.cache = new_state_cache(self.model)
            return
        restore_snapshot(self.cache, self._snapshot)
        try:
            crop_keys(self.cache, forwarded)
        except RuntimeError as err:  # a sliding window past which keys are gone
            from treegraft.core.runner.attention_rules import ModelRefused

            raise ModelRefused(
                f"{type(self.model).__name__} cannot roll rejected drafts back by snapshot: {err}"
            ) from err

    def skip_prefill(self) -> None:
        """For timing (`measure_latency`): the committed tokens but the last forwarded now (a
        state cannot be taken as given, so the prefill runs)."""
        pending = self.committed[self.n_cached : self.n_committed - 1]
        if pending.numel():
            self._run(pending, n_logits=0)
            self.n_cached += int(pending.numel())
        self.n_pending = self.n_seen = 0

    def committed_ids(self) -> Tensor:
        """`[n_committed]` int64 view of the committed tokens."""
        return self.committed[: self.n_committed]

    def track_hidden(self) -> None:
        """Refused: hidden states are kept on the lean forward only, which this model lacks."""
        raise ValueError(
            f"hidden states are kept only on the lean forward, which {type(self.model).__name__} "
            "(a model with recurrent state layers) does not take: a feature-level drafter cannot "
            "read this target"
        )

    hidden_states = track_hidden  # refused alike

    def latency_curve(self, queries: Sequence[int], *, context: int, repeats: int = 3) -> Any:
        """This model's `LatencyCurve` over chains of `queries` tokens after `context` tokens,
        measured with a fresh runner."""
        ref = getattr(self.model, "name_or_path", "") or "target"
        fresh = StateRunner(self.model, forward=self.forward)
        return measure_latency(fresh, ref, context=context, queries=queries, repeats=repeats)


def replay_tokens(forwarded: int, kept: int) -> int:
    """Tokens a rollback by snapshot forwards again at commit when `kept` of the `forwarded`
    tokens of a step's forward are kept (`StateRunner._keep`): 0 where all are kept (nothing
    to undo) or only the root (it waits for the next step's forward), else `kept`. The cost of
    a partly accepted step that a target rolled back by crop does not pay (the value system
    adds it: `scheduling.value_costs.CostModel`)."""
    return kept if 1 < kept < forwarded else 0


def _separate_histories(cache: Any) -> None:
    """Give each state of each layer its own list of recorded states: `transformers` starts
    them as one list shared by a layer's states (`dict.fromkeys(..., [])`), so a layer with two
    states would roll one back to the other's."""
    for layer in getattr(cache, "layers", ()):
        history = getattr(layer, "recurrent_states_history", None)
        if isinstance(history, dict):
            layer.recurrent_states_history = {i: list(h) for i, h in history.items()}


def probe_length(model: Any) -> int:
    """Prompt tokens of the probe: past a sliding window or chunk of at most 64 tokens (the
    model's attention layers then drop keys as decoding goes), within its maximum positions."""
    from treegraft.core.runner.attention_rules import max_positions, text_config

    cfg = text_config(model.config)
    spans = [
        value
        for name in ("sliding_window", "attention_chunk_size")
        if isinstance(value := getattr(cfg, name, None), int) and 0 < value <= 64
    ]
    n = max([12, *(2 * s + 3 for s in spans)])
    limit = max_positions(model.config)
    return n if limit is None else max(2, min(n, limit - 32))
