"""The n-gram drafter: longest-suffix lookup, voted first tokens, chains, learned calibration."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treegraft.core.tree import DraftTree
from treegraft.plugins.drafters.ngram import NgramConfig, NgramDrafter


def drafter(context: list[int], **cfg) -> NgramDrafter:
    d = NgramDrafter(NgramConfig(**cfg))
    d.begin(torch.tensor(context), max_len=256)
    return d


def test_proposes_the_continuation_of_the_longest_matching_suffix():
    #            0  1  2  3  4  5  6  7  8  9
    context = [5, 1, 2, 3, 9, 7, 1, 2, 3, 4, 8, 1, 2]
    d = drafter(context, max_ngram=3, chain_len=3)
    prop = d.expand(DraftTree.from_root(2), torch.tensor([0]), k=4)
    # suffix (1, 2) occurs at 1-2 and 6-7 -> continuations 3 (twice, via both), chains from the newest
    assert prop.parents.tolist() == [0]
    assert prop.tokens.tolist() == [[3, 4, 8]]
    assert prop.logp[0, 0] == math.log(1.0) + math.log(0.5)  # vote share 1, Beta(1,1) prior 0.5


def test_votes_rank_distinct_first_tokens_and_stay_unique_per_parent():
    context = [1, 7, 1, 7, 1, 8, 1, 7, 1, 9, 1]
    d = drafter(context, max_ngram=1, chain_len=1)
    prop = d.expand(DraftTree.from_root(1), torch.tensor([0]), k=3)
    assert prop.tokens[:, 0].tolist() == [7, 9, 8]  # 7 voted three times; ties: the newest first
    shares = prop.logp[:, 0] - math.log(0.5)
    torch.testing.assert_close(shares.exp(), torch.tensor([3 / 5, 1 / 5, 1 / 5]))


def test_context_includes_the_draft_path():
    context = [4, 5, 6, 4, 5, 6, 4]
    d = drafter(context, max_ngram=2, chain_len=2)
    tree = DraftTree.from_parents(torch.tensor([4, 5]), torch.tensor([-1, 0]))
    prop = d.expand(tree, torch.tensor([1]), k=2)  # context ... 4 | 5 -> suffix (4, 5) -> 6, 4
    assert prop.tokens.tolist() == [[6, 4]]


def test_collapse_gives_no_rows():
    d = drafter([1, 2, 3], max_ngram=2, min_ngram=2)
    assert d.expand(DraftTree.from_root(3), torch.tensor([0]), k=4).n_rows == 0


def test_calibration_learns_from_verification_outcomes():
    d = drafter([1, 2, 3, 1, 2, 3, 1, 2], max_ngram=2, chain_len=3)
    tree = DraftTree.from_root(2)
    prop = d.expand(tree, torch.tensor([0]), k=1)  # (1, 2) -> chain 3, 1, 2
    assert prop.tokens.tolist() == [[3, 1, 2]]
    _, node_of = tree.extend(prop, 0)
    # the target accepted 3 and 1, then its bonus was 7 (not 2)
    d.commit(torch.tensor([0, int(node_of[0, 0]), int(node_of[0, 1])]), torch.tensor([3, 1, 7]))
    cal = d.calibration
    assert cal.trials[2].tolist() == [1, 1, 1] and cal.hits[2].tolist() == [1, 1, 0]
    assert cal.log_rate(2, 0) == math.log(2 / 3) and cal.log_rate(2, 2) == math.log(1 / 3)
    assert d.context[-3:] == [3, 1, 7]


def test_index_follows_committed_tokens():
    d = drafter([1, 2], max_ngram=2)
    d.commit(torch.tensor([0]), torch.tensor([1]))
    d.commit(torch.tensor([0]), torch.tensor([2]))
    prop = d.expand(DraftTree.from_root(2), torch.tensor([0]), k=2)
    assert prop.tokens[:, 0].tolist() == [1]


def test_peek_values_the_chain_expand_ranks_first_without_changing_state():
    d = drafter([5, 1, 2, 3, 9, 7, 1, 2, 3, 4, 8, 1, 2], max_ngram=3, chain_len=3)
    d.calibration.record(2, 0, True)  # first-token rate of 2-token matches: 2/3
    peek = d.peek(DraftTree.from_root(2))
    assert d.rows == [] and d.calibration.trials.sum() == 1
    prop = d.expand(DraftTree.from_root(2), torch.tensor([0]), k=4)
    p = prop.logp[0].double().exp().tolist()  # the chain [3, 4, 8]: 2/3, then 1/2, 1/2
    assert peek.first == pytest.approx(p[0]) == pytest.approx(2 / 3)
    assert peek.expected == pytest.approx(p[0] + p[0] * p[1] + p[0] * p[1] * p[2])
    assert peek.chain == (3, 4, 8) == tuple(prop.tokens[0].tolist())


def test_peek_without_a_match_expects_nothing():
    d = drafter([1, 2, 3], max_ngram=2, min_ngram=2)
    assert tuple(d.peek(DraftTree.from_root(3))) == (0.0, 0.0, ())


def test_calibration_rates_follow_every_record_between_reads():
    """The log rates are read many times per step and cached per match length: a record must
    show in the next read (a stale cache would keep the rates of the first read)."""
    d = drafter([1, 2, 3], max_ngram=2, chain_len=2)
    cal = d.calibration
    seen = []
    for hit in (True, True, False, True):
        cal.record(2, 1, hit)
        seen.append(cal.log_rate(2, 1))
        assert cal.log_rates(1) == [math.log(0.5)] * 2  # other match lengths untouched
    assert seen == [math.log(2 / 3), math.log(3 / 4), math.log(3 / 5), math.log(4 / 6)]


@settings(max_examples=200, deadline=None)
@given(
    context=st.lists(st.integers(0, 4), min_size=2, max_size=60),
    max_matches=st.integers(1, 8),
)
def test_the_best_row_is_the_first_of_the_ranked_rows(context, max_matches):
    """`k=1` (a peek, one row per node) takes the most voted continuation, the newest on ties,
    without sorting: the same row that ranks first among all of them."""
    d = drafter(context, max_ngram=3, chain_len=2, max_matches=max_matches)
    suffix = context[-3:]
    best, ranked = d._lookup(0, suffix, 1), d._lookup(0, suffix, 10)
    assert best == ranked[:1]
    if ranked:  # votes by hand: the occurrences with a continuation, the last `max_matches`
        n = ranked[0].match_len
        ends = [
            p for p in range(n - 1, len(context) - 1) if context[p - n + 1 : p + 1] == suffix[-n:]
        ]
        ends = ends[-max_matches:]
        votes = [context[p + 1] for p in ends]
        top = max(
            set(votes), key=lambda t: (votes.count(t), max(p for p in ends if context[p + 1] == t))
        )
        assert ranked[0].chain[0] == top
        assert ranked[0].log_share == math.log(votes.count(top) / len(ends))


def test_memory_carries_the_last_generations_rates_scaled_to_its_weight():
    """`memory: m`: the next generation starts from the last one's evidence, each entry scaled
    to at most `m` trials; without memory (the default) every generation starts at 1/2."""
    fresh, carried = (drafter([1, 2, 3], max_ngram=2, chain_len=2, memory=m) for m in (0, 4))
    for d in (fresh, carried):
        for hit in [True] * 9 + [False] * 3:  # 9 of 12 right: posterior (9 + 1) / (12 + 2)
            d.calibration.record(2, 0, hit)
        d.calibration.record(1, 1, False)  # one trial, under the memory: kept whole
        d.begin(torch.tensor([4, 5]), max_len=64)
    assert fresh.calibration.trials.sum() == 0
    assert fresh.calibration.log_rate(2, 0) == math.log(0.5)
    cal = carried.calibration
    assert cal.trials[2, 0] == pytest.approx(4) and cal.hits[2, 0] == pytest.approx(3)
    assert cal.log_rate(2, 0) == pytest.approx(math.log((3 + 1) / (4 + 2)))
    assert cal.trials[1, 1] == 1 and cal.hits[1, 1] == 0
    assert cal.trials[2, 1] == 0  # never tried: still the prior
    # the carried evidence fades as the new generation's own accumulates
    for _ in range(8):
        cal.record(2, 0, False)
    assert cal.log_rate(2, 0) == pytest.approx(math.log((3 + 1) / (12 + 2)))


def test_memory_is_validated():
    from treegraft.core.config import ConfigError, pipeline_spec_from_dict

    spec = {
        "target": "zoo:target",
        "drafters": {"weak": {"name": "ngram", "memory": -1}},
        "builder": {"name": "layered"},
    }
    with pytest.raises(ConfigError, match=r"drafters\.weak\.memory: expected int >= 0, got -1"):
        pipeline_spec_from_dict(spec)
    spec["drafters"]["weak"]["memory"] = 10**12  # a typo, not a prior
    with pytest.raises(ConfigError, match=r"drafters\.weak\.memory: expected int >= 0 and <= "):
        pipeline_spec_from_dict(spec)
    spec["drafters"]["weak"]["memory"] = "8"
    with pytest.raises(ConfigError, match=r"drafters\.weak\.memory: expected int"):
        pipeline_spec_from_dict(spec)


@pytest.mark.parametrize("key", ["max_ngram", "min_ngram", "chain_len", "store_chain"])
def test_lengths_that_would_allocate_rates_per_token_are_refused(key: str):
    """The rates are arrays of `max_ngram` x `chain_len` (and the store's of `store_chain`):
    a typo of 10**9 ran out of memory or hung at the first generation; now refused by name."""
    from treegraft.core.config import ConfigError, pipeline_spec_from_dict

    spec = {
        "target": "zoo:target",
        "drafters": {"weak": {"name": "ngram", key: 10**9}},
        "builder": {"name": "layered"},
    }
    with pytest.raises(
        ConfigError, match=rf"drafters\.weak\.{key}: expected int >= 1 and <= 1024, got 1000000000"
    ):
        pipeline_spec_from_dict(spec)
