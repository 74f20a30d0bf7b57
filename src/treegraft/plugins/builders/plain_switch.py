"""The plain switch: speculation only while it pays, measured.

Speculation pays when a step's drafting and verification commit more tokens per second than plain
decoding does (one target forward per token); where a drafter agrees little with the target, or
drafts slowly, it loses. The switch measures both while decoding and, per step, either lets the
builder draft (`SPECULATE`) or sends the root alone (`PLAIN`): the target forwards one token and
the verifier's bonus is the next token, exactly plain decoding's step; the drafters catch up on
the committed tokens lazily, at their next call.

What it measures: a builder sees every step of the decode loop begin (`StepContext.step`), so
the switch takes the wall time from one step's start to the next's and the tokens committed in
between (`StepContext.committed_len`) as the outcome of the earlier step, under the arm that ran
it. Steps that pay for something else than their own decision are left out: a generation's first
step (the target reads the prompt), the step of its first strong call (that drafter reads the
prompt), the first speculative step after plain ones (the drafters catch up on their tokens), and
its last step (no next start in the same generation). Trees built outside the decode loop (`step`
None: the scheduler's value system rebuilding counterfactual trees) always speculate and are not
measured. A switch asked only at some steps (the layered builder's silent steps) is told every
step's start (`close`): a step it was asked at is measured up to the next step's start. Each
arm's estimate is the tokens over the seconds of its last `memory` measured steps (a ratio of
sums: speculation's gains come in bursts, which a per-step median would miss).

The estimates are compared at the current context length: a target forward costs more the longer
the context (attention over the cache), so a rate measured on a long text would misjudge a short
one (plain decoding measured on 600-token summaries looks slow beside speculation on a 100-token
word problem). Each measured step keeps its context length; plain decoding's seconds per step are
fitted as a line in the length (its steps commit one token each; the slope is kept between 0 and
proportional, and taken as 0 while its measured lengths spread less than `SPREAD`), and every
measured step's seconds, of either arm, are scaled by the line's ratio between the current length
and its own. Plain decoding's measured steps are therefore kept across its probes (the line needs
lengths that differ); speculation's are dropped at each probe (its rate changes along a text).

How it chooses: speculation first; once it has `WARMUP[SPECULATE]` measured steps, `WARMUP[PLAIN]`
plain steps measure plain decoding. Then the arm that leads runs, and the other takes the lead only
when its rate beats the leader's by `MARGIN` (the estimates are noisy: the margin keeps a near-tie
from flipping the arms back and forth). The other arm is probed again, for `WARMUP` measured steps
(speculation with its old estimate dropped), after a wait: `PLAIN_PROBE_FACTOR` times `probe_every`
steps of speculation when speculation leads (plain decoding's rate changes little along a text,
speculation's a lot), `probe_every` steps of plain decoding when plain decoding leads, doubled
after every probe that finds speculation still slower, up to `MAX_BACKOFF` times (a probe of a
losing speculation costs its steps: where speculation keeps losing, the probes thin out), back to
`probe_every` once speculation leads again, and halved when a new generation begins (a new text, on
which speculation may pay; halved, not reset: a run of similar texts, e.g. one task's prompts,
would otherwise pay the first, densest probes on each), unless speculation lost its last
`LOST_STREAK` probes in a row (a drafter that never agrees, on short texts: halving at each one
kept a probe per text, the probes never thinning out). Where speculation leads, a new generation
begins with such a probe of it (its estimate from the last text dropped: that text's bursts would
keep it leading for many steps of a text where it loses). A probe of speculation ends early once
`PROBE_MIN` measured steps commit less than `CUT` times plain decoding's rate: a clearly losing
speculation (a step of a tree whose drafts are rejected costs about two plain steps and commits one
token) is not measured to the end. So on a text where speculation loses, the builder decodes
plainly but for a few short probes now and then, and comes back to speculation where it pays.

Shadow drafting: while plain decoding leads, the builder hands the switch the cheapest drafter's
best chain under each plain step's root (`guess`, from `Drafter.peek`), and the switch checks it
against the tokens plain decoding then commits (each next step's root): how many tokens a tree
would have accepted, known without drafting. A probe that falls due waits for `SHADOW_MIN`
checked guesses of the current text and is skipped where none of them matched a token (a lost
probe, for the wait); a probe starts at once where the guesses' tokens per step, less the
wait's multiple in tokens (weak or stale evidence), reach `EARLY_TOKENS` and, over a
speculative step's measured seconds, beat plain decoding's rate by `MARGIN`.
A drafter that does not say its chain leaves the timed probes as they are. Where the builder
drafts another drafter's chain on the steps the cheapest one has nothing (`silent_chain`), the
missed guesses say nothing of those chains: the shadow then only starts probes early
(`vetoes` off), it never holds one back.

Lossless: a plain step is a valid draft tree (the root alone), so the output is the target's own,
whatever the arm. The estimates live in the builder and carry over between generations.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from treegraft.core.interfaces import BuildResult, StepContext
from treegraft.core.tree import DraftTree
from treegraft.kernels.host_tensor import host_tensor

#: the arms: the builder's own tree, or the root alone (plain decoding)
SPECULATE, PLAIN = 0, 1
#: measured steps that make an arm's estimate (and a probe's length), per arm: speculation's
#: gains come in bursts (a long accepted path now and then), so it is judged over more steps
WARMUP = (6, 3)
#: speculation leading: plain decoding is probed after this many times `probe_every` steps
PLAIN_PROBE_FACTOR = 8
#: the other arm takes the lead only when its rate beats the leader's by this fraction (noise)
MARGIN = 0.05
#: the longest wait between probes of a losing speculation, in multiples of `probe_every`
MAX_BACKOFF = 8
#: after this many probes of speculation lost in a row, a new text no longer halves the wait
#: (speculation has lost on the last texts: a drafter that never agrees is probed ever less)
LOST_STREAK = 4
#: a probe of speculation ends after this many measured steps if its rate is below `CUT` times
#: plain decoding's (clearly losing, beyond what its later steps' bursts can plausibly recover)
PROBE_MIN, CUT = 2, 0.75
#: plain decoding's seconds per step get a slope in the context length once its measured
#: lengths spread over at least this fraction of their mean
SPREAD = 0.25
#: shadow drafting: checked guesses before the shadow holds a probe back (none of them matched a
#: token: `SHADOW_MIN`) or starts one early (they matched enough for speculation to pay: `EARLY_MIN`)
SHADOW_MIN, EARLY_MIN = 4, 2
#: a speculative step's cost in plain steps, where speculation has no measured step to say it
SPEC_COST = 2.0
#: the guesses' tokens per step (1 + matched) that can start a probe early: a speculative tree
#: verifies less than its drafter's top chain where that drafter's measured rates are low
#: (the adaptive size), so a few matched tokens are no evidence that speculation pays
EARLY_TOKENS = 2.0


@attrs.define
class PlainSwitch:
    """Chooses per step between a builder's speculation and plain decoding (see the module).

    Attributes:
        probe_every: steps of plain decoding, while it leads, before speculation is probed again.
        memory: measured steps per arm whose tokens per second make its estimate.
        now: the wall clock (seconds), replaceable in tests.
        shadowing: whether it reads guesses at plain steps (shadow drafting, `wants_guess`).
        vetoes: whether guesses that matched nothing hold probes back (else they only start
            probes early).
    """

    probe_every: int = 16
    memory: int = 16
    now: Callable[[], float] = time.perf_counter
    shadowing: bool = True
    vetoes: bool = True
    #: probes lost in a row after which a new text keeps the wait (`LOST_STREAK`; 0: never)
    streak_limit: int = LOST_STREAK
    arm: int = SPECULATE
    #: the arm that leads, and the wait between probes of speculation (times `probe_every`)
    leader: int = SPECULATE
    backoff: int = 1
    #: probes of speculation lost since speculation last took the lead
    lost: int = 0
    #: per arm: (tokens, seconds, context length) of its last `memory` measured steps
    outcomes: list[list[tuple[int, float, int]]] = attrs.field(factory=lambda: [[], []])
    #: steps since each arm last ran; steps left in the current probe
    idle: list[int] = attrs.field(factory=lambda: [0, 0])
    probing: int = 0
    #: per arm: whether it has had its first `WARMUP` measured steps (a probe cut short by
    #: `PROBE_MIN` leaves fewer in its fresh estimate; that is no new warm-up)
    warm: list[bool] = attrs.field(factory=lambda: [False, False])
    # the step now running: its index (None: none), start (seconds), committed length, whether
    # it is left out of the estimates, and whether its generation has called a strong drafter
    _step: int | None = attrs.field(default=None, init=False)
    _start: float = attrs.field(default=0.0, init=False)
    _committed: int = attrs.field(default=0, init=False)
    _skip: bool = attrs.field(default=False, init=False)
    _called: bool = attrs.field(default=False, init=False)
    # `close` began this step's new text (`plain` at the same step does not again)
    _opened: bool = attrs.field(default=False, init=False)
    #: shadow drafting: whether the cheapest drafter says its best chain at plain steps (`guess`);
    #: the matched tokens of this text's checked guesses since the last probe of speculation; the
    #: guesses still being checked, as [chain, tokens matched so far]
    shadowed: bool = False
    shadow: list[int] = attrs.field(factory=list)
    _guesses: list[list] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        if self.probe_every < 1:
            raise ValueError(f"probe_every: expected at least 1 step, got {self.probe_every}")
        if self.memory < 1:
            raise ValueError(f"memory: expected at least 1 step, got {self.memory}")

    @property
    def steps(self) -> list[int]:
        """Measured steps in each arm's estimate."""
        return [len(r) for r in self.outcomes]

    def rate(self, arm: int, at: int | None = None) -> float:
        """Estimated tokens per second of `arm`: all tokens over all seconds of its measured
        steps (0.0: none); with `at`, each step's seconds scaled to the context length `at` by
        plain decoding's line (`plain_line`)."""
        return _rate(self.outcomes[arm], self.plain_line() if at is not None else None, at)

    def _rates_at(self, at: int) -> tuple[float, float]:
        """Both arms' rates at the context length `at` (`rate`), the line fitted once."""
        line = self.plain_line()
        return _rate(self.outcomes[SPECULATE], line, at), _rate(self.outcomes[PLAIN], line, at)

    def plain_line(self) -> Callable[[int], float] | None:
        """Plain decoding's seconds per step as a line in the context length, least squares over
        its measured steps (None: none measured); the slope is clipped to [0, mean seconds / mean
        length] (never falling, at most proportional) and is 0 while the lengths spread less than
        `SPREAD` of their mean."""
        points = [(n, s / t) for t, s, n in self.outcomes[PLAIN] if t > 0]
        if not points:
            return None
        mean_n = sum(n for n, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        spread = max(n for n, _ in points) - min(n for n, _ in points)
        slope = 0.0
        if spread >= SPREAD * mean_n:
            var = sum((n - mean_n) ** 2 for n, _ in points)
            cov = sum((n - mean_n) * (s - mean_s) for n, s in points)
            slope = min(max(cov / var, 0.0), mean_s / mean_n)
        base = mean_s - slope * mean_n
        return lambda n: base + slope * n

    def plain(self, step: StepContext) -> bool:
        """Record the previous step's outcome and say whether this step decodes plainly."""
        if step.step is None:  # outside the decode loop
            return False
        now = self.now()
        self._record(step, now)
        self._check_guesses(step)
        if step.step == 0 and not self._opened:
            self._new_text()
        self._opened = False
        self._step, self._start, self._committed = step.step, now, step.committed_len
        previous = self.arm
        self.arm = self._choose()
        # the first speculative step after plain ones also pays the drafters' catching up
        self._skip = self.arm == SPECULATE and previous == PLAIN
        self.idle[self.arm] = 0
        self.idle[1 - self.arm] += 1
        return self.arm == PLAIN

    def close(self, step: StepContext) -> None:
        """At the start of every step, for a switch asked (`plain`) only at some steps: record
        the step before this one if it was asked there, measured up to now; begin a new text at
        its first step."""
        if step.step is None:
            return
        self._record(step, self.now())
        self._step = None
        if step.step == 0:
            self._new_text()
            self._opened = True

    def _new_text(self) -> None:
        """A new text: speculation may pay on it, probe it more often."""
        self._called = False
        if not self.streak_limit or self.lost < self.streak_limit:
            self.backoff = max(1, self.backoff // 2)
        self.shadow = []
        if self.leader == SPECULATE and self.warm[SPECULATE]:
            # ... and where it led, judge it on this text alone: the last text's bursts
            # would keep it leading for many steps of a text where it loses
            self.arm, self.outcomes[SPECULATE] = SPECULATE, []
            self.probing = WARMUP[SPECULATE] + 1

    @property
    def wants_guess(self) -> bool:
        """Whether the shadow is read (`guess`): with shadow drafting, while plain decoding
        leads."""
        return self.shadowing and self.leader == PLAIN

    def guess(self, chain: tuple[int, ...] | None) -> None:
        """At a plain step: the cheapest drafter's best chain under the root (`Peek.chain`; None:
        it does not say), checked against the tokens plain decoding commits next."""
        if chain is None:
            return
        self.shadowed = True
        if chain:
            self._guesses.append([chain, 0])
        else:
            self.shadow.append(0)

    def _check_guesses(self, step: StepContext) -> None:
        """Check the pending guesses against the token the last plain step committed (this
        step's root); after a speculative step or at a new text, keep what they matched so far."""
        if not self._guesses:
            return
        if self.arm == PLAIN and self._step is not None and step.step == self._step + 1:
            token, pending = int(step.root), []
            for guess in self._guesses:
                chain, matched = guess
                if chain[matched] == token:
                    guess[1] = matched = matched + 1
                    if matched < len(chain):
                        pending.append(guess)
                        continue
                self.shadow.append(matched)
            self._guesses = pending
        else:
            self.shadow.extend(matched for _, matched in self._guesses)
            self._guesses = []
        del self.shadow[: -self.memory]

    def shadow_says(self) -> bool | None:
        """What the shadow says of speculation at the current length: True, it would pay (the
        guesses' tokens per step, less the wait's multiple, reach `EARLY_TOKENS` and over a
        speculative step's seconds beat plain decoding's rate by `MARGIN`); False, it cannot
        (`SHADOW_MIN` guesses or more, not one token matched); None, unsure, or no shadow."""
        n = len(self.shadow)
        if n < EARLY_MIN:
            return None
        hits = sum(self.shadow)
        if hits == 0:
            return False if n >= SHADOW_MIN else None
        # less the wait's multiple in tokens: few guesses, or a speculation that lost its last
        # probes, need more matched tokens to start a probe
        tokens = 1 + (hits - self.backoff) / n
        line = self.plain_line()
        if tokens < EARLY_TOKENS or line is None:
            return None
        at = self._committed
        plain_s = line(at)
        spec = self.outcomes[SPECULATE]
        spec_s = _seconds(spec, line, at) / len(spec) if spec else SPEC_COST * plain_s
        return True if tokens * plain_s > (1 + MARGIN) * spec_s else None

    def note(self, calls: tuple[int, ...]) -> None:
        """The drafters a speculative step called, layer by layer: the step of a generation's
        first strong call also reads the prompt into that drafter, so it is not measured."""
        if not self._called and any(c > 0 for c in calls):
            self._called = self._skip = True

    def _record(self, step: StepContext, now: float) -> None:
        """The previous step's tokens per second, under its arm, if it was one to measure: the
        step before this one in the same generation, not its first (which read the prompt), nor
        one that paid for catching up (`_skip`)."""
        if self._step is None or self._step == 0 or step.step != self._step + 1 or self._skip:
            return
        seconds = now - self._start
        if seconds <= 0:
            return
        outcomes = self.outcomes[self.arm]
        outcomes.append((step.committed_len - self._committed, seconds, self._committed))
        del outcomes[: -self.memory]

    def _choose(self) -> int:
        if self.probing and self._probe_lost():
            self.probing = 0
        if self.probing:
            self.probing -= 1
            return self.arm
        for arm in (SPECULATE, PLAIN):
            if not self.warm[arm]:
                self.warm[arm] = len(self.outcomes[arm]) >= WARMUP[arm]
                if not self.warm[arm]:
                    return arm
        other = 1 - self.leader
        # after a plain step while plain decoding leads, speculation's estimate is as it was and
        # the ratio of the two rates does not move with the context length (both scale by
        # plain decoding's line): the comparison is not made again (a plain stretch's steps
        # stay as cheap as they can)
        if not self.leader == self.arm == PLAIN:
            rates = self._rates_at(self._committed)
            if rates[other] > (1.0 + MARGIN) * rates[self.leader]:
                self.leader, other = other, self.leader
                self.backoff, self.lost = 1, 0
            elif self.arm == SPECULATE and self.leader == PLAIN:
                # a probe of speculation just ended and plain decoding still leads
                self.backoff = min(2 * self.backoff, MAX_BACKOFF)
                self.lost += 1
        if self.leader == SPECULATE:
            wait = self.probe_every * PLAIN_PROBE_FACTOR
        else:
            wait = self.probe_every * self.backoff
            says = self.shadow_says()
            if says:  # the shadow's guesses pay: probe now
                wait = 0
            elif self.idle[other] >= wait and self.shadowed and self.vetoes:
                if says is False:  # they cannot pay: as a lost probe
                    self.idle[other], self.backoff = 0, min(2 * self.backoff, MAX_BACKOFF)
                    self.lost += 1
                    self.shadow = []
                if len(self.shadow) < SHADOW_MIN:  # too few on this text to say: wait for them
                    return self.leader
        if self.idle[other] < wait:
            return self.leader
        if other == SPECULATE:
            self.outcomes[other] = []  # a fresh estimate from the probe (plain's line keeps its)
            self.shadow, self._guesses = [], []
        self.probing = WARMUP[other]  # the probe's first step may go unmeasured (catching up)
        return other

    def _probe_lost(self) -> bool:
        """Whether the probe of speculation now running has clearly lost to plain decoding."""
        if self.arm != SPECULATE:
            return False
        if self.steps[SPECULATE] < PROBE_MIN:
            return False
        speculate, plain = self._rates_at(self._committed)
        return speculate < CUT * plain


def _rate(
    outcomes: list[tuple[int, float, int]], line: Callable[[int], float] | None, at: int | None
) -> float:
    """Tokens over seconds of `outcomes`; with a `line`, each step's seconds scaled from its own
    context length to `at`."""
    seconds = _seconds(outcomes, line, at)
    return sum(t for t, _, _ in outcomes) / seconds if seconds > 0 else 0.0


def _seconds(
    outcomes: list[tuple[int, float, int]], line: Callable[[int], float] | None, at: int | None
) -> float:
    """Seconds of `outcomes`; with a `line`, each step's scaled from its context length to `at`."""
    if line is None or at is None:
        return sum(s for _, s, _ in outcomes)
    here = line(at)
    return sum(s * here / line(n) for _, s, n in outcomes)


def plain_step(step: StepContext) -> BuildResult:
    """A step without drafting: the root alone, verified by one target forward of one token."""
    tree = DraftTree.from_root(step.root, device=step.root.device, dtype=step.dtype)
    kept = host_tensor([0], device=tree.device)
    return BuildResult(tree=tree, kept=kept, calls=(), unpruned=tree, plain=True)
