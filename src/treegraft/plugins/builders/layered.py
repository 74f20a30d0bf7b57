"""Layered builder: grow the tree one layer at a time, a scheduler choosing the drafter per layer.

Per layer the scheduler picks a drafter (0 = cheapest). A drafter that cannot score trees, or any
drafter when the pipeline has no grafter, expands the best `top_k` frontier nodes with `top_k`
children each (EAGLE-2-style dynamic tree). A scoring drafter with a grafter makes a *strong
call*: one forward over the whole tree, rescoring, and a non-destructive graft. At the end the
tree is pruned to the best `budget` nodes (ancestor-closed, parents first).

A step that drafted nothing (the cheapest drafter had no token under the root and no strong call
ran) can draft an LM drafter's greedy chain from the root instead (`silent_chain`; the strongest
drafter's, or the one `silent_drafter` names, e.g. a cheap LM beside a strong one): where an
n-gram drafter finds no match in free text, the LM drafter's confident tokens are what
speculation has to offer, and its incremental chain is far cheaper than strong calls rescoring a
tree. Whether those chains pay is measured as the plain switch measures speculation (a second
`PlainSwitch`, asked only at such steps: the chain, or a plain step). With `beside_chain` the
same chain is drafted at the other steps too, before the cheapest drafter's layers, which grow
beside it: a strong drafter's guess that takes no layer from the cheapest drafter and forwards
only the root's path (no tree).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.config import Check, at_least, field
from treegraft.core.interfaces import (
    BuildResult,
    LayerState,
    Peek,
    StepContext,
    StepFacts,
    TreeBuilder,
    TreeFacts,
)
from treegraft.core.runner.latency import ObservedCurve
from treegraft.core.tree import DraftTree
from treegraft.kernels import prune_to_budget
from treegraft.kernels._dispatch import choose_backend
from treegraft.kernels.host_tensor import host_tensor
from treegraft.kernels.prune_to_budget.host import kept_nodes
from treegraft.plugins.builders.plain_switch import PlainSwitch, plain_step


@attrs.frozen
class LayeredConfig:
    """Hyper-parameters of the layered builder."""

    depth: int = field(5, check=at_least(1, sane_max=256), doc="layers of tree growth per step")
    top_k: int = field(
        8,
        check=at_least(1, sane_max=1024),
        doc="frontier nodes expanded per layer and children per node",
    )
    budget: int = field(
        48, check=at_least(1, sane_max=8192), doc="draft nodes verified per step (root excluded)"
    )
    max_strong_calls: int | None = field(
        None,
        check=Check(">= 0 or null", lambda v: v is None or v >= 0),
        doc="cap on strong calls per step (default: floor(T_target / T_strong), measured)",
    )
    adaptive: bool = field(
        False,
        doc="verify only as many of the best `budget` nodes as maximise expected tokens per "
        "second under the target's latency curve (measured once per decoder, corrected by the "
        "forwards it observes)",
    )
    stop_below: float | None = field(
        None,
        check=Check("in (0, 1] or null", lambda v: v is None or 0 < v <= 1),
        doc="stop growing after a layer whose every new frontier node has an edge probability "
        "below this (the nodes are kept): Hugging Face assisted generation's confidence stop "
        "(0.4 there); null: never",
    )
    plain_switch: bool = field(
        False,
        doc="decode plainly (no drafting) while speculation's measured tokens per second fall "
        "below plain decoding's, probing speculation again every `probe_every` steps",
    )
    probe_every: int = field(
        16, check=at_least(1), doc="plain steps between probes of speculation (`plain_switch`)"
    )
    shadow: bool = field(
        True,
        doc="with `plain_switch`: while plain decoding leads, check the cheapest drafter's best "
        "chain at each plain step against what plain decoding commits, and probe speculation "
        "when those guesses would pay, not while none of them matched (drafters that say "
        "their chain: the n-gram drafter)",
    )
    silent_chain: int = field(
        0,
        check=at_least(0, sane_max=256),
        doc="at a silent step (the cheapest drafter has no token under the root), the "
        "`silent_drafter`'s greedy chain of up to this many tokens from the root, ending after "
        "a token below `silent_stop`, while such chains measure faster than plain decoding "
        "(else a plain step); 0: off",
    )
    silent_stop: float = field(
        0.4,
        check=Check("in (0, 1]", lambda v: 0 < v <= 1),
        doc="`silent_chain` ends after a token whose probability under the drafter is below this",
    )
    silent_drafter: int = field(
        -1,
        check=Check("!= 0 (0 is the cheapest drafter)", lambda v: v != 0),
        doc="the drafter whose chains `silent_chain` (and `beside_chain`) drafts: its index among "
        "the pipeline's drafters, cheapest first (negative: counted from the strongest, -1); a "
        "cheap LM drafter beside a strong one drafts chains at less cost",
    )
    beside_weak: bool = field(
        False,
        doc="at a strong call's layer the cheapest drafter expands the same frontier too (after "
        "the call; the next frontier is the best of both), instead of the call replacing it",
    )
    beside_chain: int = field(
        0,
        check=at_least(0, sane_max=256),
        doc="at every step where the cheapest drafter has tokens under the root, the "
        "`silent_drafter`'s greedy chain of up to this many tokens from the root (ending after a "
        "token below `silent_stop`) hangs under the root beside the cheapest drafter's tree, "
        "drafted first, without a scheduler's call; 0: off",
    )
    beside_below: float = field(
        1.0,
        check=Check("in (0, 1]", lambda v: 0 < v <= 1),
        doc="`beside_chain` drafts only at steps where the cheapest drafter's best first token "
        "(its `peek`) has a probability below this; 1: at every step",
    )


@attrs.define
class LayeredBuilder(TreeBuilder):
    """Dynamic draft tree grown layer by layer, then pruned to a node budget."""

    Config = LayeredConfig
    config: LayeredConfig
    #: speculation or plain decoding, per step (`LayeredConfig.plain_switch`; None: always drafts)
    switch: PlainSwitch | None = attrs.field(default=None, init=False)
    #: at the steps that drafted nothing: the `silent_drafter`'s chain (its `SPECULATE`) or the
    #: root alone (a plain step where the scheduler was not asked), measured as the plain switch
    #: measures (`LayeredConfig.silent_chain`)
    silent: PlainSwitch | None = attrs.field(default=None, init=False)
    #: silent steps always draft their chain, never a plain step (`for_search`)
    always_chain: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        if self.config.plain_switch:
            self.switch = PlainSwitch(
                probe_every=self.config.probe_every,
                shadowing=self.config.shadow,
                # the cheapest drafter's missed guesses say nothing of the chains drafted where
                # it has none: with them, the shadow may start probes, not hold them back
                vetoes=self.config.silent_chain == 0,
            )
        if self.config.silent_chain:
            self.silent = PlainSwitch(probe_every=self.config.probe_every, shadowing=False)

    def max_nodes(self) -> int:
        return self.config.budget + 1

    def check_drafters(self, n_drafters: int) -> None:
        """`silent_drafter` must name a drafter other than the cheapest (a pipeline of one
        drafter has no silent steps and no chain beside the cheapest's: nothing to check)."""
        if not (self.config.silent_chain or self.config.beside_chain) or n_drafters < 2:
            return
        index = self.config.silent_drafter
        if not -n_drafters <= index < n_drafters or index % n_drafters == 0:
            raise ValueError(
                f"silent_drafter: {index} names no drafter but the cheapest of this pipeline's "
                f"{n_drafters}; expected 1 .. {n_drafters - 1} or -{n_drafters - 1} .. -1"
            )

    def wants_target_curve(self) -> bool:
        return self.config.adaptive

    def with_clock(self, now: Callable[[], float]) -> LayeredBuilder:
        """A copy whose plain switch (if any) starts afresh and reads `now`."""
        builder = LayeredBuilder(self.config)
        for switch in (builder.switch, builder.silent):
            if switch is not None:
                switch.now = now
        return builder

    def for_search(self) -> LayeredBuilder:
        """A copy without the plain switch whose silent steps always draft their chain: the
        value system's searched trees are built outside the decode loop, where neither switch
        chooses plain steps."""
        builder = LayeredBuilder(attrs.evolve(self.config, plain_switch=False))
        builder.always_chain = True
        return builder

    def build(self, step: StepContext) -> BuildResult:
        if self.silent is not None and not self.always_chain:
            self.silent.close(step)
        if self.switch is not None and self.switch.plain(step):
            built = plain_step(step)
            if self.switch.wants_guess:
                peek = step.drafters[0].peek(built.tree)  # shadow drafting: its guess
                self.switch.guess(None if peek is None else peek.chain)
            return built
        tree = DraftTree.from_root(step.root, device=step.root.device, dtype=step.dtype)
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)
        calls: list[int] = []
        times = StepTimes.read(step)  # they change between steps, not within one
        peek, silent = None, self.silent is not None and len(step.drafters) > 1
        beside = self.config.beside_chain > 0 and len(step.drafters) > 1
        if len(step.drafters) > 1 and (silent or beside or step.scheduler.wants_peek()):
            peek = step.drafters[0].peek(tree)
        # the cheapest drafter says it has nothing under the root: a silent step, no scheduler
        quiet = silent and peek is not None and not peek.chain
        beside_calls: list[int] = []
        if beside and not quiet and (peek is None or peek.first < self.config.beside_below):
            tree, beside_calls = self._silent_chain(step, tree, self.config.beside_chain)
        if not quiet:
            facts = step_facts(step, self.config.depth, self._cap(times), times=times, peek=peek)
            for layer in range(self.config.depth):
                who = self._choose(step, layer, tree, frontier, calls, facts)
                if who == 0 and frontier.numel() == 0:
                    break  # the cheapest drafter has nothing left to expand
                with step.clock.time(f"drafter{who}"):
                    tree, frontier = self._grow(step, who, tree, frontier)
                calls.append(who)
                if unsure(tree, frontier, self.config.stop_below):
                    break
        calls += beside_calls
        chain = False
        if silent and tree.n_nodes == 1:
            chain = self.always_chain or not self.silent.plain(step)
            if chain:
                tree, calls = self._silent_chain(step, tree)
                self.silent.note(tuple(calls))
            elif quiet:  # nothing drafted, no scheduler asked: plain decoding's step
                return plain_step(step)
        budget = self.config.budget
        curve = step.timings.target_curve
        if self.config.adaptive and curve is not None:
            budget = adaptive_size(step, tree, budget, curve, sum(times.drafters[c] for c in calls))
        keep = kept(tree, budget)
        if self.switch is not None:
            self.switch.note(tuple(calls))
        return BuildResult(
            tree=tree.select(keep),
            kept=keep,
            calls=tuple(calls),
            unpruned=tree,
            silent=chain or quiet,
        )

    def _silent_chain(
        self, step: StepContext, tree: DraftTree, length: int | None = None
    ) -> tuple[DraftTree, list[int]]:
        """The `silent_drafter`'s greedy chain of up to `length` tokens (default `silent_chain`)
        from the root: its `chain`, or one `expand` of its last node per token, ending after a
        token below `silent_stop`; and the calls made (one per drafted token)."""
        length = self.config.silent_chain if length is None else length
        who = self.config.silent_drafter % len(step.drafters)
        drafter = step.drafters[who]
        calls: list[int] = []
        with step.clock.time(f"drafter{who}"):
            chain = drafter.chain(tree, length, self.config.silent_stop)
            if chain is not None:  # drafted at once (`Drafter.chain`)
                tree, _ = tree.extend(chain, who)
                return tree, [who] * (tree.n_nodes - 1)
            frontier = torch.zeros(1, dtype=torch.long, device=tree.device)
            for _ in range(length):
                tree, frontier = expand_frontier(drafter, who, tree, frontier, 1)
                calls.append(who)
                if frontier.numel() == 0 or unsure(tree, frontier, self.config.silent_stop):
                    break
        return tree, calls

    def _grow(
        self, step: StepContext, who: int, tree: DraftTree, frontier: Tensor
    ) -> tuple[DraftTree, Tensor]:
        drafter = step.drafters[who]
        k = self.config.top_k
        if who > 0 and drafter.can_score and step.grafter is not None:
            strong_logp = drafter.score_tree(tree)  # [n, V]
            rescoring = step.rescorer.rescore(tree, strong_logp) if step.rescorer else None
            graft = step.grafter.graft(
                tree, strong_logp, rescoring, frontier=frontier, k=k, drafter=who
            )
            if not self.config.beside_weak or frontier.numel() == 0:
                return graft.tree, graft.frontier
            grown, weak = expand_frontier(step.drafters[0], 0, graft.tree, frontier, k)
            both = torch.unique(torch.cat([weak, graft.frontier]))
            return grown, grown.best(both, k)
        if frontier.numel() == 0:
            return tree, frontier
        return expand_frontier(drafter, who, tree, frontier, k)

    def _choose(
        self,
        step: StepContext,
        layer: int,
        tree: DraftTree,
        frontier: Tensor,
        calls: list[int],
        facts: StepFacts,
    ) -> int:
        n_drafters = len(step.drafters)
        if n_drafters == 1 or (layer > 0 and step.scheduler.done_for_step()):
            return 0
        state = LayerState.of(
            layer=layer,
            calls=tuple(calls),
            step=facts,
            tree=tree_facts(step, tree, frontier, self.config.top_k),
        )
        who = int(step.scheduler.decide(state))
        if not 0 <= who < n_drafters:
            raise ValueError(f"scheduler chose drafter {who}; expected 0 <= index < {n_drafters}")
        if who > 0 and state.strong_calls >= state.max_strong_calls:
            return 0
        return who

    def _cap(self, times: StepTimes) -> int:
        if self.config.max_strong_calls is not None:
            return self.config.max_strong_calls
        t_target = times.target
        t_strong = max(times.drafters[1:], default=0.0)
        if t_target <= 0 or t_strong <= 0:
            return self.config.depth
        return max(1, int(t_target // t_strong))


def expand_frontier(
    drafter: Any, who: int, tree: DraftTree, frontier: Tensor, k: int
) -> tuple[DraftTree, Tensor]:
    """`drafter` (index `who`) proposes `k` children (or chains) under each frontier node; the
    tree with them hung on, and its best `k` chain tails as the new frontier."""
    tree, node_of = tree.extend(drafter.expand(tree, frontier, k), who)
    return tree, tree.best(chain_tails(node_of), k)


def unsure(tree: DraftTree, frontier: Tensor, low: float | None) -> bool:
    """Whether growth stops at a confidence of `low` (None: never): every frontier node's edge
    probability is below it (reads the frontier's scores on the host)."""
    if low is None or frontier.numel() == 0:
        return False
    return bool(tree.edge_logp[frontier].max() < math.log(low))


class StepTimes(NamedTuple):
    """The measured forward times a step's decisions read (running medians; 0 while unknown)."""

    target: float  # seconds of one target forward
    drafters: tuple[float, ...]  # seconds of one forward (or layer) per drafter

    @classmethod
    def read(cls, step: StepContext) -> StepTimes:
        return cls(step.timings.target_time(), step.timings.drafter_times(len(step.drafters)))


def kept(tree: DraftTree, budget: int) -> Tensor:
    """The nodes to verify, ascending: `prune_to_budget`'s best `budget` non-root nodes, less
    the logically deleted ones (score -inf or NaN, or under such a node: a grafter may leave a
    finite score under a dead node), which are never verified. On the host prune's devices
    (the CPU), from the tree's host lists: no tensor reads, no kernel dispatch."""
    if choose_backend("prune_to_budget", tree.parents) == "host":
        host = tree.host()
        keep = kept_nodes(host.parents, host.score, host.depth, budget)
        if keep is not None:  # always, for a tree built by `DraftTree` (parents first)
            alive = live_host(host.parents, host.score)
            return host_tensor([i for i in keep if alive[i]])
    keep = prune_to_budget(tree.parents, tree.score, tree.depth, budget)
    dead = ~torch.isfinite(tree.score)  # [n]
    dead[0] = False  # the root is always verified
    alive = ~(tree.ancestor_mask() & dead[None, :]).any(-1)  # [n] no dead node on the path
    return keep[alive[keep]]


def live_host(parents: list[int], score: list[float]) -> list[bool]:
    """Per node (parents first): its score and every ancestor's but the root's are finite."""
    alive = [True]
    for i in range(1, len(parents)):
        alive.append(alive[parents[i]] and math.isfinite(score[i]))
    return alive


def adaptive_size(
    step: StepContext, tree: DraftTree, budget: int, curve: Any, drafting_s: float
) -> int:
    """`verify_size` under the target's curve as the decode loop observes it; in the loop, once
    in a while, a size whose forwards it has not observed enough (`ObservedCurve.unseen`: a
    probe, so that a wrongly measured curve cannot keep the builder from the sizes that pay)."""
    if not isinstance(curve, ObservedCurve):
        return verify_size(tree, budget, curve, drafting_s)
    size = verify_size(tree, budget, curve.current(), drafting_s)
    if step.step is not None:
        probe = curve.unseen(min(budget, tree.n_nodes - 1) + 1)
        if probe is not None:
            size = max(size, probe - 1)
    return size


def verify_size(tree: DraftTree, budget: int, curve: Any, drafting_s: float) -> int:
    """How many of the tree's best `budget` nodes to verify (0 .. budget).

    A node's score is its path's log-probability under the drafters, so `exp(score)` estimates
    the chance that the target accepts it, and the best `n` nodes (ancestor-closed, as
    `prune_to_budget` keeps them) are expected to commit `1 + sum of their exp(score)` tokens
    (the bonus included). Verifying them costs one target forward of `1 + n` tokens, `curve(1 + n)`
    seconds, on top of the step's drafting, `drafting_s`. The size maximising expected tokens per
    second of the step wins. On hardware where a forward of many tokens costs about as much as
    one (a GPU), that is nearly the whole budget; on a CPU, where each token adds to the forward,
    the tree is cut to its likely nodes. One device-to-host read of the `budget` best scores.
    """
    top = best_scores(tree, budget)  # descending
    if not top:
        return 0
    seconds = curve_table(curve, len(top) + 1)  # forwards of 1 .. 1 + m tokens
    best, best_rate, expected = 0, -math.inf, 1.0
    for n in range(len(top) + 1):
        if n:
            expected += min(1.0, math.exp(top[n - 1]))
        rate = expected / (drafting_s + seconds[n])
        if rate > best_rate:  # the smallest size among equals
            best, best_rate = n, rate
    return best


def best_scores(tree: DraftTree, m: int) -> list[float]:
    """The `m` highest finite scores of the non-root nodes, descending (fewer if the tree has
    fewer): a Python sort on CPU, a top-k and one read elsewhere."""
    if tree.device.type == "cpu":
        finite = [x for x in tree.host().score[1:] if math.isfinite(x)]
        return sorted(finite, reverse=True)[:m]
    return best_scores_on_device(tree, m)


def best_scores_on_device(tree: DraftTree, m: int) -> list[float]:
    """`best_scores` with a top-k on the tree's device."""
    scores = tree.score[1:]
    scores = scores[torch.isfinite(scores)]
    return scores.topk(min(m, int(scores.numel()))).values.tolist()


@functools.lru_cache(maxsize=64)
def curve_table(curve: Any, m: int) -> tuple[float, ...]:
    """`curve` at 1 .. m tokens (the adaptive size reads it every step; curves are immutable)."""
    return tuple(curve.many(np.arange(1, m + 1)).tolist())


def chain_tails(node_of: Tensor) -> Tensor:
    """`[m]` node index of the last valid entry of each proposal row (-1 for empty rows); on the
    host for CPU tensors."""
    if node_of.device.type != "cpu":
        return chain_tails_on_device(node_of)
    tails = []
    for row in node_of.tolist():  # plain loops: a generator per row costs more than the row
        tail = -1
        for x in row:
            if x >= 0:
                tail = x
        tails.append(tail)
    return host_tensor(tails)


def chain_tails_on_device(node_of: Tensor) -> Tensor:
    """`chain_tails` with torch ops on the tensor's device."""
    valid = node_of >= 0  # [m, c]
    last = valid.long().cumsum(-1).argmax(-1)  # index of the last valid column
    tails = node_of.gather(1, last[:, None]).squeeze(1)
    return torch.where(valid.any(-1), tails, -1)


def step_facts(
    step: StepContext,
    n_layers: int,
    cap: int,
    *,
    times: StepTimes | None = None,
    peek: Peek | None = None,
) -> StepFacts:
    """The `LayerState` facts constant within a step. `times`: the step's measured forward times
    if already read (else read from `step.timings`); `peek`: the cheapest drafter's
    `Drafter.peek` at the step's root, if the scheduler wants it."""
    if times is None:
        times = StepTimes.read(step)
    return StepFacts(
        n_layers=n_layers,
        n_drafters=len(step.drafters),
        max_strong_calls=cap,
        prompt_len=step.prompt_len,
        committed_len=step.committed_len,
        target_time=times.target,
        drafter_times=times.drafters,
        history=step.history,
        peek=peek,
    )


def tree_facts(step: StepContext, tree: DraftTree, frontier: Tensor, k: int) -> TreeFacts:
    """Cheap frontier statistics for the scheduler: in numpy on CPU, else computed on the tree's
    device and read to the host together (one transfer per layer, the one the decision needs)."""
    if tree.device.type == "cpu":
        depth, leaves, score, expected, best = tree_stats_host(tree, frontier)
        shift = reselect_shift(step, tree, frontier, k)
    else:
        shift_t = reselect_shift_on_device(step, tree, frontier, k)
        depth, leaves, score, expected, best, shift = tree_stats_device(tree, frontier, shift_t)
    return TreeFacts(
        n_nodes=tree.n_nodes,
        frontier_size=int(frontier.numel()),
        frontier_mean_depth=depth,
        leaf_ratio=leaves,
        frontier_mean_score=score,
        reselect_shift=shift,
        tree_expected=expected,
        frontier_max_score=best,
    )


def tree_stats_host(tree: DraftTree, frontier: Tensor) -> list[float]:
    """Frontier mean depth, leaf ratio, frontier mean score, expected acceptance (sum of
    `exp(score)` over the non-root nodes) and frontier max score, over Python lists (CPU trees of
    a few dozen nodes: cheaper than array calls)."""
    host = tree.host()
    score, parents = host.score, host.parents
    leaf_ratio = 1.0 - len(set(parents[1:])) / len(parents)
    expected = sum(map(math.exp, score[1:]))
    front = frontier.tolist()
    f = len(front)
    if not f:
        return [0.0, leaf_ratio, 0.0, expected, 0.0]
    depth = host.depth
    fs = [score[i] for i in front]
    return [sum(depth[i] for i in front) / f, leaf_ratio, sum(fs) / f, expected, max(fs)]


def tree_stats_device(tree: DraftTree, frontier: Tensor, *extra: Tensor) -> list[float]:
    """`tree_stats_host` with torch ops on the tree's device, then the 0-d `extra` tensors, read
    to the host at once."""
    f = int(frontier.numel())
    zero = torch.zeros((), device=tree.device)
    fs = tree.score[frontier].float()  # [f]
    return torch.stack(
        [
            tree.depth[frontier].float().mean() if f else zero,
            tree.is_leaf().float().mean(),
            fs.mean() if f else zero,
            tree.score[1:].float().exp().sum(),
            fs.max() if f else zero,
            *(e.float() for e in extra),
        ]
    ).tolist()


def reselect_shift(step: StepContext, tree: DraftTree, frontier: Tensor, k: int) -> float:
    """Fraction of the frontier that re-selecting graft positions now would replace (0 without a
    grafter, 1 when the frontier is empty); in numpy (CPU trees)."""
    if step.grafter is None:
        return 0.0
    if frontier.numel() == 0:
        return 1.0
    chosen = set(step.grafter.positions(tree, frontier, k).tolist())
    front = frontier.tolist()
    return sum(node not in chosen for node in front) / len(front)


def reselect_shift_on_device(
    step: StepContext, tree: DraftTree, frontier: Tensor, k: int
) -> Tensor:
    """`reselect_shift` as a 0-d tensor on the tree's device (no host read)."""
    if step.grafter is None or frontier.numel() == 0:
        return torch.full((), 0.0 if step.grafter is None else 1.0, device=tree.device)
    chosen = step.grafter.positions(tree, frontier, k)
    return 1.0 - torch.isin(frontier, chosen).float().mean()
