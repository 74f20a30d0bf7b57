"""Plugin boundaries: third-party components seen through checking proxies.

The decoder hands its builder a `StepContext` whose drafters, scheduler, rescorer and grafter are
these proxies, and calls the builder and verifier through them too. A proxy forwards each call
to the component, then

- turns an exception raised inside it into a `PluginError` naming the component (kind, registered
  name, distribution, YAML path) and the step, with the original exception chained;
- checks what came back against the invariants losslessness rests on (`treegraft.core.checks`):
  a violation is a `PluginError` naming the component, the step and the invariant;
- checks that the component wrote into none of the int64 tensors it was given (the structure
  of the tree it extends, node indices, tokens; `Untouched`): trees are immutable, and a tree
  changed in place under the builder would be verified as the target never saw it.

Which components are checked: those of every distribution but treegraft's own (`plugins`, the
default); `TREEGRAFT_CHECKS=all` checks the built-ins too, `TREEGRAFT_CHECKS=off` none.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core import checks
from treegraft.core.errors import shown
from treegraft.core.interfaces import (
    BuildResult,
    Drafter,
    Graft,
    Grafter,
    LayerState,
    Peek,
    Rescorer,
    Rescoring,
    Scheduler,
    StepContext,
    StepOutcome,
    TreeBuilder,
    Verdict,
    Verifier,
)
from treegraft.core.registry import BUILTIN_DISTRIBUTION, KINDS, PluginError
from treegraft.core.tree import DraftTree, Proposal

CHECKS_ENV = "TREEGRAFT_CHECKS"
CHECK_MODES = ("plugins", "all", "off")


@attrs.frozen
class Origin:
    """Where a component comes from: its kind, registered name, distribution and YAML path."""

    kind: str
    name: str
    distribution: str
    path: str = ""

    def __str__(self) -> str:
        where = f", {self.path}" if self.path else ""
        return f"{self.kind} {self.name!r} (distribution {self.distribution!r}{where})"


def check_mode() -> str:
    """`TREEGRAFT_CHECKS`: `plugins` (default), `all` or `off`."""
    mode = os.environ.get(CHECKS_ENV, "") or "plugins"
    if mode not in CHECK_MODES:
        raise PluginError(f"{CHECKS_ENV}: expected one of {', '.join(CHECK_MODES)}, got {mode!r}")
    return mode


def is_checked(origin: Origin | None) -> bool:
    """Whether calls into a component of this origin go through a checking proxy."""
    mode = check_mode()
    if origin is None or mode == "off":
        return False
    return mode == "all" or origin.distribution != BUILTIN_DISTRIBUTION


@attrs.define
class StepCounter:
    """The step being decoded (None before the first), read by the proxies for their messages."""

    step: int | None = None

    def where(self) -> str:
        return "" if self.step is None else f" at step {self.step}"


def call_plugin(origin: Origin, counter: StepCounter | None, verb: str, fn: Callable, *args, **kw):
    """`fn(*args, **kw)`; an exception other than a `PluginError` becomes one naming `origin`."""
    try:
        return fn(*args, **kw)
    except (PluginError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        where = counter.where() if counter else ""
        raise PluginError(f"{origin}{where}: {verb} raised {type(exc).__name__}: {exc}") from exc


#: the fields of a tree that the target's forward and the verification read
STRUCTURE = ("tokens", "parents", "depth")


def watched(inputs: dict[str, object]) -> list[tuple[str, Tensor]]:
    """The int64 tensors of a call's `inputs` by name: a tree's structure (`tree.tokens`,
    `tree.parents`, `tree.depth`) and int64 tensors given as such (nodes, tokens)."""
    out: list[tuple[str, object]] = []
    for name, value in inputs.items():
        if isinstance(value, DraftTree):
            out += [(f"{name}.{field}", getattr(value, field)) for field in STRUCTURE]
        else:
            out.append((name, value))
    return [(n, t) for n, t in out if isinstance(t, Tensor) and t.dtype == torch.int64]


@attrs.define
class Untouched:
    """The int64 tensors a call into a component was given (a tree's structure, node indices,
    tokens), to tell afterwards whether it wrote into one in place. Torch counts in-place writes
    per tensor (`_version`): reading the counters costs no torch op and syncs nothing. Inference
    tensors (`torch.inference_mode`, as `Pipeline.generate` decodes) keep no counter: their
    values are copied into one tensor before the call and compared after it (two small ops and
    one sync). A tree's shared host lists (`DraftTree.host()`, from which `extend` builds the
    next tree) are watched too: their structure is copied before the call where they exist, and
    compared after it with that copy or with the tensors. Scores are not watched: they steer the
    search, and what they are does not change what is committed."""

    named: list[tuple[str, Tensor]]
    #: the write counters of the tensors, or their values in one flat copy (inference tensors)
    before: tuple[int, ...] | Tensor | None
    #: each input tree, by name, with a copy of its host lists' structure (None: it had none)
    hosts: list[tuple[str, DraftTree, tuple[list[int], ...] | None]] = attrs.field(factory=list)

    @classmethod
    def of(cls, inputs: dict[str, object]) -> Untouched:
        named = watched(inputs)
        tensors = [t for _, t in named]
        hosts = [(n, t, host_structure(t)) for n, t in inputs.items() if isinstance(t, DraftTree)]
        if any(t.is_inference() for t in tensors):
            return cls(named, flat_copy(tensors), hosts)
        return cls(named, tuple(t._version for t in tensors), hosts)

    def changed(self) -> str | None:
        """The name of the first input written into since `of` (None: none was)."""
        return self._changed_tensor() or self._changed_host()

    def _changed_host(self) -> str | None:
        for name, tree, before in self.hosts:
            now = host_structure(tree)
            if now is None:
                continue
            if before is None:  # made during the call: it must say what the tensors say
                before = tuple(getattr(tree, field).tolist() for field in STRUCTURE)
            for field, got, want in zip(STRUCTURE, now, before, strict=True):
                if got != want:
                    return f"{name}.host().{field}"
        return None

    def _changed_tensor(self) -> str | None:
        if isinstance(self.before, tuple):
            for (name, tensor), version in zip(self.named, self.before, strict=True):
                if tensor._version != version:
                    return name
            return None
        if self.before is None or torch.equal(flat_copy([t for _, t in self.named]), self.before):
            return None
        start = 0  # slow path: which one
        for name, tensor in self.named:
            part = self.before[start : start + tensor.numel()]
            if not torch.equal(tensor.reshape(-1), part.to(tensor.device)):
                return name
            start += tensor.numel()
        return None


def host_structure(tree: DraftTree) -> tuple[list[int], ...] | None:
    """Copies of the tree's host lists of `STRUCTURE` (None: the tree made none yet)."""
    host = tree._host
    return None if host is None else tuple(list(getattr(host, f)) for f in STRUCTURE)


