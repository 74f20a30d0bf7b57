"""The plain switch: plain decoding where speculation loses, speculation where it pays, and the
output exactly plain greedy decoding's either way."""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import attrs
import pytest
import torch

from tests.conftest import greedy_reference, tiny_llama
from treegraft.core.config import NoConfig
from treegraft.core.decoder import Decoder, StopRule
from treegraft.core.interfaces import Drafter, LayerState, Peek, Scheduler, StepOutcome
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree, Proposal
from treegraft.plugins.builders.layered import LayeredBuilder, LayeredConfig
from treegraft.plugins.builders.plain_switch import (
    CUT,
    EARLY_MIN,
    LOST_STREAK,
    MARGIN,
    MAX_BACKOFF,
    PLAIN,
    PLAIN_PROBE_FACTOR,
    PROBE_MIN,
    SPECULATE,
    WARMUP,
    PlainSwitch,
)
from treegraft.plugins.verifiers.greedy import GreedyVerifier

VOCAB = 48
DEPTH = 3
#: modelled seconds: one target forward, one drafter layer
TARGET_S, LAYER_S = 1.0, 0.3


@attrs.define
class FakeClock:
    """Modelled time: each step's start adds a target forward, each drafter layer adds its cost."""

    t: float = 0.0

    def now(self) -> float:
        self.t += TARGET_S
        return self.t


@attrs.define
class StubDrafter(Drafter):
    """Proposes one child per node: the target's greedy continuation (`truth`) where `agrees`
    says so for the committed length, else a wrong token; each layer costs `LAYER_S`."""

    truth: list[int]
    agrees: object  # (committed length) -> bool
    clock: FakeClock
    committed: int = 0
    Config = NoConfig

    def begin(self, prompt, *, max_len):
        self.committed = prompt.numel()

    def expand(self, tree: DraftTree, nodes, k):
        self.clock.t += LAYER_S
        depth = tree.depth[nodes].tolist()
        want = [self.truth[self.committed + d] for d in depth]
        if not self.agrees(self.committed):
            want = [(t + 1) % VOCAB for t in want]
        return Proposal(
            parents=nodes.clone(),
            tokens=torch.tensor(want, dtype=torch.long)[:, None],
            logp=torch.full((len(want), 1), -0.1, dtype=tree.score.dtype),
        )

    def commit(self, accepted, tokens):
        self.committed += int(tokens.numel())


@attrs.define
class GuessingDrafter(StubDrafter):
    """`StubDrafter` that also says its best chain under the root (`peek`): the shadow's guess."""

    def peek(self, tree):
        chain = self.truth[self.committed : self.committed + DEPTH]
        if not self.agrees(self.committed):
            chain = [(t + 1) % VOCAB for t in chain]
        return Peek(0.0, 0.0, tuple(chain))


@attrs.define
class Never(Scheduler):
    """Never calls a stronger drafter; keeps the outcomes it observes."""

    Config = NoConfig
    config: NoConfig
    outcomes: list = attrs.field(factory=list)

    def decide(self, state: LayerState) -> int:
        return 0

    def observe(self, outcome: StepOutcome) -> None:
        self.outcomes.append(outcome)


def run_stub(config: LayeredConfig, make_drafters, new_tokens: int):
    """A generation of the tiny target with the layered builder of `config`, its switches on the
    modelled clock, and the drafters `make_drafters(truth, clock)` builds (`truth`: the prompt
    and the target's greedy continuation): its events, tokens, the reference tokens, the builder
    and the scheduler (`Never`, keeping what it observes)."""
    model = tiny_llama(seed=1, vocab=VOCAB)
    prompt = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(0))
    want = greedy_reference(model, prompt, new_tokens + DEPTH + 2)
    clock = FakeClock()
    builder = LayeredBuilder(config)
    for switch in (builder.switch, builder.silent):
        if switch is not None:
            switch.now = clock.now
    scheduler = Never(NoConfig())
    decoder = Decoder(
        target=CausalLMRunner(model),
        drafters=make_drafters([*prompt.tolist(), *want], clock),
        builder=builder,
        scheduler=scheduler,
        verifier=GreedyVerifier(NoConfig()),
    )
    with torch.inference_mode():
        events = list(decoder.steps(prompt, StopRule(max_new_tokens=new_tokens)))
    tokens = [t for e in events for t in e.tokens]
    return events, tokens, want[:new_tokens], builder, scheduler


