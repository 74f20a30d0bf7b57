"""A third-party plugin for tests whose components return garbage on demand.

Each faulty component does honest work (a random drafter proposing valid tokens, the built-in
layered builder, reselect grafter, overwrite rescorer, always scheduler and greedy verifier)
and, at its `at_call`-th call, replaces what it returns with the fault named by `fault` (the
tables below): some break an invariant (the decoder must raise a `PluginError` naming the
component), others are valid garbage (random but well-formed trees: decoding must still equal
plain decoding). The faults of `INPUT_FAULTS` write into the tree the component was given
instead, in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.config import NoConfig, field
from treegraft.core.hookspecs import hookimpl
from treegraft.core.interfaces import (
    BuildResult,
    Drafter,
    Graft,
    Grafter,
    LayerState,
    Rescorer,
    Rescoring,
    Scheduler,
    StepContext,
    TreeBuilder,
    Verdict,
    Verifier,
)
from treegraft.core.tree import DraftTree, Proposal
from treegraft.plugins.builders.layered import LayeredBuilder, LayeredConfig
from treegraft.plugins.grafters.reselect import ReselectConfig, ReselectGrafter
from treegraft.plugins.rescorers.basic import OverwriteRescorer
from treegraft.plugins.verifiers.greedy import GreedyVerifier

#: the distribution name a test registry gives this plugin (`<plugin faulty>`)
PLUGIN_NAME = "faulty"


@attrs.frozen
class FaultConfig:
    """Which fault, at which call (0-based; -1: every call), and the seed of the garbage."""

    fault: str = field("none", doc="a key of FAULTS[kind]")
    at_call: int = field(0, doc="the call that returns garbage (-1: every call)")
    seed: int = field(0, doc="seed of the random proposals and garbage")


def _raise(*_: Any) -> Any:
    raise RuntimeError("the plugin broke down")


def _evolve_tree(tree: DraftTree, **fields: Tensor) -> DraftTree:
    return attrs.evolve(tree, **fields)


def _bump_last_depth(tree: DraftTree) -> DraftTree:
    if tree.n_nodes < 2:
        return _evolve_tree(tree, depth=tree.depth + 1)
    depth = tree.depth.clone()
    depth[-1] += 1
    return _evolve_tree(tree, depth=depth)


def _root_token(tree: DraftTree, vocab: int) -> DraftTree:
    tokens = tree.tokens.clone()
    tokens[0] = (tokens[0] + 1) % vocab
    return _evolve_tree(tree, tokens=tokens)


def _token(tree: DraftTree, value: int) -> DraftTree:
    tokens = tree.tokens.clone()
    tokens[-1] = value
    return _evolve_tree(tree, tokens=tokens)


def _nan_score(tree: DraftTree) -> DraftTree:
    score = tree.score.clone()
    score[-1] = float("nan")
    return _evolve_tree(tree, score=score)


def _reversed_parents(tree: DraftTree) -> DraftTree:
    parents = tree.parents.clone()
    parents[-1] = tree.n_nodes  # a child before its parent (and outside the tree)
    return _evolve_tree(tree, parents=parents)


def _valid_random_tree(tree: DraftTree, vocab: int, g: torch.Generator) -> DraftTree:
    """A well-formed chain of random tokens under the same root (valid garbage)."""
    n = max(2, tree.n_nodes)
    tokens = torch.randint(0, vocab, (n,), generator=g)
    tokens[0] = tree.tokens[0]
    parents = torch.arange(-1, n - 1)
    logp = -torch.rand(n, generator=g, dtype=torch.float64).to(tree.score.dtype)
    return DraftTree.from_parents(tokens, parents, edge_logp=logp)


PROPOSAL_FAULTS: dict[str, Callable[[Proposal, int, torch.Generator], Any]] = {
    "none": lambda p, v, g: p,
    "raise": _raise,
    "None": lambda p, v, g: None,
    "list": lambda p, v, g: [p.parents.tolist(), p.tokens.tolist()],
    "flat_tokens": lambda p, v, g: attrs.evolve(p, tokens=p.tokens.flatten()),
    "float_tokens": lambda p, v, g: attrs.evolve(p, tokens=p.tokens.double()),
    "parent_out_of_range": lambda p, v, g: attrs.evolve(p, parents=p.parents + 10_000),
    "negative_parent": lambda p, v, g: attrs.evolve(p, parents=p.parents - 10_000),
    "token_out_of_vocab": lambda p, v, g: attrs.evolve(p, tokens=p.tokens + v),
    "negative_token": lambda p, v, g: attrs.evolve(p, tokens=p.tokens - v - 5),
    "nan_logp": lambda p, v, g: attrs.evolve(p, logp=p.logp * float("nan")),
    "short_logp": lambda p, v, g: attrs.evolve(p, logp=p.logp[:, :0]),
    # valid garbage: decoding must not change
    "random_tokens": lambda p, v, g: attrs.evolve(
        p, tokens=torch.randint(0, v, p.tokens.shape, generator=g)
    ),
    "duplicate_rows": lambda p, v, g: Proposal(
        torch.cat([p.parents, p.parents]),
        torch.cat([p.tokens, p.tokens]),
        torch.cat([p.logp, p.logp]),
    ),
    "empty": lambda p, v, g: Proposal.empty(p.parents.device, p.logp.dtype),
    "slow": lambda p, v, g: time.sleep(0.02) or p,
}

SCORE_FAULTS: dict[str, Callable[[Tensor, int, torch.Generator], Any]] = {
    "none": lambda x, v, g: x,
    "raise": _raise,
    "None": lambda x, v, g: None,
    "nan": lambda x, v, g: x * float("nan"),
    "inf": lambda x, v, g: x.clone().fill_(float("inf")),
    "wrong_shape": lambda x, v, g: x[:, : v // 2],
    "transposed": lambda x, v, g: x.T,
    "list": lambda x, v, g: x.tolist(),
    # valid garbage
    "scores_nothing": lambda x, v, g: torch.full_like(x, -float("inf")),
    "random": lambda x, v, g: torch.log_softmax(
        torch.randn(x.shape, generator=g, dtype=torch.float64), -1
    ).to(x.dtype),
}

TREE_FAULTS: dict[str, Callable[[DraftTree, int, torch.Generator], Any]] = {
    "none": lambda t, v, g: t,
    "raise": _raise,
    "None": lambda t, v, g: None,
    "depth": lambda t, v, g: _bump_last_depth(t),
    "root_token": lambda t, v, g: _root_token(t, v),
    "token_out_of_vocab": lambda t, v, g: _token(t, v + 3),
    "negative_token": lambda t, v, g: _token(t, -2),
    "nan_score": lambda t, v, g: _nan_score(t),
    "parent_after_child": lambda t, v, g: _reversed_parents(t),
    "float_tokens": lambda t, v, g: _evolve_tree(t, tokens=t.tokens.double()),
    # valid garbage
    "random_tree": _valid_random_tree,
}

RESCORING_FAULTS: dict[str, Callable[[Rescoring, int, torch.Generator], Any]] = {
    "none": lambda r, v, g: r,
    "raise": _raise,
    "tuple": lambda r, v, g: (r.edge_logp, r.score),
    "nan": lambda r, v, g: attrs.evolve(r, score=r.score * float("nan")),
    "short": lambda r, v, g: attrs.evolve(r, score=r.score[:-1]),
    "meta": lambda r, v, g: attrs.evolve(r, score=r.score.to("meta")),
    "root_deleted": lambda r, v, g: attrs.evolve(r, score=r.score - float("inf")),
}

#: decisions for the scheduler's `decide` (the honest one: the strongest drafter)
DECISION_FAULTS: dict[str, Callable[[int, int, torch.Generator], Any]] = {
    "none": lambda d, v, g: d,
    "raise": _raise,
    "None": lambda d, v, g: None,
    "float": lambda d, v, g: float(d),
    "nan": lambda d, v, g: float("nan"),
    "bool": lambda d, v, g: True,
    "bool_tensor": lambda d, v, g: torch.tensor(True),
    "numpy_bool": lambda d, v, g: np.bool_(True),
    "out_of_range": lambda d, v, g: 7,
    # valid: an index by any integer type
    "numpy_int": lambda d, v, g: np.int64(d),
    "int_tensor": lambda d, v, g: torch.tensor(d),
}

#: answers of the scheduler's `wants_peek` and `done_for_step` (the honest one: False)
FLAG_FAULTS: dict[str, Callable[[bool, int, torch.Generator], Any]] = {
    "none": lambda f, v, g: f,
    "flag_None": lambda f, v, g: None,
    "flag_nan": lambda f, v, g: float("nan"),
    "flag_str": lambda f, v, g: "no",
    "flag_array": lambda f, v, g: np.array([True, False]),
    "flag_tensor": lambda f, v, g: torch.tensor([1, 0]),
    # valid: numpy's bool
    "flag_numpy": lambda f, v, g: np.bool_(f),
}

VERDICT_FAULTS: dict[str, Callable[[Verdict, int, torch.Generator], Any]] = {
    "none": lambda d, v, g: d,
    "raise": _raise,
    "tuple": lambda d, v, g: (d.path, d.length, d.bonus),
    "float_bonus": lambda d, v, g: attrs.evolve(d, bonus=d.bonus.double()),
    "int_bonus": lambda d, v, g: attrs.evolve(d, bonus=int(d.bonus)),
    "bonus_out_of_vocab": lambda d, v, g: attrs.evolve(d, bonus=d.bonus + v),
    "meta_path": lambda d, v, g: attrs.evolve(d, path=d.path.to("meta")),
    "meta_bonus": lambda d, v, g: attrs.evolve(d, bonus=d.bonus.to("meta")),
    "long_length": lambda d, v, g: attrs.evolve(d, length=d.length + 10_000),
}

#: writes into the tree a component was given, in place, before it answers honestly
INPUT_FAULTS: dict[str, Callable[[DraftTree, int], Any]] = {
    "write_root": lambda t, v: t.tokens[:1].add_(1).remainder_(v),
    "write_parents": lambda t, v: t.parents[-1:].fill_(0),
    "write_depth": lambda t, v: t.depth[-1:].add_(1),
    "write_score": lambda t, v: t.score.mul_(2),
}

BUILD_FAULTS: dict[str, Callable[[BuildResult, int, torch.Generator], Any]] = {
    "calls_None": lambda b, v, g: attrs.evolve(b, calls=None),
    "calls_out_of_range": lambda b, v, g: attrs.evolve(b, calls=(7, -3)),
    "calls_bool": lambda b, v, g: attrs.evolve(b, calls=(True,)),
    "meta_tree": lambda b, v, g: attrs.evolve(b, tree=_on_meta(b.tree), unpruned=_on_meta(b.tree)),
}


def _on_meta(tree: DraftTree) -> DraftTree:
    fields = ("tokens", "parents", "depth", "edge_logp", "score", "proposer", "scorer")
    return attrs.evolve(tree, **{f: getattr(tree, f).to("meta") for f in fields})


#: the faults of each kind that leave every invariant intact (decoding must not change)
VALID_GARBAGE = {
    "none",
    "slow",
    "random_tokens",
    "duplicate_rows",
    "empty",
    "random",
    "scores_nothing",
    "random_tree",
    "numpy_int",
    "int_tensor",
    "flag_numpy",
}


def _write_input(config: FaultConfig, faults: Faults, tree: DraftTree, vocab: int) -> None:
    """Apply `config`'s input fault (`INPUT_FAULTS`) to `tree` at the faulted call (counted by
    `faults`, the component's output faults, which then stay honest)."""
    if config.fault in INPUT_FAULTS and config.at_call in (-1, faults.calls):
        INPUT_FAULTS[config.fault](tree, vocab)