def flat_copy(tensors: list[Tensor]) -> Tensor | None:
    """The values of `tensors` in one flat int64 tensor on the first one's device (None: no
    tensors)."""
    if not tensors:
        return None
    device = tensors[0].device
    if all(t.ndim == 1 and t.device == device for t in tensors):
        return torch.cat(tensors)  # the usual case: a tree's fields and node indices
    return torch.cat([t.reshape(-1).to(device) for t in tensors])


@attrs.define
class Proxy:
    """Shared part of the checking proxies: the component, its origin, the step, the vocabulary."""

    inner: Any
    origin: Origin
    counter: StepCounter
    vocab: int

    def _call(self, verb: str, *args, watch: dict[str, object] | None = None, **kw) -> Any:
        """`inner.verb(*args, **kw)`, its exception a `PluginError`; a `PluginError` too when it
        wrote into one of the `watch` inputs in place."""
        untouched = Untouched.of(watch) if watch else None
        try:
            out = call_plugin(
                self.origin, self.counter, verb, getattr(self.inner, verb), *args, **kw
            )
        except PluginError:  # a write into its input is the cause of what it raised after it
            self._check_untouched(verb, untouched)
            raise
        self._check_untouched(verb, untouched)
        return out

    def _check_untouched(self, verb: str, untouched: Untouched | None) -> None:
        if untouched is not None and (name := untouched.changed()):
            self._check(
                f"{verb} changed its input {name} in place; a component must not write into "
                "what it is given (trees are immutable: build a new one)"
            )

    def _check(self, problem: str | None) -> None:
        if problem:
            raise PluginError(f"{self.origin}{self.counter.where()}: {problem}")

    def _flag(self, verb: str) -> bool:
        """`inner.verb()`, which must answer a bool (numpy's included)."""
        answer = self._call(verb)
        if not isinstance(answer, (bool, np.bool_)):
            self._check(f"{verb} returned {shown(answer)}, expected a bool (True or False)")
        return bool(answer)

    def __getattr__(self, name: str) -> Any:  # attributes beyond the interface (config, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class CheckedDrafter(Proxy, Drafter):
    """A drafter whose proposals and tree scores are checked."""

    @property
    def can_score(self) -> bool:  # type: ignore[override]
        can = call_plugin(self.origin, self.counter, "can_score", getattr, self.inner, "can_score")
        if not isinstance(can, (bool, np.bool_)):
            self._check(f"can_score is {shown(can)}, expected a bool (True or False)")
        return bool(can)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self._call("begin", prompt, max_len=max_len, watch={"prompt": prompt})

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        proposal = self._call("expand", tree, nodes, k, watch={"tree": tree, "nodes": nodes})
        self._check(checks.proposal_problem(proposal, tree, vocab=self.vocab))
        return proposal

    def score_tree(self, tree: DraftTree) -> Tensor:
        logp = self._call("score_tree", tree, watch={"tree": tree})
        n = tree.n_nodes
        self._check(checks.logp_problem(logp, n=n, vocab=self.vocab, device=tree.device))
        return logp

    def peek(self, tree: DraftTree) -> Peek | None:
        peek = self._call("peek", tree, watch={"tree": tree})
        self._check(checks.peek_problem(peek, vocab=self.vocab))
        return peek

    def chain(self, tree: DraftTree, length: int, stop: float) -> Proposal | None:
        chain = self._call("chain", tree, length, stop, watch={"tree": tree})
        if chain is None:
            return None
        self._check(checks.proposal_problem(chain, tree, vocab=self.vocab, verb="chain"))
        if chain.parents.shape[0] != 1 or chain.tokens.shape[1] > length:
            self._check(
                f"chain returned tokens {list(chain.tokens.shape)}, expected one row of at most "
                f"{length} tokens ([1, c], c <= {length}) or None"
            )
        return chain

    def rewind(self) -> None:
        self._call("rewind")

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        self._call("commit", accepted, tokens, watch={"accepted": accepted, "tokens": tokens})