def decode(agrees, *, switch: bool, new_tokens: int = 70, guessing: bool = False):
    """Events and tokens of a generation with the stub drafter, and the reference tokens."""
    config = LayeredConfig(depth=DEPTH, top_k=1, budget=DEPTH, plain_switch=switch, probe_every=8)
    kind = GuessingDrafter if guessing else StubDrafter
    return run_stub(config, lambda truth, clock: (kind(truth, agrees, clock),), new_tokens)


def plain(event) -> bool:
    return event.build.plain


def test_a_drafter_that_never_agrees_decodes_plainly_and_exactly():
    events, tokens, want, builder, scheduler = decode(lambda n: False, switch=True)
    assert tokens == want
    late = events[sum(WARMUP) + 2 :]
    assert sum(map(plain, late)) >= 0.5 * len(late)  # 8 plain steps per 7-step probe
    assert any(not plain(e) for e in late)  # speculation is probed again
    assert all(e.tree_size == 0 and e.calls == () for e in events if plain(e))
    assert len(scheduler.outcomes) == sum(not plain(e) for e in events)  # plain steps unseen
    # (speculation's estimate may have just been cleared by a probe starting at the last step)
    assert builder.switch.rate(PLAIN) > builder.switch.rate(SPECULATE) >= 0
    assert builder.switch.leader == PLAIN
    without, tokens_without, *_ = decode(lambda n: False, switch=False)
    assert tokens_without == want and not any(map(plain, without))


def test_speculation_comes_back_where_it_pays_and_stays_exact():
    prompt_len, stretch = 6, 30
    events, tokens, want, builder, _ = decode(lambda n: n >= prompt_len + stretch, switch=True)
    assert tokens == want
    early = [e for e in events if sum(len(x.tokens) for x in events[: e.step]) < stretch]
    assert sum(map(plain, early)) >= len(early) // 2
    tail = events[-5:-1]
    assert not any(map(plain, tail)) and all(e.accepted == DEPTH for e in tail)
    assert builder.switch.rate(SPECULATE) > builder.switch.rate(PLAIN)


def test_speculation_that_pays_is_not_switched_off():
    events, tokens, want, *_ = decode(lambda n: True, switch=True)
    assert tokens == want
    assert sum(map(plain, events)) <= WARMUP[PLAIN]  # the steps measuring plain decoding


def test_the_switch_checks_its_settings():
    with pytest.raises(ValueError, match="probe_every: expected at least 1 step, got 0"):
        PlainSwitch(probe_every=0)
    with pytest.raises(ValueError, match="memory: expected at least 1 step, got 0"):
        PlainSwitch(memory=0)


def test_trees_built_outside_the_decode_loop_always_speculate():
    """Offline tools (the value system) rebuild trees with `step` None: never plain, unmeasured."""
    switch = PlainSwitch()
    switch.outcomes = [[(1, 2.0, 9)] * 6, [(1, 1.0, 9)] * 3]  # plain decoding leads
    offline = SimpleNamespace(step=None, committed_len=9, prompt_len=6)
    assert not switch.plain(offline) and switch.steps == [6, 3]
    assert switch.plain(SimpleNamespace(step=4, committed_len=9, prompt_len=6))  # plain leads


def test_catching_up_steps_are_not_measured_and_bursts_count():
    """The step of a generation's first strong call is left out; an arm's rate is its tokens over
    its seconds, so speculation's bursts of long accepted paths count in full."""
    clock = iter(range(0, 1000, 2))  # every step lasts 2 seconds
    switch = PlainSwitch(now=lambda: float(next(clock)))

    def step(i: int, committed: int, calls=(0,)) -> bool:
        plain = switch.plain(SimpleNamespace(step=i, committed_len=committed, prompt_len=5))
        if not plain:
            switch.note(calls)
        return plain

    step(0, 5)
    step(1, 9, calls=(0, 1))  # the first strong call: not measured
    step(2, 13)
    assert switch.steps == [0, 0]  # step 0 (prompt) and step 1 (first call) left out
    switch.outcomes = [[(1, 1.0, 9), (1, 1.0, 9), (10, 1.0, 9), (1, 1.0, 9)], [(1, 0.5, 9)] * 3]
    assert switch.rate(SPECULATE) == 13 / 4 and switch.rate(PLAIN) == 2.0


