"""Causal-LM runner: prefill, tree forwards and KV commit for any Hugging Face causal LM.

The same runner serves the target and the language-model drafters. Its key/value cache is one
tensor preallocated per generation, `[n_layers, 2, n_kv_heads, max_len, head_dim]` (one per
shape where layers differ: `kv_cache.TreeKVCache`), laid out as

    [ committed prefix | pending committed tokens | tree nodes seen this step | free ]
      0 .. n_cached      (processed lazily)         slot n_cached + n_pending + node

A forward processes, in one call, the committed tokens the model has not seen yet (a chain) and
the tree nodes it has not seen yet (with the ancestor mask, positions = root position + depth).
`commit` keeps the pending chain and the seen part of the accepted path by compaction (a gather
into contiguous slots); nothing is ever recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from treegraft.core.runner.attention_rules import (
    AttentionRules,
    ModelRefused,
    attention_rules,
    max_positions,
)
from treegraft.core.runner.blocks import additive_mask, device_visibility, host_visibility
from treegraft.core.runner.forwards import cache_kwarg, quiet_outputs
from treegraft.core.runner.kv_cache import TreeKVCache, accepted_nodes, check_prompt, output_rows
from treegraft.core.runner.latency import measure_latency
from treegraft.core.runner.lean import FORWARDS, FusedForward, LeanForward, lean_support
from treegraft.core.runner.padding import PADDED_ROWS, pad_block, padding_pays
from treegraft.core.runner.placement import input_device
from treegraft.core.runner.positions import positional_modules, positions_given
from treegraft.core.runner.slot_windows import SlotWindows
from treegraft.core.runner.watchers import forward_watchers, unwatched
from treegraft.core.tree import DraftTree
from treegraft.kernels.host_tensor import host_tensor
from treegraft.kernels.tree_attention.hf import IMPLEMENTATION, PREFIX_LEN_KWARG, TREE_MASK_KWARG

#: cache slots reserved beyond the prompt, and the least a cache grows by
CACHE_CHUNK = 256
#: a first block of this many prompt tokens runs as a causal chain: with a tree of its root alone,
#: or from `SPLIT_MIN_ROWS` on split from the tree's other nodes (an extra forward: pays there)
CAUSAL_MIN_ROWS, SPLIT_MIN_ROWS = 64, 512


@attrs.define
class CausalLMRunner:
    """Runs one causal LM over committed tokens and draft trees with a preallocated KV cache.

    Attributes:
        model: any `AutoModelForCausalLM` decoder (eval mode).
        cache: the tree KV cache, grown in chunks as decoding goes (None until `begin`).
        committed: `[max_len]` int64 buffer of committed tokens (the prompt's included).
        n_committed: how many of `committed` are valid.
        n_cached: committed tokens whose keys/values sit contiguously at the start of the cache.
        n_pending: committed tokens processed in this step's region (before the tree nodes).
        n_seen: tree nodes of this step with keys/values in the region.
        forward: `auto` runs the lean forward (`treegraft.core.runner.lean`, bitwise equal logits) when
            the model supports it and `transformers`' forward otherwise; `lean` requires it;
            `fused` runs the fused lean forward (`FusedForward`: faster, logits close to but not
            bitwise equal to `transformers`'; for drafters only) where supported, else
            `transformers`'; `transformers` never uses either.
        bitwise: the lean forward's products are `F.linear`'s bit for bit, so its logits are
            `transformers`' (default); False (`decoding.forward: lean-fast`, and `auto` off
            CUDA): blocks of 4+ rows multiply by contiguous transposed weights on a float32 CPU
            wherever those agree to rounding (`lean.Transposed`), faster there.
        pad_small_blocks: whether forwards of 2-3 tokens run padded to 4 rows (float32 on a CPU,
            not `fused`); None (default): where that measures faster for this model on this
            machine (`treegraft.core.runner.padding`). The choice moves the last bits of a small
            block's logits: pin it where outputs must not hang on a timing.
        output_rows: `[K]` int64 token ids the logits are computed for, in that order (None: the
            whole vocabulary); set by `restrict_output`.
        forwards: model forwards this runner has run, over all its generations.
        hidden: `[slots, hidden]` final-norm hidden state per cache slot (`track_hidden`; or None).
    """

    model: PreTrainedModel
    forward: str = attrs.field(default="auto", kw_only=True)
    pad_small_blocks: bool | None = attrs.field(default=None, kw_only=True)
    bitwise: bool = attrs.field(default=True, kw_only=True)

    @pad_small_blocks.validator
    @bitwise.validator
    def _check_flag(self, attribute: Any, value: Any) -> None:
        optional = attribute.name == "pad_small_blocks"
        if not isinstance(value, bool) and not (optional and value is None):
            expected = "True, False or None" if optional else "True or False"
            raise TypeError(f"{attribute.name}: expected {expected}, got {value!r}")

    cache: TreeKVCache | None = None
    committed: Tensor | None = None
    n_committed: int = 0
    n_cached: int = 0
    n_pending: int = 0
    n_seen: int = 0
    forwards: int = 0
    _cache_kwarg: str = attrs.field(init=False, default="")
    _quiet: dict[str, bool] = attrs.field(init=False, factory=dict)  # `forwards.quiet_outputs`
    _positional: tuple = attrs.field(init=False, default=())  # `positions.positional_modules`
    _tree_kernel: bool = attrs.field(init=False, default=False)
    _lean: LeanForward | None = attrs.field(init=False, default=None)
    _rules: AttentionRules = attrs.field(init=False, default=None)
    _slot_windows: SlotWindows = attrs.field(init=False, factory=SlotWindows)  # GPT-Neo's
    # the model's device, dtype and vocabulary size, read at construction and at `begin` (Hugging
    # Face's `model.device` and `get_output_embeddings`: tens of microseconds, several a step)
    _device: torch.device = attrs.field(init=False, default=None)
    _dtype: torch.dtype = attrs.field(init=False, default=None)
    _vocab: int = attrs.field(init=False, default=0)
    _last_position: int = attrs.field(init=False, default=2**62)  # verified nodes stay within it
    output_rows: Tensor | None = attrs.field(init=False, default=None)
    # the output embedding's `output_rows` rows (weight, bias), gathered once for the lean forward
    _head: tuple[Tensor, Tensor | None] | None = attrs.field(init=False, default=None)
    # whether the model's blocks of 2-3 tokens may run padded (`pads_small_blocks`; None: unread)
    _pad_small: bool | None = attrs.field(init=False, default=None)
    hidden: Tensor | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._read_model()
        self._cache_kwarg = cache_kwarg(self.model)
        self._quiet, self._positional = quiet_outputs(self.model), positional_modules(self.model)
        self._rules = attention_rules(self.model.config)
        self._slot_windows = SlotWindows.of(self.model, self._rules)
        self._read_attention()

    def _read_attention(self) -> None:
        """Take the model's attention implementation: the tree kernel (`treegraft_tree`, through
        `transformers`' forward) or SDPA (the lean forward where supported)."""
        impl = getattr(self.model.config, "_attn_implementation", None)
        self._tree_kernel = impl == IMPLEMENTATION
        if self._tree_kernel and not self._rules.plain:
            raise ModelRefused(
                f"the tree-attention kernel takes one causal tree mask, but {type(self.model).__name__}"
                f" has {self._rules.describe()}: use SDPA (decoding.forward: auto, lean or transformers)"
            )
        self._lean = self._lean_forward()

    def _read_model(self) -> None:
        self._device, self._dtype = input_device(self.model), self.model.dtype
        self._vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self._last_position = (max_positions(self.model.config) or 2**62) - 1

    def _lean_forward(self) -> LeanForward | None:
        """The lean forward this runner uses, per `forward` and what the model supports."""
        if self.forward not in FORWARDS:
            raise ValueError(
                f"forward: expected one of {', '.join(FORWARDS)}, got {self.forward!r}"
            )
        if self.forward == "transformers":
            return None
        why = lean_support(self.model)
        if why is None:
            if self.forward == "fused":
                return FusedForward(self.model)
            return LeanForward(self.model, bitwise=self.bitwise)
        if self.forward == "lean":
            raise ValueError(f"forward 'lean' is not available for this model: {why}")
        return None

    @property
    def attention(self) -> str:
        """`tree` when tree forwards run the tree-attention kernel, else `sdpa`."""
        return "tree" if self._tree_kernel else "sdpa"

    @property
    def lean(self) -> bool:
        """Whether forwards run the lean path (else `transformers`' model forward)."""
        return self._lean is not None

    @property
    def transposed_products(self) -> bool:
        """Whether the lean forward multiplies blocks of 4+ rows by transposed weight copies
        (`lean.Transposed`; kept on a float32 CPU where they agree with `F.linear`, bit for bit
        or, `bitwise` False, to rounding)."""
        return self._lean is not None and self._lean.transposed is not None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def n_outputs(self) -> int:
        """Columns of the logits a forward returns: `len(output_rows)`, else the vocabulary."""
        return self.vocab_size if self.output_rows is None else int(self.output_rows.shape[0])

    def restrict_output(self, rows: Tensor | None) -> None:
        """Compute logits only for the token ids `rows` (`[K]` int64, distinct, each below the
        vocabulary size; logits come in that order), or again for the whole vocabulary (None).

        On the lean forward the output embedding's rows are gathered here, once, so a forward
        reads `K` rows of it instead of all: in a small model the output projection is most of
        the weights a forward reads (the zoo drafters: 50-90%). `transformers`' forward still
        computes every logit and the columns are picked from them."""
        if rows is None:
            self.output_rows = self._head = None
            return
        rows = output_rows(rows, self.vocab_size)
        self.output_rows = rows.to(self.device)
        self._gather_head()

    def _gather_head(self) -> None:
        out = self.model.get_output_embeddings()
        rows = self.output_rows
        bias = None if out.bias is None else out.bias.detach()[rows].contiguous()
        self._head = (out.weight.detach()[rows].contiguous(), bias)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        """Start a generation: reserve `max_len` cache slots (reusing the last allocation if large enough)."""
        check_prompt(prompt, max_len)
        if (input_device(self.model), self.model.dtype) != (self._device, self._dtype):  # moved
            self._read_model()
            self.cache = None
            self._lean = self._lean_forward()  # rebind the moved weights
            if self.output_rows is not None:
                self.output_rows = self.output_rows.to(self._device)
                self._gather_head()
        if self._tree_kernel != (
            getattr(self.model.config, "_attn_implementation", None) == IMPLEMENTATION
        ):  # the model's attention was switched (`Resources.use_forward`)
            self._read_attention()
        # the cache grows in chunks as decoding goes (`_ensure_capacity`), never sized for
        # `max_len` up front: a huge `max_new_tokens` costs nothing until it is decoded
        reserve = min(max_len, prompt.numel() + CACHE_CHUNK)
        if self.cache is None or self.cache.get_max_length() < reserve:
            self.cache = self._new_cache(reserve)
            self.committed = torch.zeros(reserve, dtype=torch.long, device=self.device)
        self.committed[: prompt.numel()] = prompt.to(self.device)
        self.n_committed = prompt.numel()
        self.n_cached = self.n_pending = self.n_seen = 0

    def _new_cache(self, capacity: int) -> TreeKVCache:
        """An empty cache of `capacity` slots (`TreeKVCache.for_model`; the layers' shapes read
        for the last one carry over)."""
        return TreeKVCache.for_model(
            self.model,
            capacity,
            device=self.device,
            lean=self._lean is not None,
            forward_kwargs=(self._cache_kwarg, self._quiet),
            shapes=self.cache.shapes if self.cache is not None else None,
        )

    def _ensure_capacity(self, needed: int) -> None:
        """Grow the cache (by `CACHE_CHUNK` slots at least, or doubling) when a step needs more."""
        if needed <= self.capacity:
            return
        capacity = max(needed, self.capacity + CACHE_CHUNK, 2 * self.capacity)
        committed = torch.zeros(capacity, dtype=torch.long, device=self.device)
        committed[: self.n_committed] = self.committed[: self.n_committed]
        # ids first: an interrupted grow leaves them longer than the cache's slots, not shorter
        self.committed = committed
        self.cache.grow(capacity)

    @property
    def capacity(self) -> int:
        return self.cache.get_max_length() if self.cache is not None else 0

    def forward_tree(self, tree: DraftTree) -> Tensor:
        """Forward the nodes of `tree` not seen yet in this step (and any pending committed tokens).

        The tree's root must be the last committed token. Returns logits `[n_new, V]` for tree
        nodes `n_seen_before .. n` (the pending chain's logits are not computed); `[n_new, K]`,
        columns in `output_rows` order, when `restrict_output` restricted them."""
        n = tree.n_nodes
        if self.n_seen == 0:
            self.n_pending = self.n_committed - 1 - self.n_cached
        start = self.n_seen
        pending = self.n_pending if start == 0 else 0
        if pending + n - start == 0:
            return torch.zeros(0, self.n_outputs, dtype=self.dtype, device=self.device)
        region = self.n_pending + n
        self._ensure_capacity(self.n_cached + region)
        if start == 0 and self._causal_prefill(pending, n):
            logits = self._prefill(tree.tokens[:1])  # [1, V]: the root's
            self.n_seen = 1
            return logits if n == 1 else torch.cat([logits, self.forward_tree(tree)])
        ids, positions, mask = self._block(tree, start, pending)
        logits = self._run(ids, positions, mask, n_logits=n - start)
        self.n_seen = n
        return logits

    def _causal_prefill(self, pending: int, n: int) -> bool:
        """Whether the block starts with a prefill run alone as a causal chain (the first forward,
        no attention rules): the lean forward runs SDPA's causal kernel, as `generate` prefills
        (keys above the diagonal skipped, no `[q, q]` mask); `transformers`' splits alike."""
        least = CAUSAL_MIN_ROWS if n == 1 else SPLIT_MIN_ROWS
        return self.n_cached == 0 and pending + 1 >= least and self._rules.plain

    def _prefill(self, root: Tensor) -> Tensor:
        """Forward the pending committed tokens and `root` (`[1]`, the last committed token)
        from cache slot 0 as a causal chain; returns the root's logits `[1, V]`."""
        q, dev = self.n_pending + 1, self.device
        ids = torch.cat([self.committed[: self.n_pending], root.to(dev)])
        positions = torch.arange(q, device=dev)
        if self._lean is not None:
            return self._forward(ids, positions, None, n_logits=1, kv_len=q, causal=True)
        return self._run(
            ids, positions, torch.ones(q, q, dtype=torch.bool, device=dev).tril(), n_logits=1
        )

    def forward_chain(self, token: Tensor) -> Tensor:
        """Forward one token that extends this step's tree as the child of its last seen node,
        where that tree is a chain from the root (each node the child of the one before, as a
        drafter's greedy chain): the node sees everything in the cache and the region, so on the
        lean forward no mask is built. Returns its logits `[1, V]` (`[1, K]` restricted), as
        `forward_tree` would for the tree with the node appended. Needs the root seen
        (`forward_tree` first)."""
        if self.n_seen == 0:
            raise ValueError("forward_chain: the step's root is not forwarded yet (forward_tree)")
        kv_len = self.n_cached + self.n_pending + self.n_seen + 1
        self._ensure_capacity(kv_len)
        dev = self.device
        ids = token.reshape(1).to(dev)
        positions = torch.full((1,), kv_len - 1, dtype=torch.long, device=dev)  # root + depth
        visible: Any = None
        if self._lean is None or not self._rules.plain:  # a mask: the model's forward, or rules
            visible = torch.ones(1, kv_len, dtype=torch.bool, device=dev)
            if not self._rules.plain:  # a chain's keys sit at positions 0 .. kv_len - 1
                visible = self._rule_masks(visible, positions, torch.arange(kv_len, device=dev))
        logits = self._forward(ids, positions, visible, n_logits=1, kv_len=kv_len)
        self.n_seen += 1
        return logits

    def _block(self, tree: DraftTree, start: int, pending: int) -> tuple[Tensor, Tensor, Tensor]:
        """Token ids `[q]`, positions `[q]` and visibility `[q, kv_len]` of one forward block:
        in numpy for a CPU model and tree (a few array calls where torch's cost tens of
        microseconds each), else with torch ops on the model's device (`_block_on_device`)."""
        if self.device.type != "cpu" or tree.device.type != "cpu":
            return self._block_on_device(tree, start, pending)
        n, base, root = tree.n_nodes, self.n_cached, self.n_committed - 1
        depth = tree.depth.numpy()
        if pending == 0:  # every step after a generation's first: the tree's nodes alone
            ids, positions = tree.tokens[start:n], depth[start:n] + root
        else:
            ids = torch.cat([self.committed[base : base + pending], tree.tokens[start:n]])
            positions = np.concatenate([np.arange(base, base + pending), depth[start:n] + root])
        mask = host_visibility(tree, start, pending, base=base, n_pending=self.n_pending)
        if self._rules.plain:
            return ids, torch.from_numpy(positions), torch.from_numpy(mask)
        k_pos = np.concatenate([np.arange(base + self.n_pending), depth[:n] + root])
        return ids, torch.from_numpy(positions), self._rule_masks(mask, positions, k_pos)

    def _rule_masks(self, mask: Any, q_pos: Any, k_pos: Any) -> Any:
        """The visibility `mask` narrowed by the model's attention rules (sliding windows,
        chunks): one mask when every layer has the same rule, else a dict by layer type."""
        rules = self._rules
        numpy = isinstance(mask, np.ndarray)

        def narrow(rule: Any) -> Any:
            out = rule.restrict(mask, q_pos, k_pos)
            return torch.from_numpy(out) if numpy else out

        if rules.by_type is None:
            return narrow(rules.single)
        return {kind: narrow(rule) for kind, rule in rules.by_type.items()}

    def _block_on_device(
        self, tree: DraftTree, start: int, pending: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`_block` with torch ops on the model's device."""
        dev = self.device
        n = tree.n_nodes
        base = self.n_cached
        root_pos = self.n_committed - 1
        pend_ids = self.committed[base : base + pending]
        ids = torch.cat([pend_ids, tree.tokens[start:n].to(dev)])
        node_pos = tree.positions(root_pos)[start:n].to(dev)
        positions = torch.cat([torch.arange(base, base + pending, device=dev), node_pos])
        mask = device_visibility(
            tree, start, pending, base=base, n_pending=self.n_pending, device=dev
        )
        p_end = base + self.n_pending
        if self._rules.plain:
            return ids, positions, mask
        k_pos = torch.cat([torch.arange(p_end, device=dev), tree.positions(root_pos)[:n].to(dev)])
        return ids, positions, self._rule_masks(mask, positions, k_pos)

    def _run(self, ids: Tensor, positions: Tensor, visible: Any, *, n_logits: int) -> Tensor:
        """One model forward writing keys/values at the end of the current region; a block of
        2 or 3 tokens runs as `PADDED_ROWS` where that is faster (`pads_small_blocks`).

        `visible`: `[q, kv_len]` bool, or a dict of them by layer type (`_rule_masks`)."""
        q = int(ids.shape[0])
        small = 1 < q < PADDED_ROWS and not isinstance(visible, dict)
        if not small or not self.pads_small_blocks():
            return self._forward(ids, positions, visible, n_logits=n_logits)
        pad = PADDED_ROWS - q
        self._ensure_capacity(visible.shape[1] + pad)
        logits = self._forward(*pad_block(ids, positions, visible, pad), n_logits=n_logits + pad)
        return logits[:n_logits]

    def pads_small_blocks(self) -> bool:
        """Whether blocks of 2-3 tokens run padded to `PADDED_ROWS` rows: float32 Llama models
        on a CPU (any forward but `fused`, so the lean and `transformers`' forwards see the same
        blocks) where `pad_small_blocks` says so, or, left unset, where the model's padded small
        forwards measure faster than its unpadded ones on this machine
        (`treegraft.core.runner.padding`: once per model and thread count)."""
        if self.device.type != "cpu" or self.dtype != torch.float32:
            return False
        if self._pad_small is None:
            eligible = self.may_pad_small_blocks()
            if not eligible or self.pad_small_blocks is not None:
                self._pad_small = eligible and self.pad_small_blocks
            else:
                with unwatched(self.model):  # the measurement's forwards are not the run's
                    self._pad_small = padding_pays(self.model, self.bitwise, self._probe_runner)
        return self._pad_small

    def may_pad_small_blocks(self) -> bool:
        """Whether padding applies to this runner at all: a float32 Llama model on a CPU, any
        forward but `fused`."""
        on_cpu = self.device.type == "cpu" and self.dtype == torch.float32
        return on_cpu and self.forward != "fused" and lean_support(self.model) is None

    def _probe_runner(self, pad: bool) -> CausalLMRunner:
        return CausalLMRunner(
            self.model, forward=self.forward, bitwise=self.bitwise, pad_small_blocks=pad
        )

    def _forward(
        self,
        ids: Tensor,
        positions: Tensor,
        visible: Any,
        *,
        n_logits: int,
        kv_len: int = 0,
        causal: bool = False,
    ) -> Tensor:
        """One model forward of the block as given (`visible` None: every one of the `kv_len`
        keys is visible to every row, or with `causal` the keys up to its own to each row of a
        block from slot 0; on the lean forward only)."""
        cache = self.cache
        positions = positions.clamp(max=self._last_position)  # a drafter's nodes past it
        if visible is None:
            additive: Any = None
        elif isinstance(visible, dict):
            kv_len = next(iter(visible.values())).shape[1]
            additive = {k: self._additive(v)[None, None] for k, v in visible.items()}
        else:
            kv_len = visible.shape[1]
            additive = self._additive(visible)
        cache.write_start = kv_len - ids.shape[0]
        for watcher in forward_watchers(self.model):
            watcher(int(ids.shape[0]))
        if self._lean is not None:
            self.forwards += 1
            rows = self._hidden_rows(cache.write_start, int(ids.shape[0]))
            return self._lean(
                ids,
                positions,
                additive,
                cache.kv,
                cache.write_start,
                n_logits,
                head=self._head,
                hidden=rows,
                causal=causal,
            )
        extra = {self._cache_kwarg: cache, **self._quiet}
        if self._tree_kernel:  # the fused kernel takes the compact mask: prefix length + tree block
            extra |= {PREFIX_LEN_KWARG: self.n_cached, TREE_MASK_KWARG: visible[:, self.n_cached :]}
        with (
            positions_given(self._positional, positions),
            self._slot_windows.applied(visible, additive) as mask,
        ):
            out = self.model(
                input_ids=ids[None, :],
                position_ids=positions[None, :],
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=n_logits,
                **extra,
            )
        self.forwards += 1
        logits = out.logits[0, -n_logits:] if n_logits else out.logits[0, :0]
        return logits if self.output_rows is None else logits[:, self.output_rows]

    def _additive(self, visible: Tensor) -> Tensor:
        """`[q, kv_len]` additive mask (0 where visible, the dtype's minimum elsewhere)."""
        return additive_mask(visible, self.dtype, self.device)

    def skip_prefill(self) -> None:
        """Take the committed tokens but the last as cached without forwarding them: their keys
        and values are whatever the cache holds (zeros in a fresh one). Forwards from here cost
        what they would after the real prefill, but their logits mean nothing: for timing
        forwards at a long context (`measure_latency`) without paying for a prefill."""
        self.n_cached = self.n_committed - 1
        self.n_pending = self.n_seen = 0

    def rewind(self) -> None:
        """Drop this step's region (pending chain and tree nodes); the next forward redoes it."""
        self.n_pending = self.n_seen = 0

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        """Append `tokens` to the committed sequence and keep the seen accepted nodes' keys/values.

        Args:
            accepted: `[a]` int64 node indices (this step's tree, root first) of the accepted path.
            tokens: `[a]` int64 newly committed tokens (accepted drafts, then the bonus).

        Reads `accepted` on the host: pass a host tensor (the decoder does) and nothing waits
        for the device. Other arguments raise `ArgumentError` (`kv_cache.accepted_nodes`)."""
        nodes = accepted_nodes(accepted, tokens)
        n_new = len(nodes)
        self._ensure_capacity(self.n_committed + n_new)
        if self.n_seen or self.n_pending:  # else nothing of this step is cached (not called)
            self._keep(nodes)
        new = tokens.to(self.device, non_blocking=True)  # async from a pinned buffer (decoder)
        self.committed[self.n_committed : self.n_committed + n_new] = new
        self.n_committed += n_new
        self.n_pending = self.n_seen = 0

    def _keep(self, accepted: list[int]) -> None:
        """Keep the keys/values of this step's pending tokens and seen accepted nodes (checked
        by `accepted_nodes`), moved to follow the cached ones."""
        seen = [a for a in accepted if a < self.n_seen]
        keep = [*range(self.n_pending), *(self.n_pending + a for a in seen)]
        # slots before the first one out of place already sit where they belong
        first = next((i for i, slot in enumerate(keep) if slot != i), len(keep))
        if first < len(keep) and self.cache.groups:
            moved = [self.n_cached + slot for slot in keep[first:]]
            self.cache.compact(host_tensor(moved, device=self.device), self.n_cached + first)
            if self.hidden is not None:  # the features move with their keys and values
                self.hidden[self.n_cached + first : self.n_cached + len(keep)] = self.hidden[moved]
        self.n_cached += len(keep)

    def track_hidden(self) -> None:
        """Keep the final-norm hidden state of every token forwarded (what the output head
        reads) beside its keys and values, from the next forward on: `hidden_states` hands out
        those of the committed tokens, without an extra forward (a feature-level drafter's
        input). Needs the lean forward."""
        if self._lean is None:
            raise ValueError(
                "hidden states are kept only on the lean forward; this runner forwards through "
                f"transformers (forward={self.forward!r}, lean support: {lean_support(self.model)})"
            )
        if self.hidden is None:
            self.hidden = torch.zeros(0, self._lean.embed.shape[1], dtype=self.dtype)

    def hidden_states(self) -> Tensor:
        """`[n_cached, hidden]` final-norm hidden states of the committed tokens whose keys and
        values are cached, in order (`track_hidden`); the last committed token (the next root)
        has none until the next forward."""
        if self.hidden is None:
            raise ValueError("hidden states are not kept: call track_hidden() before forwarding")
        return self.hidden[: self.n_cached]

    def _hidden_rows(self, start: int, q: int) -> Tensor | None:
        """The `[q, hidden]` rows of `hidden` for slots `start ..` (grown as needed), or None."""
        if self.hidden is None:
            return None
        end = start + q
        if self.hidden.shape[0] < end or (self.hidden.device, self.hidden.dtype) != (
            self.device,
            self.dtype,
        ):
            grown = torch.zeros(max(end, 2 * self.hidden.shape[0]), self.hidden.shape[1])
            grown = grown.to(device=self.device, dtype=self.dtype)
            keep = min(self.hidden.shape[0], grown.shape[0])
            grown[:keep] = self.hidden[:keep].to(grown)
            self.hidden = grown
        return self.hidden[start:end]

    def committed_ids(self) -> Tensor:
        """`[n_committed]` int64 view of the committed tokens."""
        return self.committed[: self.n_committed]

    def latency_curve(self, queries: Sequence[int], *, context: int, repeats: int = 3) -> Any:
        """Measure this model's `LatencyCurve` (forwards of `queries` tokens after `context`
        cached ones; median of `repeats`), with a separate runner: this one's state is untouched."""
        ref = getattr(self.model, "name_or_path", "") or "target"
        fresh = CausalLMRunner(
            self.model,
            forward=self.forward,
            bitwise=self.bitwise,
            pad_small_blocks=self.pad_small_blocks,
        )
        return measure_latency(fresh, ref, context=context, queries=queries, repeats=repeats)