@attrs.define
class Faults:
    """Counts calls and applies the configured fault at the chosen one."""

    config: FaultConfig
    table: dict[str, Callable]
    calls: int = 0
    rng: torch.Generator = attrs.field(factory=torch.Generator)

    def __attrs_post_init__(self) -> None:
        self.rng.manual_seed(self.config.seed)

    def apply(self, value: Any, vocab: int) -> Any:
        """`value`, or at the faulted call its fault (`value` itself: not a fault of `table`)."""
        call, self.calls = self.calls, self.calls + 1
        fault = self.table.get(self.config.fault)
        if fault is None or self.config.at_call not in (-1, call):
            return value
        return fault(value, vocab, self.rng)


def _vocab(resources: Any) -> int:
    return resources.vocab_size(resources.target_ref)


@attrs.define
class FaultyDrafter(Drafter):
    """Proposes `k` random tokens (random log-probs) under each node; scores trees at random."""

    Config = FaultConfig
    config: FaultConfig
    vocab: int
    expand_faults: Faults
    score_faults: Faults

    @property
    def can_score(self) -> bool:  # type: ignore[override]
        if self.config.fault == "can_score_raise":
            raise AttributeError("no head")
        return "yes" if self.config.fault == "can_score_str" else True

    @classmethod
    def from_config(cls, config: FaultConfig, resources: Any) -> FaultyDrafter:
        if config.fault == "constructor":
            raise RuntimeError("cannot start: the plugin's model is missing")
        table = PROPOSAL_FAULTS if config.fault in PROPOSAL_FAULTS else {"none": lambda x, v, g: x}
        scores = SCORE_FAULTS if config.fault in SCORE_FAULTS else {"none": lambda x, v, g: x}
        plain = attrs.evolve(config, fault="none")
        return cls(
            config,
            _vocab(resources),
            Faults(config if config.fault in table else plain, table),
            Faults(config if config.fault in scores else plain, scores),
        )

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.expand_faults.rng.manual_seed(self.config.seed)

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        _write_input(self.config, self.expand_faults, tree, self.vocab)
        g = self.expand_faults.rng
        m = nodes.numel() * k
        proposal = Proposal(
            parents=nodes.repeat_interleave(k),
            tokens=torch.randint(0, self.vocab, (m, 1), generator=g),
            logp=-torch.rand((m, 1), generator=g, dtype=torch.float64).to(tree.score.dtype),
        )
        return self.expand_faults.apply(proposal, self.vocab)

    def score_tree(self, tree: DraftTree) -> Tensor:
        _write_input(self.config, self.score_faults, tree, self.vocab)
        logits = torch.randn((tree.n_nodes, self.vocab), generator=self.score_faults.rng)
        logp = torch.log_softmax(logits.double(), -1).to(tree.score.dtype)
        return self.score_faults.apply(logp, self.vocab)

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        pass

    def with_target(self, target: Any) -> Drafter:
        if self.config.fault == "adapt_raise":
            raise RuntimeError("no target here")
        return None if self.config.fault == "adapt_None" else self  # type: ignore[return-value]