def drive(switch: PlainSwitch, clock: list[float], steps: int, *, spec_rate: float, start=0):
    """Run `steps` decode steps through `switch` from step index `start`: a plain step commits one
    token in one second; a speculative one commits one token in `1 / spec_rate` seconds. Returns
    the arms, 'P' or 'S' per step."""
    arms, committed = [], 10 + start
    for i in range(start, start + steps):
        plain = switch.plain(SimpleNamespace(step=i, committed_len=committed, prompt_len=5))
        if not plain:
            switch.note((0,))
        clock[0] += 1.0 if plain else 1.0 / spec_rate
        committed += 1
        arms.append("P" if plain else "S")
    return "".join(arms)


def probe_starts(arms: str) -> list[int]:
    return [i for i in range(1, len(arms)) if arms[i] == "S" and arms[i - 1] == "P"]


def test_probes_of_a_losing_speculation_are_short_thin_out_and_come_closer_on_a_new_text():
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms = drive(switch, clock, 200, spec_rate=0.5)
    warm_up = WARMUP[SPECULATE] + 1  # the first probe step is not measured (catching up)
    assert arms.startswith("S" * warm_up + "P")
    probe = PROBE_MIN + 1  # clearly slower than plain decoding: cut after PROBE_MIN measured
    assert {len(r) for r in re.findall("S+", arms[warm_up:-1])} == {probe}
    starts = probe_starts(arms)
    plain_runs = [b - a - probe for a, b in itertools.pairwise(starts)]
    assert plain_runs[:4] == [8, 16, 32, 32]  # doubled after each failed probe, up to 8x
    assert switch.leader == PLAIN and switch.backoff == MAX_BACKOFF
    assert arms[-2 * (32 + probe) :].count("S") == 2 * probe  # one probe per 32 plain steps
    # a new generation (step 0), a new text: the wait between probes is halved, not reset...
    switch.lost = LOST_STREAK - 1
    drive(switch, clock, 1, spec_rate=0.5, start=0)
    assert switch.backoff == MAX_BACKOFF // 2
    drive(switch, clock, 80, spec_rate=0.5, start=1)
    assert switch.backoff == MAX_BACKOFF  # its probes have failed again
    # ... unless speculation lost its last `LOST_STREAK` probes: then the wait stays
    assert switch.lost >= LOST_STREAK
    for _ in range(3):
        arms = drive(switch, clock, 40, spec_rate=0.5, start=0)
        assert switch.backoff == MAX_BACKOFF and arms.count("S") <= PROBE_MIN + 1


def test_a_drafter_that_never_pays_is_probed_ever_less_across_short_texts():
    """Texts of 12 steps, speculation at half plain decoding's rate: while it has lost fewer
    than `LOST_STREAK` probes in a row each new text halves the wait; after that the wait
    doubles up to `MAX_BACKOFF` and stays, so the probes thin out to one per 32 plain steps
    (halving at every text kept one probe per text or two); a probe that wins ends the streak."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms = "".join(drive(switch, clock, 12, spec_rate=0.5) for _ in range(40))
    assert switch.lost >= LOST_STREAK and switch.backoff == MAX_BACKOFF
    late = arms[-12 * 20 :]  # the last 20 texts: 240 steps
    assert len(probe_starts(late)) <= 240 // (4 * MAX_BACKOFF) + 1
    halving = PlainSwitch(probe_every=4, now=lambda: clock[0], streak_limit=0)
    arms = "".join(drive(halving, clock, 12, spec_rate=0.5) for _ in range(40))
    assert len(probe_starts(arms[-12 * 20 :])) >= 8 and halving.backoff < MAX_BACKOFF
    drive(switch, clock, 120, spec_rate=3.0, start=12)  # speculation pays again: found
    assert switch.leader == SPECULATE and switch.lost == 0 and switch.backoff == 1


@pytest.mark.parametrize("ratio", [CUT + 0.05, CUT - 0.05])
def test_only_a_clearly_losing_probe_is_cut_short(ratio):
    """A probe of speculation at `CUT` or more of plain decoding's rate runs its `WARMUP` steps
    (its later bursts may still win); below `CUT` it ends after `PROBE_MIN` measured steps."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms = drive(switch, clock, 120, spec_rate=ratio)
    assert switch.leader == PLAIN
    probes = re.findall("S+", arms[WARMUP[SPECULATE] + 1 : -1])
    full = WARMUP[SPECULATE] + 1
    assert probes and {len(p) for p in probes} == {full if ratio >= CUT else PROBE_MIN + 1}


