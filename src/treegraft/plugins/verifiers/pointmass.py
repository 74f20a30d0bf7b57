"""Point-mass verification: lossless stochastic acceptance of a draft tree.

The rule is TreeGraft's lossless stochastic verification (DESIGN.md §7), i.e. multi-draft
speculative sampling in which every draft token is a *point mass* (the drafter's own probabilities
play no part, so any tree with distinct children per node qualifies: n-gram chains, top-k
expansions, grafted strong children).

Glossary (the words used below and in `docs/losslessness.md`):

- **target law** `P`: at a node, `softmax(logits / temperature)` after top-k, top-p then min-p
  filtering, renormalised (`target_probs`); it is exactly what plain sampling from the target
  would use.
- **accepted**: a child the verifier keeps. At the current accepted node (first the root) its
  children are tried in node-index order; child `c` is accepted with probability `P(c)`; on
  rejection `P(c)` is set to 0 and `P` renormalised before the next child is tried. An accepted child
  becomes the current node and the walk goes on one level deeper.
- **recovered**: when every child of the current node is rejected, a token drawn from the residual
  `P` (the target law with the rejected children's tokens zeroed, renormalised).
- **bonus**: the token emitted after the last accepted node: the recovered token, or, after an
  accepted leaf (nothing to try), a plain draw from the target law at that leaf.

Why it is lossless: with distinct children `c_1, ..., c_k` tried in order, child `c_i` is reached
with probability `1 - P(c_1) - ... - P(c_{i-1})` and then accepted with `P(c_i)` divided by that same
mass, so the token `c_i` is emitted with probability exactly `P(c_i)`. All children are rejected with
probability `1 - sum_i P(c_i)`, and the recovered token is then `x` (not a child) with probability
`P(x) / (1 - sum_i P(c_i))`; the product is `P(x)`. So every emitted token is distributed exactly as
`P` whether or not it is among the children, and by induction over the levels the committed
sequence is distributed as sampling from the target, provided the tree does not depend on the
verifier's random numbers (the verifier owns its own generator). Children with `P(c) = 0` are
always rejected.

No host synchronisation per node: the walk loops over depth levels only (one host read of the tree's
depth and token range), and inside a level it works on all nodes at once with pre-drawn uniforms,
suffix sums of the children's masses and a device-side "still going" flag. The probability arithmetic
is float64.
"""

from __future__ import annotations

import math
import numbers

import attrs
import torch
from torch import Tensor

from treegraft.core.arguments import check_count
from treegraft.core.config import SEED_MAX, Check, at_least, between, field
from treegraft.core.errors import ArgumentError, NonFiniteLogitsError, shown
from treegraft.core.interfaces import Verdict, Verifier
from treegraft.core.tree import DraftTree

_POSITIVE = Check("> 0", lambda v: v > 0 and math.isfinite(v))


@attrs.frozen
class PointMassConfig:
    """Hyper-parameters of point-mass verification (the target sampler's settings)."""

    temperature: float = field(1.0, check=_POSITIVE, doc="softmax temperature of the target")
    top_k: int = field(0, check=at_least(0), doc="keep the k most likely tokens; 0 = off")
    top_p: float = field(
        1.0, check=between(0, 1, open_low=True), doc="nucleus mass to keep; 1.0 = off"
    )
    min_p: float = field(
        0.0,
        check=between(0, 1),
        doc="keep the tokens with at least min_p times the likeliest one's probability; 0.0 = off",
    )


@attrs.frozen(eq=False)
class SampledVerdicts:
    """`samples` independent verdicts for one tree (the fields of `Verdict`, batched).

    Attributes:
        path: `[B, n]` int64 accepted paths, root first, padded with -1.
        length: `[B]` int64 nodes on each path, root included.
        bonus: `[B]` int64 bonus tokens.
    """

    path: Tensor
    length: Tensor
    bonus: Tensor


# ---------------------------------------------------------------------------- the target law