@attrs.define
class FaultyBuilder(TreeBuilder):
    """The layered builder (depth 3, top_k 2, budget 8) whose trees get the fault."""

    Config = FaultConfig
    config: FaultConfig
    inner: LayeredBuilder
    vocab: int
    faults: Faults

    @classmethod
    def from_config(cls, config: FaultConfig, resources: Any) -> FaultyBuilder:
        inner = LayeredBuilder(LayeredConfig(depth=3, top_k=2, budget=8))
        return cls(config, inner, _vocab(resources), Faults(config, TREE_FAULTS | BUILD_FAULTS))

    def build(self, step: StepContext) -> BuildResult:
        if self.config.fault == "write_step_root":  # before building: the tree's root follows
            step.root.add_(1).remainder_(self.vocab)
        built = self.inner.build(step)
        if self.config.fault in BUILD_FAULTS:
            return self.faults.apply(built, self.vocab)  # the whole result's fault
        tree = self.faults.apply(built.unpruned, self.vocab)
        if tree is built.unpruned:
            return built
        if not isinstance(tree, DraftTree):
            return tree
        keep = torch.arange(tree.n_nodes)
        return BuildResult(tree=tree, kept=keep, calls=built.calls, unpruned=tree)

    def max_nodes(self) -> int:
        return max(self.inner.max_nodes(), 12)

    def check_drafters(self, n_drafters: int) -> None:
        if self.config.fault == "check_raise":
            raise KeyError("drafters")

    def with_clock(self, now: Callable[[], float]) -> TreeBuilder:
        if self.config.fault == "adapt_raise":
            raise RuntimeError("no clock here")
        return None if self.config.fault == "adapt_None" else self  # type: ignore[return-value]