def test_a_near_tie_does_not_flip_the_leader():
    """Within `MARGIN`, the arm that leads keeps running (no back and forth on noise)."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms = drive(switch, clock, 120, spec_rate=1.0 - MARGIN / 2)  # speculation slightly slower
    assert switch.leader == SPECULATE
    runs = re.findall("P+|S+", arms[sum(WARMUP) + 1 :])
    assert all(len(r) <= WARMUP[PLAIN] + 1 for r in runs if r[0] == "P")  # probes of plain only
    assert all(len(r) >= 4 * PLAIN_PROBE_FACTOR for r in runs[1:-1] if r[0] == "S")
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    drive(switch, clock, 60, spec_rate=1.0 - 3 * MARGIN)  # clearly slower: plain leads
    assert switch.leader == PLAIN
    drive(switch, clock, 150, spec_rate=1.0 + MARGIN / 2, start=60)  # now slightly faster
    assert switch.leader == PLAIN and switch.backoff == MAX_BACKOFF
    drive(switch, clock, 40, spec_rate=1.0 + 3 * MARGIN, start=210)  # clearly faster
    assert switch.leader == SPECULATE and switch.backoff == 1


def test_a_new_text_judges_a_leading_speculation_on_itself():
    """Speculation that led on the last text (its bursts in the estimate) is probed afresh at a
    new generation: where it loses on the new text, plain decoding leads after a short probe."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    drive(switch, clock, 60, spec_rate=3.0)
    assert switch.leader == SPECULATE and switch.rate(SPECULATE) > 2.5
    arms = drive(switch, clock, 30, spec_rate=0.5, start=0)
    assert arms.startswith("S" * (PROBE_MIN + 1) + "P")  # cut short, then plain decoding leads
    assert {len(r) for r in re.findall("S+", arms)} == {PROBE_MIN + 1}  # and its probes are cut
    assert switch.leader == PLAIN
    # where it still pays, it keeps leading: plain decoding only at its usual probes
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    drive(switch, clock, 60, spec_rate=3.0)
    again = drive(switch, clock, 30, spec_rate=2.0, start=0)
    assert again.startswith("S" * 12) and again.count("P") <= WARMUP[PLAIN] + 1
    assert switch.leader == SPECULATE


def test_rates_are_compared_at_the_current_context_length():
    """Plain decoding measured on long contexts is slower than it will be on a short one: its
    seconds per step are fitted as a line in the length and every rate is read at the current
    length, so speculation measured on a short text does not win against a stale plain rate."""
    switch = PlainSwitch()
    long, short = [(1, 3.0, 600)] * 3, [(1, 2.0, 300)] * 3
    switch.outcomes = [[(1, 1.6, 100)] * 6, long + short]
    line = switch.plain_line()
    assert line(600) == pytest.approx(3.0) and line(100) == pytest.approx(4.0 / 3.0)
    assert switch.rate(PLAIN) == pytest.approx(0.4)  # the ratio of sums, lengths ignored
    assert switch.rate(PLAIN, at=100) == pytest.approx(0.75)
    assert switch.rate(SPECULATE, at=100) == pytest.approx(0.625)  # measured at 100: unscaled
    switch.leader = SPECULATE
    switch.warm = [True, True]
    # the decision at a step of the short text: plain decoding takes the lead
    switch._committed = 100
    assert switch._choose() == PLAIN and switch.leader == PLAIN
    # lengths that spread less than SPREAD give no slope; a falling line is clipped flat, a
    # steeper than proportional one to proportional
    switch.outcomes[PLAIN] = [(1, 3.0, 600), (1, 2.0, 580)]
    assert switch.plain_line()(100) == pytest.approx(2.5)
    switch.outcomes[PLAIN] = [(1, 2.0, 600), (1, 3.0, 300)]
    assert switch.plain_line()(100) == pytest.approx(2.5)
    switch.outcomes[PLAIN] = [(1, 9.0, 600), (1, 1.0, 300)]
    assert switch.plain_line()(225) == pytest.approx(2.5)  # 5.0 / 450 per token of context


