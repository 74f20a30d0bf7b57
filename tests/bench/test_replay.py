"""Replay: the stand-in target makes the greedy verifier accept the longest matching path."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_llama
from treegraft.bench.replay import (
    LatencyCurve,
    ReplayDiverged,
    ReplayTarget,
    ReplayTimes,
    measure_latency,
    query_grid,
)
from treegraft.core.config import NoConfig
from treegraft.core.metrics import ForwardTimes
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.plugins.verifiers.greedy import GreedyVerifier

CURVE = LatencyCurve("m", 8, (1, 4, 8), (1.0, 2.0, 4.0))


def tree(tokens: list[int], parents: list[int]) -> DraftTree:
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


def test_the_verifier_accepts_the_longest_path_matching_the_continuation():
    target = ReplayTarget(vocab_size=16, curve=CURVE, device=torch.device("cpu"))
    target.expect([5, 6, 7, 8, 9, 10])
    target.begin(torch.tensor([1, 2, 3]), max_len=64)
    # root 3 ── 5 ── 6 ─┬─ 7     accepted: 5 6 7, bonus 8
    #      │            └─ 1
    #      └── 9 ── 8           (8 would be right at depth 2, but under a wrong parent)
    t = tree([3, 5, 9, 6, 7, 1, 8], [-1, 0, 0, 1, 3, 3, 2])
    verdict = GreedyVerifier(NoConfig()).verify(t, target.forward_tree(t))
    assert verdict.path[: int(verdict.length)].tolist() == [0, 1, 3, 4]
    assert int(verdict.bonus) == 8
    assert target.queries == [2 + 7]  # the pending prompt tokens and the tree
    target.commit(verdict.path[:4], torch.tensor([5, 6, 7, 8]))
    assert target.committed_ids().tolist() == [1, 2, 3, 5, 6, 7, 8]
    t2 = tree([8, 9, 4], [-1, 0, 0])
    verdict = GreedyVerifier(NoConfig()).verify(t2, target.forward_tree(t2))
    assert int(verdict.length) == 2 and int(verdict.bonus) == 10
    assert target.queries == [9, 3]
    assert target.predicted == [CURVE(9), CURVE(3)]


def test_a_divergent_commit_and_a_short_continuation_are_errors():
    target = ReplayTarget(vocab_size=16, curve=CURVE, device=torch.device("cpu"))
    target.expect([5, 6])
    target.begin(torch.tensor([1, 2]), max_len=64)
    with pytest.raises(ReplayDiverged, match="replay needs a greedy, exact pipeline"):
        target.commit(torch.tensor([0]), torch.tensor([4]))
    with pytest.raises(ReplayDiverged, match="too short"):
        target.forward_tree(tree([2, 5, 6], [-1, 0, 1]))


def test_latency_curve_interpolates_and_extrapolates():
    assert CURVE(1) == 1.0 and CURVE(8) == 4.0
    assert CURVE(2) == pytest.approx(1 + 1 / 3)
    assert CURVE(16) == pytest.approx(8.0)  # the last segment's slope, 0.5 s per query
    assert query_grid(40, marks=[33]) == (1, 2, 4, 8, 16, 32, 33, 40)
    queries = [1, 2, 3, 5, 8, 9, 16, 40]
    assert CURVE.many(queries).tolist() == pytest.approx([CURVE(q) for q in queries])


def test_replay_times_give_schedulers_the_curve_s_target_time():
    """Forward times and a step's seconds (what a call guard learns from) carry the curve's
    prediction of the target forward, not the stand-in's own (near zero) time."""
    target = ReplayTarget(vocab_size=16, curve=CURVE, device=torch.device("cpu"))
    target.expect([5, 6, 7])
    target.begin(torch.tensor([1, 2, 3]), max_len=64)
    target.forward_tree(tree([3, 5], [-1, 0]))  # 2 pending + 2 nodes: CURVE(4) = 2.0 s
    times = ReplayTimes(source=target)
    stages = {"build": 0.25, "drafter0": 0.125, "target": 0.001, "verify": 0.5, "commit": 0.0625}
    times.record_step((0,), stages, 1)
    assert times.target_time() == 2.0
    assert times.step_seconds(stages) == 0.25 + 2.0 + 0.5 + 0.0625
    assert ForwardTimes().step_seconds(stages) == 0.25 + 0.001 + 0.5 + 0.0625


def test_the_replay_target_answers_its_curve_instead_of_measuring():
    target = ReplayTarget(vocab_size=8, curve=CURVE, device=torch.device("cpu"))
    assert target.latency_curve((1, 2, 4), context=5) is CURVE


def test_measure_latency_times_every_point():
    runner = CausalLMRunner(tiny_llama(seed=4))
    curve = measure_latency(runner, "mem:x", context=6, queries=(1, 4, 9), repeats=1)
    assert curve.queries == (1, 4, 9) and curve.context == 6
    assert all(s > 0 for s in curve.seconds)


def test_a_snapshot_replay_target_forwards_the_kept_tokens_of_a_partial_step_again():
    """As `StateRunner` rolled back by snapshot: a chain kept in part is forwarded again at
    commit (its time on the clock), a chain kept whole or not at all is not, and a lone kept
    root stays pending for the next forward."""
    target = ReplayTarget(vocab_size=16, curve=CURVE, device=torch.device("cpu"), snapshots=True)
    target.expect(list(range(5, 17)))
    target.begin(torch.tensor([1, 2, 3]), max_len=64)
    steps = (([3, 5, 6, 1], 3), ([7, 8, 9], 3), ([10, 1], 1), ([11, 12], 2))
    for tokens, kept in steps:
        chain = tree(tokens, list(range(-1, len(tokens) - 1)))
        target.forward_tree(chain)
        bonus = target.continuation[target.n_committed - target.prompt_len + kept - 1]
        new = torch.tensor([*tokens[1:kept], bonus])
        offset = target.offset
        target.commit(torch.arange(kept), new)
        assert target.offset - offset >= (CURVE(target.replays[-1]) if target.replays[-1] else 0)
    # the first chain keeps 3 of 4 (2 pending prompt tokens before it), the second all, the
    # third only its root (pending then), the fourth both nodes after that pending root
    assert target.replays == [5, 0, 0, 0]
    assert target.queries == [6, 3, 2, 3]
    assert target.target_seconds() == [CURVE(6) + CURVE(5), CURVE(3), CURVE(2), CURVE(3)]