@attrs.define
class FaultyGrafter(Grafter):
    """The reselect grafter (lookback 2) whose grafted trees get the fault."""

    Config = FaultConfig
    config: FaultConfig
    inner: ReselectGrafter
    vocab: int
    faults: Faults

    @classmethod
    def from_config(cls, config: FaultConfig, resources: Any) -> FaultyGrafter:
        inner = ReselectGrafter(ReselectConfig(lookback=2))
        return cls(config, inner, _vocab(resources), Faults(config, TREE_FAULTS))

    def positions(self, tree: DraftTree, frontier: Tensor, k: int) -> Tensor:
        return self.inner.positions(tree, frontier, k)

    def graft(self, tree: DraftTree, strong_logp: Tensor, rescoring: Rescoring, **kw) -> Graft:
        _write_input(self.config, self.faults, tree, self.vocab)
        graft = self.inner.graft(tree, strong_logp, rescoring, **kw)
        grown = self.faults.apply(graft.tree, self.vocab)
        if grown is graft.tree or not isinstance(grown, DraftTree):
            return graft if grown is graft.tree else grown
        frontier = graft.frontier[graft.frontier < grown.n_nodes]
        return Graft(tree=grown, frontier=frontier)


@attrs.define
class FaultyRescorer(Rescorer):
    """The overwrite rescorer whose rescorings get the fault."""

    Config = FaultConfig
    config: FaultConfig
    vocab: int
    faults: Faults

    @classmethod
    def from_config(cls, config: FaultConfig, resources: Any) -> FaultyRescorer:
        return cls(config, _vocab(resources), Faults(config, RESCORING_FAULTS))

    def rescore(self, tree: DraftTree, strong_logp: Tensor) -> Rescoring:
        _write_input(self.config, self.faults, tree, self.vocab)
        honest = OverwriteRescorer(NoConfig()).rescore(tree, strong_logp)
        return self.faults.apply(honest, self.vocab)