def text_token(j: int) -> int:
    """The `j`-th token of the modelled text (`drive_shadow`)."""
    return (7 * j) % 101


def drive_shadow(switch, clock, steps, *, spec_rate, hits, start=0, committed=10):
    """`drive` with shadow drafting: at each plain step the cheapest drafter guesses a 2-token
    chain, the text's next tokens where `hits(i)` says so for step `i`, else tokens the text
    never has. Returns the arms and the committed length."""
    arms = []
    for i in range(start, start + steps):
        root = text_token(committed - 1)
        step = SimpleNamespace(step=i, committed_len=committed, prompt_len=5, root=root)
        plain = switch.plain(step)
        if plain:
            right = (text_token(committed), text_token(committed + 1))
            switch.guess(right if hits(i) else (-1, -2))
        else:
            switch.note((0,))
        clock[0] += 1.0 if plain else 1.0 / spec_rate
        committed += 1
        arms.append("P" if plain else "S")
    return "".join(arms), committed


def test_the_shadow_holds_back_probes_of_a_drafter_whose_guesses_miss():
    """Where the cheapest drafter's guesses at plain steps never match what plain decoding
    commits, speculation cannot pay: its timed probes are skipped, the wait growing as after a
    lost probe. A drafter that says nothing (no shadow) keeps the timed probes."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms, _ = drive_shadow(switch, clock, 200, spec_rate=0.5, hits=lambda i: False)
    warm_up = WARMUP[SPECULATE] + 1
    assert arms.startswith("S" * warm_up + "P") and "S" not in arms[warm_up:]
    assert switch.leader == PLAIN and switch.backoff == MAX_BACKOFF
    assert switch.shadowed and switch.shadow_says() is False
    clock = [0.0]
    silent = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms = drive(silent, clock, 200, spec_rate=0.5)
    assert not silent.shadowed and arms[warm_up:].count("S") >= 4 * (PROBE_MIN + 1)


def test_a_shadow_without_veto_keeps_the_timed_probes_and_still_starts_early_ones():
    """`vetoes` off (the builder drafts another drafter's chain where the cheapest one has
    nothing: its missed guesses say nothing of those chains): guesses that never match hold no
    probe back, and guesses that pay still start one before the timed probe is due."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0], vetoes=False)
    arms, committed = drive_shadow(switch, clock, 200, spec_rate=0.5, hits=lambda i: False)
    warm_up = WARMUP[SPECULATE] + 1
    assert switch.shadowed and switch.leader == PLAIN
    assert arms[warm_up:].count("S") >= 4 * (PROBE_MIN + 1)  # as without a shadow
    due = 4 * switch.backoff - switch.idle[SPECULATE]
    later, _ = drive_shadow(
        switch, clock, 40, spec_rate=3.0, hits=lambda i: True, start=200, committed=committed
    )
    assert later.index("S") < due and switch.leader == SPECULATE


