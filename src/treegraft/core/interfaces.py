"""The six component interfaces and the value objects they exchange.

Each interface is a small abstract class with one main verb. Concrete components are attrs
classes registered through the plugin hooks (`treegraft.core.hookspecs`); their hyper-parameters
live in a nested attrs `Config` class and heavy resources (models) arrive through the named
constructor `from_config(config, resources)`.

Shapes use `n` for the number of tree nodes (root included), `V` for the vocabulary size, `m` for
proposal rows and `c` for chain length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import attrs
import torch
from torch import Tensor

from treegraft.core.metrics import AcceptHistory, Clock, ForwardTimes
from treegraft.core.tree import DraftTree, Proposal

if TYPE_CHECKING:
    from treegraft.core.resources import Resources


class Component(ABC):
    """Base of every component: a `Config` attrs class and a named constructor."""

    #: attrs class holding the component's hyper-parameters (the YAML keys besides `name`).
    Config: ClassVar[type]

    @classmethod
    def from_config(cls, config: Any, resources: Resources) -> Component:
        """Build the component from its validated config; heavy resources come from `resources`."""
        return cls(config)  # type: ignore[call-arg]


# ---------------------------------------------------------------------------- value objects


@attrs.frozen(eq=False)
class Verdict:
    """What the verifier accepted in one step.

    Attributes:
        path: `[n]` int64 node indices of the accepted path from the root (path[0] == 0), in
            depth order, padded with -1.
        length: 0-d int64, number of nodes on the path including the root (>= 1).
        bonus: 0-d int64, the target's token after the last accepted node.
    """

    path: Tensor
    length: Tensor
    bonus: Tensor


class Peek(NamedTuple):
    """What a drafter expects of its own best proposal under a step's root, before it proposes
    (`Drafter.peek`): the scheduler's look at the step's text before its first decision."""

    #: expected accepted tokens of the best proposal (sum over its tokens of the probability
    #: that the chain is right up to there, from the drafter's own calibrated scores)
    expected: float
    #: probability of that proposal's first token (0 when the drafter has nothing to propose)
    first: float
    #: the proposal's tokens, best first (() when the drafter has nothing to propose; None when
    #: it does not say): the plain switch checks them against what plain decoding commits
    chain: tuple[int, ...] | None = None


@attrs.frozen
class StepFacts:
    """The part of a `LayerState` that stays the same at every layer of one step.

    Attributes:
        n_layers: total layers of the builder (its `depth`).
        n_drafters: number of drafters in the pipeline (cheapest first).
        max_strong_calls: cap on strong calls per step.
        prompt_len: prompt length in tokens.
        committed_len: committed tokens so far (prompt included).
        target_time: measured seconds of one target tree forward (running median; 0 if unknown).
        drafter_times: measured seconds of one tree forward per drafter (0 if unknown).
        history: how earlier steps of this generation went (None if unknown).
        peek: what the cheapest drafter expects under the step's root (None if it cannot tell).
    """

    n_layers: int
    n_drafters: int
    max_strong_calls: int
    prompt_len: int
    committed_len: int
    target_time: float
    drafter_times: tuple[float, ...]
    history: AcceptHistory | None = None
    peek: Peek | None = None


@attrs.frozen
class TreeFacts:
    """The part of a `LayerState` read off the tree before a layer grows (see `LayerState`)."""

    n_nodes: int
    frontier_size: int
    frontier_mean_depth: float
    leaf_ratio: float
    frontier_mean_score: float
    reselect_shift: float
    tree_expected: float = 0.0
    frontier_max_score: float = 0.0


@attrs.frozen
class LayerState:
    """Cheap features a scheduler sees before each layer of tree growth (all host floats).

    A builder makes it from named parts with `LayerState.of`: the layer and the calls so far, the
    step's `StepFacts` and the tree's `TreeFacts`; schedulers read the flat fields below.

    Attributes:
        layer: index of the layer about to be grown (0-based).
        n_layers: total layers of the builder (its `depth`).
        calls: drafter index that acted at each earlier layer of this step.
        n_drafters: number of drafters in the pipeline (cheapest first).
        strong_calls: layers of this step at which a drafter other than drafter 0 acted.
        max_strong_calls: cap on such calls per step.
        n_nodes: current number of tree nodes (root included).
        frontier_size: nodes about to be expanded (0 when the weak drafter has collapsed).
        frontier_mean_depth: mean depth of the frontier nodes.
        leaf_ratio: fraction of tree nodes without children.
        frontier_mean_score: mean cumulative log-prob of the frontier nodes.
        reselect_shift: fraction of the current frontier that a reselection with lookback would
            replace (the "collapse debt"; 0 when unknown).
        prompt_len: prompt length in tokens.
        committed_len: committed tokens so far (prompt included).
        target_time: measured seconds of one target tree forward (running median; 0 if unknown).
        drafter_times: measured seconds of one tree forward per drafter (0 if unknown).
        tree_expected: expected accepted draft tokens of the tree so far, the sum of
            `exp(score)` over its nodes (scores are path log-probs under the drafters).
        frontier_max_score: best cumulative log-prob among the frontier nodes (0 when empty).
        history: how earlier steps of this generation went (`AcceptHistory`; None if unknown).
        peek: what the cheapest drafter expects of its best proposal under this step's root
            (`Drafter.peek`, the same at every layer of the step; None if it cannot tell).
    """

    layer: int
    n_layers: int
    calls: tuple[int, ...]
    n_drafters: int
    strong_calls: int
    max_strong_calls: int
    n_nodes: int
    frontier_size: int
    frontier_mean_depth: float
    leaf_ratio: float
    frontier_mean_score: float
    reselect_shift: float
    prompt_len: int
    committed_len: int
    target_time: float
    drafter_times: tuple[float, ...]
    tree_expected: float = 0.0
    frontier_max_score: float = 0.0
    history: AcceptHistory | None = None
    peek: Peek | None = None

    @classmethod
    def of(
        cls, *, layer: int, calls: tuple[int, ...], step: StepFacts, tree: TreeFacts
    ) -> LayerState:
        """The state before growing `layer`, after the drafters `calls` acted at earlier layers."""
        return cls(
            layer=layer,
            n_layers=step.n_layers,
            calls=calls,
            n_drafters=step.n_drafters,
            strong_calls=sum(1 for c in calls if c > 0),
            max_strong_calls=step.max_strong_calls,
            n_nodes=tree.n_nodes,
            frontier_size=tree.frontier_size,
            frontier_mean_depth=tree.frontier_mean_depth,
            leaf_ratio=tree.leaf_ratio,
            frontier_mean_score=tree.frontier_mean_score,
            reselect_shift=tree.reselect_shift,
            prompt_len=step.prompt_len,
            committed_len=step.committed_len,
            target_time=step.target_time,
            drafter_times=step.drafter_times,
            tree_expected=tree.tree_expected,
            frontier_max_score=tree.frontier_max_score,
            history=step.history,
            peek=step.peek,
        )


@attrs.frozen
class StepOutcome:
    """What a scheduler learns after verification: how the step went."""

    step: int
    calls: tuple[int, ...]
    n_nodes: int
    accepted: int  # draft nodes accepted (bonus excluded)
    target_time: float
    drafter_times: tuple[float, ...]
    #: wall seconds of the step as the decoder timed it (build, target, verify, commit)
    seconds: float = 0.0
    #: accepted draft nodes that a drafter other than drafter 0 proposed
    strong_accepted: int = 0
    #: the step ended the generation (its tokens may be cut at the end, nothing was committed)
    final: bool = False


@attrs.frozen(eq=False)
class Rescoring:
    """New edge log-probs and cumulative scores for every node (`[n]` each)."""

    edge_logp: Tensor
    score: Tensor


@attrs.frozen(eq=False)
class Graft:
    """A tree after a strong call, and the frontier to expand next (`[f]` node indices)."""

    tree: DraftTree
    frontier: Tensor


@attrs.frozen(eq=False)
class BuildResult:
    """The verified tree and where its nodes came from.

    Attributes:
        tree: the pruned draft tree sent to the target.
        kept: `[n]` int64, for each node of `tree` its index in the unpruned tree the drafters saw.
        calls: drafter index that acted at each layer.
        unpruned: the tree before the final budget prune (for traces).
        plain: the builder drafted nothing, to decode this step plainly (the root alone); the
            decoder leaves the step out of what the scheduler and the forward times learn from.
        silent: the builder decided the step without the scheduler (the layered builder's
            `silent_chain`: the cheapest drafter had nothing under the root, and the
            `silent_drafter`'s chain or the root alone went); the decoder leaves the step out of
            what the scheduler learns from.
    """

    tree: DraftTree
    kept: Tensor
    calls: tuple[int, ...]
    unpruned: DraftTree
    plain: bool = False
    silent: bool = False


# ---------------------------------------------------------------------------- interfaces


class Drafter(Component):
    """Proposes draft tokens and keeps its own view of the committed sequence.

    A drafter sees a growing tree during one step; node indices refer to that (unpruned) tree.
    """

    #: Whether `score_tree` is available (language-model drafters).
    can_score: ClassVar[bool] = False
    #: Whether the drafter reads the target runner's hidden states (`track_hidden`), which
    #: only the lean forward keeps: `decoding.forward: auto` then never gives the target the
    #: tree-attention kernel (feature-level drafters).
    reads_target_features: ClassVar[bool] = False

    @classmethod
    def check_config(cls, config: Any, resources: Resources) -> None:
        """Raise `ValueError` (`field: problem`) for what is wrong with `config` that shows
        without loading models: a file it names that is missing, a size past the model's
        vocabulary read from its config. `treegraft validate` builds no drafter (drafters load
        models) and asks here instead. Default: nothing to check."""

    @abstractmethod
    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        """Start a new generation from `prompt` (`[T]` int64; its last token is the first root).

        `max_len` estimates the committed length the generation can reach (prompt + new tokens +
        one tree), for preallocating caches.
        """

    @abstractmethod
    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        """Propose up to `k` distinct children (or chains) under each of `nodes` (`[f]` int64)."""

    def score_tree(self, tree: DraftTree) -> Tensor:
        """Next-token log-probs after every node, `[n, V]`, from one forward over the tree.

        A drafter that scores only some tokens (a restricted head) gives the others -inf:
        rescorers keep the current edge log-prob of a node carrying such a token."""
        raise NotImplementedError(f"{type(self).__name__} cannot score a tree")

    def peek(self, tree: DraftTree) -> Peek | None:
        """What this drafter expects of its best proposal under the root of `tree` (a step's
        tree before any layer grew), without proposing and without changing its state.

        Cheap drafters answer so that a scheduler can read the step's text before its first
        decision (the n-gram drafter: a lookup of the context's suffix). None: cannot tell
        cheaply (the default).
        """
        return None

    def chain(self, tree: DraftTree, length: int, stop: float) -> Proposal | None:
        """Its greedy chain under the root of `tree` (a step's tree of the root alone), as one
        `Proposal` row: up to `length` tokens, ending after the first whose probability is below
        `stop`. The same tokens as `expand(tree, [last node], 1)` called token by token (the
        layered builder's silent steps), drafted where the drafter can do it faster: a language
        model forwards each token with no tree to build. None (the default): the builder calls
        `expand` token by token.
        """
        return None

    def rewind(self) -> None:
        """Forget the tree seen in this step, as if the step had not begun.

        Lets offline tools (the scheduler's value system) build several counterfactual trees for
        the same committed state. Drafters without per-step state need not override it.
        """

    def with_target(self, target: Any) -> Drafter:
        """A drafter for a decoder whose target runner is `target` (the benchmark's replay,
        where a stand-in answers from a recorded continuation): a drafter that reads the target
        runner (its hidden states) returns a copy of its own that reads `target`. Default: this
        drafter (it does not read the target)."""
        return self

    def forget(self) -> None:
        """Drop what this drafter carries from one generation into the next (rates it learned),
        so that its next generation starts as a new drafter's would. The scheduler's value
        system starts every prompt so, in collection and in replay alike: a prompt's states
        then depend on it alone, not on the prompts before it. Default: nothing carried."""

    @abstractmethod
    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        """Record a step's outcome.

        Args:
            accepted: `[a]` int64 node indices (of the unpruned tree) of the accepted path,
                root first.
            tokens: `[a]` int64 newly committed tokens: the accepted drafts, then the bonus.
        """


class Scheduler(Component):
    """Decides, per layer, which drafter acts (0 = the cheapest).

    Life cycle, as the decoder drives it (the scheduler's value system drives the same step):

    1. `from_config(config, resources)` once per pipeline;
    2. `begin()` at the start of every generation (forget the last generation's state);
    3. per step: `wants_peek()` once, then per layer `decide(state)` (and `done_for_step()` after
       each decision, which may end the step's decisions early);
    4. `observe(outcome)` after every verified step, the generation's last one included
       (`outcome.final`).
    """

    def begin(self) -> None:
        """Start a new generation: reset whatever the scheduler keeps per generation (default:
        nothing). Called before the generation's first `decide`."""

    @abstractmethod
    def decide(self, state: LayerState) -> int:
        """Index of the drafter that grows the tree at this layer."""

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a finished step (default: nothing)."""

    def wants_peek(self) -> bool:
        """Whether its decisions read `LayerState.peek`: the builder asks the cheapest drafter
        (`Drafter.peek`) once per step only for a scheduler that does. Default: False."""
        return False

    def done_for_step(self) -> bool:
        """After a decision: True when every remaining layer of this step goes to the cheapest
        drafter whatever the tree looks like, so the builder may skip their statistics and
        decisions. Default: False (asked at every layer)."""
        return False

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        """Raise `ValueError` naming a config field (`"layers: ..."`) when this scheduler, as
        configured, cannot act in a pipeline of `n_drafters` drafters whose builder grows at most
        `depth` layers per step (None: unknown): a drafter index past the drafters, a layer past
        the depth. Called once when the pipeline is built. Default: nothing to check."""


class ChecksDrafterIndex:
    """Mixin: `Scheduler.check_pipeline` for a scheduler whose config's `drafter` field is the
    index of the drafter it calls."""

    config: Any

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        check_drafter_index(self.config.drafter, n_drafters, stronger=True)


def check_drafter_index(
    index: int, n_drafters: int, name: str = "drafter", *, stronger: bool = False
) -> None:
    """Raise `ValueError` unless `index` names one of `n_drafters` drafters (negative indices
    count from the strongest, -1 being it); with `stronger`, one other than the cheapest (index
    0 grows every layer without a call: a scheduler calling it would never call a stronger one)."""
    if not -n_drafters <= index < n_drafters:
        raise ValueError(
            f"{name}: expected an index of this pipeline's {n_drafters} drafters "
            f"({-n_drafters} .. {n_drafters - 1}), got {index}"
        )
    if stronger and n_drafters > 1 and index % n_drafters == 0:
        raise ValueError(
            f"{name}: {index} is the cheapest drafter (index 0), which grows every layer without "
            f"a call, so the scheduler would never call a stronger one; expected one of "
            f"1 .. {n_drafters - 1} or {-(n_drafters - 1)} .. -1"
        )


class Rescorer(Component):
    """Turns a strong drafter's distributions into new node scores."""

    @abstractmethod
    def rescore(self, tree: DraftTree, strong_logp: Tensor) -> Rescoring:
        """New scores from `strong_logp` (`[n, V]` next-token log-probs after each node; -inf
        where the strong drafter did not score a token, whose edges keep their log-prob)."""


class Grafter(Component):
    """Chooses graft positions and merges a strong drafter's children into the tree."""

    @abstractmethod
    def positions(self, tree: DraftTree, frontier: Tensor, k: int) -> Tensor:
        """Graft positions (`[g]` node indices, g <= k) a strong call would choose now."""

    @abstractmethod
    def graft(
        self,
        tree: DraftTree,
        strong_logp: Tensor,
        rescoring: Rescoring,
        *,
        frontier: Tensor,
        k: int,
        drafter: int,
    ) -> Graft:
        """Merge the strong drafter's top-`k` children at re-selected graft positions."""


class TreeBuilder(Component):
    """Owns the layer loop and the final budget prune."""

    @abstractmethod
    def build(self, step: StepContext) -> BuildResult:
        """Grow a draft tree under `step.root` with the pipeline's drafters."""

    @abstractmethod
    def max_nodes(self) -> int:
        """Most nodes (root included) of a verified tree: sizes the target's cache."""

    def check_drafters(self, n_drafters: int) -> None:
        """Raise `ValueError` (naming the config field, the value and what was expected) when
        the config names a drafter that a pipeline of `n_drafters` drafters lacks; the pipeline
        calls it once its components are built. Default: nothing to check."""

    def wants_target_curve(self) -> bool:
        """Whether `build` reads the target's latency curve (`StepContext.timings.target_curve`);
        the decoder then measures it once, before its first generation."""
        return False

    def with_clock(self, now: Callable[[], float]) -> TreeBuilder:
        """A builder for a decoder whose time is modelled (the benchmark's replay, where the
        target answers at once and `now()` adds its predicted forward times to the wall clock):
        a builder that reads the clock, or keeps state learned from measured time, returns a
        copy of its own that reads `now` and learns apart. Default: this builder (it keeps no
        time)."""
        return self

    def for_search(self) -> TreeBuilder:
        """A builder for the scheduler's value system, which builds each searched tree outside
        the decode loop (`StepContext.step` None) and then takes the chosen plan's step inside
        it: a builder that decides by measured time whether a step drafts at all (a plain
        switch) returns a copy that always drafts, as its builds outside the loop do, so that
        the step taken is the step searched. Default: this builder."""
        return self


class Verifier(Component):
    """Accepts a path of the tree given the target's logits."""

    def begin(self, seed: int) -> None:
        """Start a new generation (reseed any random state)."""

    @abstractmethod
    def verify(self, tree: DraftTree, target_logits: Tensor) -> Verdict:
        """Accepted path and bonus token from `target_logits` (`[n, V]`, one row per node)."""


# ---------------------------------------------------------------------------- step context


@attrs.frozen(eq=False)
class StepContext:
    """Everything a tree builder needs for one step.

    Attributes:
        root: 0-d int64, the last committed token.
        drafters: drafters, cheapest first.
        scheduler: decides which drafter acts at each layer.
        rescorer: applies a strong drafter's scores (None: strong drafters just expand).
        grafter: merges a strong drafter's children (None: strong drafters just expand).
        prompt_len: prompt length in tokens.
        committed_len: tokens committed so far.
        clock: records per-drafter wall time (`clock.time(label)` context manager).
        timings: measured forward times (target and per drafter) for the scheduler, and the
            target's latency curve when the builder asked for it (`wants_target_curve`).
        dtype: floating dtype of scores.
        history: acceptance of the generation's earlier steps (`AcceptHistory`) for the scheduler.
        step: the decode loop's 0-based step index in the generation; None where a tree is
            built outside the decode loop (offline tools rebuilding counterfactual trees).
    """

    root: Tensor
    drafters: tuple[Drafter, ...]
    scheduler: Scheduler
    rescorer: Rescorer | None
    grafter: Grafter | None
    prompt_len: int
    committed_len: int
    clock: Clock
    timings: ForwardTimes
    dtype: torch.dtype
    history: AcceptHistory = attrs.field(factory=AcceptHistory)
    step: int | None = None