class CheckedScheduler(Proxy, Scheduler):
    """A scheduler whose decisions must be drafter indices."""

    def begin(self) -> None:
        self._call("begin")

    def decide(self, state: LayerState) -> int:
        who = self._call("decide", state)
        try:
            index = operator.index(who)
        except TypeError:
            self._check(f"decide returned {shown(who)}, expected a drafter index (int)")
        boolean = isinstance(who, bool) or getattr(who, "dtype", None) == torch.bool
        if boolean or not 0 <= index < state.n_drafters:
            self._check(f"decide returned {shown(who)}, expected 0 <= index < {state.n_drafters}")
        return index

    def observe(self, outcome: StepOutcome) -> None:
        self._call("observe", outcome)

    def wants_peek(self) -> bool:
        return self._flag("wants_peek")

    def done_for_step(self) -> bool:
        return self._flag("done_for_step")


class CheckedRescorer(Proxy, Rescorer):
    """A rescorer whose new scores are checked."""

    def rescore(self, tree: DraftTree, strong_logp: Tensor) -> Rescoring:
        out = self._call("rescore", tree, strong_logp, watch={"tree": tree})
        self._check(checks.rescoring_problem(out, tree))
        return out


class CheckedGrafter(Proxy, Grafter):
    """A grafter whose positions and grafted trees are checked."""

    def positions(self, tree: DraftTree, frontier: Tensor, k: int) -> Tensor:
        out = self._call("positions", tree, frontier, k, watch={"tree": tree, "frontier": frontier})
        self._check(checks.nodes_problem("positions", out, tree))
        return out

    def graft(self, tree: DraftTree, strong_logp: Tensor, rescoring: Rescoring, **kw) -> Graft:
        watch = {"tree": tree, "frontier": kw.get("frontier")}  # the builder reads it after
        out = self._call("graft", tree, strong_logp, rescoring, watch=watch, **kw)
        self._check(checks.graft_problem(out, tree, vocab=self.vocab))
        return out