def test_the_shadow_starts_a_probe_as_soon_as_its_guesses_pay():
    """Plain decoding leads and the wait between probes is long; once the guesses match the
    text (a stretch the drafter can copy), speculation is probed within a few steps, not at
    the end of the wait, and takes the lead where it pays."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    arms, committed = drive_shadow(switch, clock, 100, spec_rate=0.5, hits=lambda i: False)
    assert switch.leader == PLAIN and switch.backoff == MAX_BACKOFF and arms.endswith("P" * 20)
    due = 4 * MAX_BACKOFF - switch.idle[SPECULATE]  # steps until the timed probe
    later, _ = drive_shadow(
        switch, clock, 30, spec_rate=3.0, hits=lambda i: True, start=100, committed=committed
    )
    first = later.index("S")
    # after the lost probes (wait 8 x 4 steps) the guesses need 8 matched tokens beyond the
    # two-token speculative step's cost: 9 guesses, checked 2 steps after each
    assert first <= 12 and first < due
    assert switch.leader == SPECULATE and later.endswith("S" * 10)


def test_the_shadow_checks_each_guess_against_the_tokens_that_follow():
    """A guess counts the tokens it got right, in order, up to its first wrong one; a
    speculative step or a new text ends the check with what matched so far."""
    switch = PlainSwitch()
    switch.arm, switch._step = PLAIN, 3
    switch.guess((5, 6, 7))
    switch.guess((5, 9))
    switch.guess(())  # nothing to propose: no token right
    assert switch.shadow == [0]
    switch._check_guesses(SimpleNamespace(step=4, root=5))
    switch._step = 4
    assert switch.shadow == [0] and [g[1] for g in switch._guesses] == [1, 1]
    switch._check_guesses(SimpleNamespace(step=5, root=6))  # (5, 9) ends at its wrong 9
    switch._step = 5
    assert switch.shadow == [0, 1] and switch._guesses == [[(5, 6, 7), 2]]
    switch._check_guesses(SimpleNamespace(step=0, root=7))  # a new text: what matched so far
    assert switch.shadow == [0, 1, 2] and switch._guesses == []
    switch.guess(None)  # a drafter that does not say: no shadow from it
    assert switch.shadow == [0, 1, 2]


def test_shadow_drafting_in_the_decode_loop_is_exact_and_follows_the_guesses():
    """Through the decoder: a drafter whose guesses miss is not probed after its first lost
    probe; one that starts agreeing mid-text is probed within a few steps of it; the output is
    plain greedy decoding's in both."""
    events, tokens, want, builder, _ = decode(lambda n: False, switch=True, guessing=True)
    assert tokens == want
    assert all(plain(e) for e in events[sum(WARMUP) + 2 :]) and builder.switch.shadowed
    prompt_len, stretch = 6, 30
    events, tokens, want, builder, _ = decode(
        lambda n: n >= prompt_len + stretch, switch=True, guessing=True
    )
    assert tokens == want
    first = next(
        e.step
        for e in events
        if not plain(e)
        and prompt_len + sum(len(x.tokens) for x in events[: e.step]) >= prompt_len + stretch
    )
    agreeing = next(
        e.step for e in events if sum(len(x.tokens) for x in events[: e.step]) >= stretch
    )
    assert first - agreeing <= EARLY_MIN + 2
    assert builder.switch.leader == SPECULATE