def target_probs(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Tensor:
    """The target sampler's law: temperature, then top-k, top-p and min-p, renormalised, in
    float64 (the order of `generate(do_sample=True)`'s warpers).

    Ties in top-k are broken towards the lower token id (as `argmax`), so `top_k=1` is greedy.
    Top-p keeps the smallest prefix (by decreasing probability) whose mass reaches `top_p`; min-p
    then keeps the tokens whose probability is at least `min_p` times the likeliest one's. A plain
    sampling baseline must draw from this law for point-mass verification to match it.

    Args:
        logits: `[n, V]` next-token logits, one row per tree node (or any `[..., V]`).
        temperature: softmax temperature (> 0).
        top_k: keep the `top_k` most likely tokens; 0 (or >= V) keeps all.
        top_p: nucleus mass to keep; 1.0 keeps all.
        min_p: in [0, 1]; 0.0 keeps all.

    Returns:
        `[n, V]` float64 probabilities; filtered-out tokens are exactly 0.

    Raises:
        ArgumentError: a setting outside those ranges (a temperature of 0 or a `top_p` of 0
            gave NaN probabilities, a negative temperature the reversed law).
    """
    _check_settings(temperature, top_k, top_p, min_p)
    if not isinstance(logits, Tensor) or logits.ndim == 0 or logits.shape[-1] == 0:
        raise ArgumentError(
            f"target_probs: logits: expected a tensor [..., V] with V >= 1, got "
            f"{type(logits).__name__} {shown(logits)}"
        )
    wide = logits.to(torch.float64)  # [n, V]
    # shifted so the top logit is 0 before dividing: a tiny temperature then sends the others
    # to -inf (the top token keeps its mass) instead of every logit overflowing to +-inf (NaN)
    scaled = (wide - wide.max(dim=-1, keepdim=True).values) / temperature  # [n, V]
    vocab = scaled.shape[-1]
    if (top_k == 0 or top_k >= vocab) and top_p >= 1.0 and min_p <= 0.0:
        return torch.softmax(scaled, dim=-1)
    # ranked by the logits themselves: a huge temperature may round distinct scaled ones equal
    order = torch.sort(wide, dim=-1, descending=True, stable=True).indices  # [n, V]
    ranked = scaled.gather(-1, order)  # [n, V]
    if 0 < top_k < vocab:
        ranked[..., top_k:] = -math.inf
    probs = torch.softmax(ranked, dim=-1)  # [n, V], ranked order
    if top_p < 1.0:
        probs = _nucleus(probs, top_p)
    if min_p > 0.0:
        kept = torch.where(probs >= min_p * probs[..., :1], probs, 0.0)  # the likeliest first
        probs = kept / kept.sum(dim=-1, keepdim=True)
    return torch.empty_like(probs).scatter_(-1, order, probs)


def _check_settings(temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    """An `ArgumentError` naming the first of `target_probs`' settings outside its range."""
    check_count("target_probs: top_k", top_k, 0)
    for name, value, ok, what in (
        ("temperature", temperature, lambda v: 0 < v < math.inf, "a finite float > 0"),
        ("top_p", top_p, lambda v: 0 < v <= 1, "a float with 0 < value <= 1"),
        ("min_p", min_p, lambda v: 0 <= v <= 1, "a float with 0 <= value <= 1"),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not ok(value):
            raise ArgumentError(f"target_probs: {name}: expected {what}, got {shown(value)}")


def _nucleus(ranked_probs: Tensor, top_p: float) -> Tensor:
    """Keep each ranked token whose predecessors hold less than `top_p` mass; renormalise. [n, V]"""
    before = torch.cumsum(ranked_probs, dim=-1)[..., :-1]  # [n, V - 1]
    before = torch.cat([torch.zeros_like(ranked_probs[..., :1]), before], dim=-1)  # [n, V]
    kept = torch.where(before < top_p, ranked_probs, 0.0)  # [n, V]
    return kept / kept.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------- the walk


@attrs.frozen(eq=False)
class _TreeLaw:
    """What the walk reads at every level: the tree and the target law at each of its nodes."""

    probs: Tensor  # [n, V] float64 target law after each node
    parents: Tensor  # [n] int64
    tokens: Tensor  # [n] int64
    mass: Tensor  # [n] float64 target mass of each node's token under its parent (root: 0)

    @classmethod
    def of(cls, tree: DraftTree, probs: Tensor) -> _TreeLaw:
        parents, tokens = tree.parents.to(probs.device), tree.tokens.to(probs.device)
        under_parent = probs[parents.clamp(min=0), tokens]  # [n]
        mass = torch.where(parents >= 0, under_parent, 0.0)
        return cls(probs=probs, parents=parents, tokens=tokens, mass=mass)


@attrs.define
class _Walk:
    """Per-sample state of the descent through the tree (device tensors, leading dim B)."""

    node: Tensor  # [B] int64 current accepted node
    going: Tensor  # [B] bool, no recovered token drawn yet
    path: Tensor  # [B, n] int64
    length: Tensor  # [B] int64
    residual: Tensor  # [B, V] float64 law of the recovered token where the walk stopped

    @classmethod
    def start(cls, samples: int, n: int, vocab: int, device: torch.device) -> _Walk:
        path = torch.full((samples, n), -1, dtype=torch.long, device=device)
        path[:, 0] = 0
        return cls(
            node=torch.zeros(samples, dtype=torch.long, device=device),
            going=torch.ones(samples, dtype=torch.bool, device=device),
            path=path,
            length=torch.ones(samples, dtype=torch.long, device=device),
            residual=torch.zeros(samples, vocab, dtype=torch.float64, device=device),
        )

    def advance(self, level: int, first: Tensor, residual: Tensor) -> None:
        """Move to the accepted child `first` (`[B]`, `n` = none) or stop with `residual`."""
        found = first < self.path.shape[1]  # [B]
        stops = self.going & ~found
        self.residual = torch.where(stops[:, None], residual, self.residual)
        self.going = self.going & found
        self.node = torch.where(self.going, first, self.node)
        self.path[:, level] = torch.where(self.going, self.node, -1)
        self.length = self.length + self.going.long()


def _without_children(row: Tensor, tokens: Tensor, is_child: Tensor) -> Tensor:
    """`row` (`[B, V]`) with the tokens of the flagged children (`[B, n]`) set to 0."""
    hits = torch.zeros_like(row).scatter_add_(
        1, tokens.expand_as(is_child), is_child.to(row.dtype)
    )  # [B, V]
    return row.masked_fill(hits > 0, 0.0)


def _suffix_sum(mass: Tensor) -> Tensor:
    """`out[:, i] = mass[:, i:].sum(-1)`. [B, n]"""
    return mass.flip(-1).cumsum(-1).flip(-1)


def _draw(law: Tensor, uniform: Tensor) -> Tensor:
    """One token per row of the unnormalised `law` (`[B, V]`) by inverting its CDF at `uniform`."""
    cdf = law.cumsum(dim=-1)  # [B, V]
    target = (uniform * cdf[:, -1])[:, None]  # [B, 1]
    token = torch.searchsorted(cdf, target, right=True)[:, 0]  # [B]
    vocab_ids = torch.arange(law.shape[-1], device=law.device)
    last_positive = torch.where(law > 0, vocab_ids, -1).max(dim=-1).values  # [B]
    return torch.minimum(token, last_positive)  # guards u * total rounding up to total


# ---------------------------------------------------------------------------- the verifier


@attrs.define
class PointMassVerifier(Verifier):
    """Lossless stochastic verification of trees with distinct children (see the module doc)."""

    Config = PointMassConfig
    config: PointMassConfig
    _seed: int = attrs.field(default=0, init=False)
    _rng: torch.Generator | None = attrs.field(default=None, init=False)

    def begin(self, seed: int) -> None:
        """Reseed: the generator is (re)created on the logits' device at the next `verify`.
        An `ArgumentError` for a seed outside 0..`SEED_MAX` (one torch would alias)."""
        check_count("PointMassVerifier.begin: seed", seed, 0, SEED_MAX)
        self._seed = int(seed)  # torch's generator takes no NumPy int
        self._rng = None

    def verify(self, tree: DraftTree, target_logits: Tensor) -> Verdict:
        """Accepted path and bonus token, sampled; device tensors (one host read of the tree)."""
        out = self.verify_batch(tree, target_logits, 1)
        return Verdict(path=out.path[0], length=out.length[0], bonus=out.bonus[0])

    def verify_batch(self, tree: DraftTree, target_logits: Tensor, samples: int) -> SampledVerdicts:
        """`samples` independent verdicts, drawing the same uniforms as `samples` `verify` calls.

        Synchronises with the device once (the tree's depth and token range).
        """
        max_depth = _check_inputs(tree, target_logits, samples)
        device = target_logits.device
        law = _TreeLaw.of(tree, target_probs(target_logits, **attrs.asdict(self.config)))
        n, vocab = law.probs.shape
        u = self._uniforms(samples, max_depth * n + 1, device)  # [B, D * n + 1]
        walk = _Walk.start(samples, n, vocab, device)
        for level in range(1, max_depth + 1):
            self._try_children(walk, level, law, u[:, (level - 1) * n : level * n])
        residual = torch.where(walk.going[:, None], law.probs[walk.node], walk.residual)  # [B, V]
        bonus = _draw(residual, u[:, -1])  # [B]
        home = tree.device
        return SampledVerdicts(walk.path.to(home), walk.length.to(home), bonus.to(home))

    def accept_children(
        self, is_child: Tensor, uniforms: Tensor, mass: Tensor, remaining: Tensor
    ) -> Tensor:
        """Which children pass their own test, `[B, n]` bool; the walk takes the first that does.

        Child `i` passes iff `uniforms[:, i] < mass[:, i] / remaining[:, i]`: its target mass over
        the mass left once the earlier children were zeroed (written without a division, so a child
        of zero mass never passes).
        """
        return is_child & (uniforms * remaining < mass)

    def _try_children(self, walk: _Walk, level: int, law: _TreeLaw, uniforms: Tensor) -> None:
        """One level: try the children of each sample's current node in node-index order.

        `uniforms` (`[B, n]`) holds one number per node; child `i` uses column `i`.
        """
        n = law.parents.shape[0]
        is_child = law.parents[None, :] == walk.node[:, None]  # [B, n]
        residual = _without_children(law.probs[walk.node], law.tokens, is_child)  # [B, V]
        child_mass = torch.where(is_child, law.mass, 0.0)  # [B, n]
        remaining = _suffix_sum(child_mass) + residual.sum(dim=-1, keepdim=True)  # [B, n]
        passes = self.accept_children(is_child, uniforms, child_mass, remaining)  # [B, n]
        node_ids = torch.arange(n, device=law.parents.device)
        first = torch.where(passes, node_ids, n).min(dim=-1).values  # [B]
        walk.advance(level, first, residual)

    def _uniforms(self, samples: int, width: int, device: torch.device) -> Tensor:
        """`[samples, width]` float64 uniforms in [0, 1), row after row from the seeded stream."""
        rng = self._rng_on(device)
        return torch.rand(samples, width, dtype=torch.float64, device=device, generator=rng)

    def _rng_on(self, device: torch.device) -> torch.Generator:
        """The seeded generator, created on `device` at the first `verify` after `begin`."""
        if self._rng is None:
            self._rng = torch.Generator(device=device)
            self._rng.manual_seed(self._seed)
        elif self._rng.device != device:  # restarting the stream would reuse random numbers
            raise ValueError(
                f"target_logits moved from {self._rng.device} to {device} during a generation; "
                "call begin(seed) first"
            )
        return self._rng


def _check_inputs(tree: DraftTree, target_logits: Tensor, samples: int) -> int:
    """Validate shapes and token range; return the tree's depth. Synchronises with the device."""
    n = tree.n_nodes
    if target_logits.ndim != 2 or target_logits.shape[0] != n or target_logits.shape[1] == 0:
        raise ValueError(
            f"target_logits: expected shape [n, V] = [{n}, V] (one row per tree node), "
            f"got {list(target_logits.shape)}"
        )
    if not target_logits.is_floating_point():
        raise ValueError(f"target_logits: expected a floating dtype, got {target_logits.dtype}")
    check_count("verify_batch: samples", samples, 1)
    top = target_logits.amax(dim=-1)  # [n], NaN where a row holds one
    bad_row = torch.where(torch.isfinite(top), n, torch.arange(n, device=top.device)).min()
    extent = [tree.depth.max(), tree.tokens.min(), tree.tokens.max(), bad_row.to(tree.device)]
    max_depth, low, high, bad = torch.stack(extent).tolist()
    vocab = target_logits.shape[1]
    if low < 0 or high >= vocab:
        raise ValueError(f"tree tokens span [{low}, {high}], outside the vocabulary [0, {vocab})")
    if bad < n:
        raise NonFiniteLogitsError(
            f"target_logits: row {bad} (tree node {bad}) has no finite largest logit (NaN, +inf "
            "or all -inf), so it defines no target law: the target's forward overflowed or holds "
            "NaN (load it in a wider dtype)"
        )
    return int(max_depth)