class CheckedBuilder(Proxy, TreeBuilder):
    """A builder whose trees are checked against the committed root."""

    def build(self, step: StepContext) -> BuildResult:
        # its own copy of the root: `step.root` is a view of the target's committed tokens
        built = self._call("build", attrs.evolve(step, root=step.root.clone()))
        problem = checks.build_problem(
            built, vocab=self.vocab, root=step.root, n_drafters=len(step.drafters)
        )
        self._check(problem)
        most = self.max_nodes()
        if built.tree.n_nodes > most:  # the caches and latency grids are sized by `max_nodes`
            self._check(
                f"build returned a tree of {built.tree.n_nodes} nodes, more than its max_nodes() "
                f"= {most} (root included); expected at most {most}"
            )
        return built

    def max_nodes(self) -> int:
        n = self._call("max_nodes")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            self._check(f"max_nodes returned {n!r}, expected an int >= 1")
        return n

    def wants_target_curve(self) -> bool:
        return self._flag("wants_target_curve")


class CheckedVerifier(Proxy, Verifier):
    """A verifier whose verdicts must name a path of the tree and a token of the vocabulary."""

    def begin(self, seed: int) -> None:
        self._call("begin", seed)

    def verify(self, tree: DraftTree, target_logits: Tensor) -> Verdict:
        verdict = self._call("verify", tree, target_logits, watch={"tree": tree})
        self._check(checks.verdict_problem(verdict, tree, vocab=self.vocab))
        return verdict


def adapt(component: Any, origin: Origin | None, verb: str, *args: Any) -> Any:
    """`component.verb(*args)` for the offline tools that adapt a decoder's components outside
    the decode loop (`TreeBuilder.for_search`, `.with_clock`, `Drafter.with_target`, `.forget`):
    a checked plugin's exception is a `PluginError` naming it, and so is an adapted component
    (any verb but `forget`) that is not one of its kind."""
    if not is_checked(origin):
        return getattr(component, verb)(*args)
    out = call_plugin(origin, None, verb, getattr(component, verb), *args)
    interface = KINDS[origin.kind].interface
    if verb != "forget" and not isinstance(out, interface):
        raise PluginError(
            f"{origin}: {verb} returned {checks.describe(out)}, expected a {interface.__name__}"
        )
    return out


class Parts(NamedTuple):
    """A decoder's components as the decode loop calls them (proxies where checked)."""

    drafters: tuple[Drafter, ...]
    builder: TreeBuilder
    scheduler: Scheduler
    verifier: Verifier
    rescorer: Rescorer | None
    grafter: Grafter | None


PROXIES: dict[str, type[Proxy]] = {
    "drafter": CheckedDrafter,
    "builder": CheckedBuilder,
    "scheduler": CheckedScheduler,
    "verifier": CheckedVerifier,
    "rescorer": CheckedRescorer,
    "grafter": CheckedGrafter,
}


def guard(component: Any, origin: Origin | None, counter: StepCounter, vocab: int) -> Any:
    """`component` behind its checking proxy when its origin is checked, else itself."""
    if component is None or not is_checked(origin):
        return component
    return PROXIES[origin.kind](component, origin, counter, vocab)


def guarded_parts(decoder: Any, origins: dict[str, Origin], counter: StepCounter) -> Parts:
    """The components of `decoder` (a `Decoder`) behind proxies where `origins` says to check;
    `origins` is keyed by role: `drafter0`, `drafter1`, ..., `builder`, `scheduler`, ..."""
    vocab = decoder.target.vocab_size
    return Parts(
        drafters=tuple(
            guard(d, origins.get(f"drafter{i}"), counter, vocab)
            for i, d in enumerate(decoder.drafters)
        ),
        **{
            role: guard(getattr(decoder, role), origins.get(role), counter, vocab)
            for role in ("builder", "scheduler", "verifier", "rescorer", "grafter")
        },
    )