def test_a_plain_stretch_does_not_compare_the_rates_again(monkeypatch):
    """While plain decoding leads, a plain step leaves speculation's estimate as it was, so the
    rates are compared only after speculative steps (a plain stretch stays cheap); the shadow
    reads no rate while its guesses show no token beyond the wait's multiple."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    drive_shadow(switch, clock, 40, spec_rate=0.5, hits=lambda i: False)
    assert switch.leader == PLAIN
    compared = []
    real = PlainSwitch._rates_at
    monkeypatch.setattr(
        PlainSwitch, "_rates_at", lambda self, at: compared.append(at) or real(self, at)
    )
    lines = []
    real_line = PlainSwitch.plain_line
    monkeypatch.setattr(PlainSwitch, "plain_line", lambda self: lines.append(1) or real_line(self))
    arms, _ = drive_shadow(switch, clock, 60, spec_rate=0.5, hits=lambda i: False, start=40)
    assert arms == "P" * 60 and compared == [] and lines == []


def test_shadow_drafting_can_be_turned_off():
    """`shadow: false`: the switch reads no guesses, so a drafter's chains leave its timed probes
    as they are."""
    on = LayeredBuilder(LayeredConfig(plain_switch=True)).switch
    off = LayeredBuilder(LayeredConfig(plain_switch=True, shadow=False)).switch
    on.leader = off.leader = PLAIN
    assert on.wants_guess and not off.wants_guess


@attrs.define
class SilentDrafter(StubDrafter):
    """`StubDrafter` that proposes no token (an n-gram drafter finding no match): at every
    step, or (`alternate`) at every other one, proposing the right tokens at the others."""

    alternate: bool = False
    steps: int = 0

    def expand(self, tree: DraftTree, nodes, k):
        if tree.n_nodes == 1:
            self.steps += 1
        if self.alternate and self.steps % 2:
            return super().expand(tree, nodes, k)
        empty = torch.zeros(0, 1, dtype=torch.long)
        return Proposal(nodes[:0].clone(), empty, empty.to(tree.score.dtype))


def decode_silent(agrees, new_tokens: int = 80, alternate: bool = False):
    """A generation whose cheapest drafter proposes nothing (at every step, or every other one),
    with `silent_chain`: the stub drafter's chains (agreeing where `agrees` says) or the root
    alone, chosen by measure at those steps."""
    config = LayeredConfig(depth=DEPTH, top_k=1, budget=DEPTH, silent_chain=DEPTH, probe_every=8)
    events, tokens, want, builder, scheduler = run_stub(
        config,
        lambda truth, clock: (
            SilentDrafter(truth, lambda n: True, clock, alternate=alternate),
            StubDrafter(truth, agrees, clock),
        ),
        new_tokens,
    )
    assert tokens == want
    chained = [e.build.silent for e in events]
    assert all(e.calls == (1,) * e.tree_size and e.tree_size > 0 for e in events if e.build.silent)
    assert len(scheduler.outcomes) == chained.count(False)  # chains stay out of its outcomes
    silent = [e for e in events if e.calls[0] == 1 or e.tree_size == 0]
    assert all(e.calls == (0,) for e in silent if not e.build.silent)
    return [e.build.silent for e in silent], builder.silent


def test_silent_steps_draft_chains_where_they_pay_and_the_root_alone_where_not():
    """`silent_chain` behind its own measured switch: where the strongest drafter's chains are
    accepted they are drafted at every silent step but the few that measure the root alone;
    where they are rejected, the root goes alone but for short probes of chains; exact both."""
    chains, silent = decode_silent(lambda n: True)
    assert chains.count(False) <= WARMUP[PLAIN] and silent.leader == SPECULATE
    chains, silent = decode_silent(lambda n: False)
    late = chains[sum(WARMUP) + 2 :]
    assert late.count(False) >= 0.5 * len(late) and True in late  # probed again
    assert silent.leader == PLAIN
    # silent steps between others: each measured up to the next step's start
    chains, silent = decode_silent(lambda n: False, new_tokens=160, alternate=True)
    assert silent.leader == PLAIN and chains[-8:].count(False) >= 4


def test_a_switch_asked_at_some_steps_begins_each_text_once_and_measures_up_to_the_next():
    """`close` at every step's start, `plain` only at some: a step asked is measured up to the
    start of the step after it (whatever that one is), a step not followed at once by another
    is not measured, and a new text's first step halves the wait once, not twice."""
    clock = [0.0]
    switch = PlainSwitch(probe_every=4, now=lambda: clock[0])
    switch.backoff = 8

    def step(i, committed, ask, seconds):
        ctx = SimpleNamespace(step=i, committed_len=committed, prompt_len=5, root=0)
        switch.close(ctx)
        if ask:
            switch.plain(ctx)
        clock[0] += seconds

    step(0, 10, True, 1.0)  # a new text: the wait halves once
    assert switch.backoff == 4
    step(1, 11, True, 1.0)  # asked: measured up to step 2's start
    step(2, 14, False, 1.0)
    step(3, 15, False, 1.0)
    assert switch.outcomes[SPECULATE] == [(3, 1.0, 11)]
    step(4, 16, True, 2.0)
    step(6, 20, True, 1.0)  # not the step after: step 4 is not measured
    assert switch.outcomes[SPECULATE] == [(3, 1.0, 11)]