@attrs.define
class FaultyScheduler(Scheduler):
    """Calls the strongest drafter at every layer; its decisions or flags get the fault."""

    Config = FaultConfig
    config: FaultConfig
    decisions: Faults
    flags: Faults

    @classmethod
    def from_config(cls, config: FaultConfig, resources: Any) -> FaultyScheduler:
        return cls(config, Faults(config, DECISION_FAULTS), Faults(config, FLAG_FAULTS))

    def decide(self, state: LayerState) -> int:
        return self.decisions.apply(state.n_drafters - 1, 0)

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        if self.config.fault == "check_raise":
            raise KeyError("layers")

    def wants_peek(self) -> bool:
        return self.flags.apply(False, 0)

    def done_for_step(self) -> bool:
        return self.flags.apply(False, 0)


@attrs.define
class FaultyVerifier(Verifier):
    """The greedy verifier whose verdicts get the fault."""

    Config = FaultConfig
    config: FaultConfig
    vocab: int
    faults: Faults

    @classmethod
    def from_config(cls, config: FaultConfig, resources: Any) -> FaultyVerifier:
        return cls(config, _vocab(resources), Faults(config, VERDICT_FAULTS))

    def verify(self, tree: DraftTree, target_logits: Tensor) -> Verdict:
        _write_input(self.config, self.faults, tree, self.vocab)
        honest = GreedyVerifier(NoConfig()).verify(tree, target_logits)
        return self.faults.apply(honest, self.vocab)


def plugin() -> ModuleType:
    """The plugin module: registers `faulty` as a component of every kind."""
    module = ModuleType(PLUGIN_NAME)

    @hookimpl
    def treegraft_register_drafters(register):
        register("faulty", FaultyDrafter)

    @hookimpl
    def treegraft_register_builders(register):
        register("faulty", FaultyBuilder)

    @hookimpl
    def treegraft_register_grafters(register):
        register("faulty", FaultyGrafter)

    @hookimpl
    def treegraft_register_rescorers(register):
        register("faulty", FaultyRescorer)

    @hookimpl
    def treegraft_register_schedulers(register):
        register("faulty", FaultyScheduler)

    @hookimpl
    def treegraft_register_verifiers(register):
        register("faulty", FaultyVerifier)

    for impl in (
        treegraft_register_drafters,
        treegraft_register_builders,
        treegraft_register_grafters,
        treegraft_register_rescorers,
        treegraft_register_schedulers,
        treegraft_register_verifiers,
    ):
        setattr(module, impl.__name__, impl)
    return module
