"""Point-mass verification: its output law is the target's law, checked exactly and by sampling.

The toy target: vocabulary V = 8; the logits after a context are a fixed random vector per context
(`toy_logits`), so a tree's target logits are one row per node and no model is needed. The law under
test is that of the first two committed tokens, `P(x1) * P(x2 | x1)`; when a step commits only one
token, the second is what the next step emits with an empty tree (the real `verify` on a root-only
tree).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from tests.conftest import greedy_reference, memory_resources
from treegraft.core.config import ConfigError, NoConfig, pipeline_spec_from_dict
from treegraft.core.errors import ArgumentError, NonFiniteLogitsError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.tree import DraftTree, Proposal
from treegraft.plugins.verifiers.greedy import GreedyVerifier
from treegraft.plugins.verifiers.pointmass import PointMassConfig, PointMassVerifier, target_probs
from treegraft.testing import chi_square_p_value

V = 8
NOTHING = V  # law cell of a token -1: a (wrong) verifier found no mass left to draw from
SAMPLES = 100_000
MIN_EXPECTED = 5.0  # chi-square cells expecting fewer counts are pooled into one


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread avoids oversubscribing a shared CPU (10x faster here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------- the toy target


def toy_logits(context: tuple[int, ...]) -> Tensor:
    """`[V]` float64 target logits after `context` (a fixed random vector per context)."""
    code = sum((tok + 1) * (V + 1) ** i for i, tok in enumerate(context))
    rng = torch.Generator().manual_seed(7919 + code)
    return 1.5 * torch.randn(V, generator=rng, dtype=torch.float64)


def tree_logits(tree: DraftTree) -> Tensor:
    """`[n, V]` toy target logits after each node's path (root excluded from the context)."""
    return torch.stack(
        [toy_logits(tuple(tree.tokens[tree.path_to(i)][1:].tolist())) for i in range(tree.n_nodes)]
    )


def reference_law(logits: Tensor, config: PointMassConfig) -> list[float]:
    """The target sampler's law for one `[V]` row, written plainly (independent of `target_probs`)."""
    ranked = sorted(range(V), key=lambda t: (-float(logits[t]), t))
    if config.top_k:
        ranked = ranked[: config.top_k]
    weights = {t: math.exp(float(logits[t]) / config.temperature) for t in ranked}
    total = sum(weights.values())
    kept, mass = [], 0.0
    for t in ranked:
        if config.top_p < 1 and mass >= config.top_p:
            break
        kept.append(t)
        mass += weights[t] / total
    kept = [t for t in kept if weights[t] >= config.min_p * weights[kept[0]]]  # min-p
    norm = sum(weights[t] for t in kept)
    return [weights[t] / norm if t in kept else 0.0 for t in range(V)]


def target_two_token_law(config: PointMassConfig) -> Tensor:
    """`[V + 1, V + 1]` float64: P(x1) * P(x2 | x1) under the toy target (0 for `NOTHING`)."""
    first = reference_law(toy_logits(()), config)
    rows = [[first[a] * q for q in reference_law(toy_logits((a,)), config)] for a in range(V)]
    law = torch.zeros(V + 1, V + 1, dtype=torch.float64)
    law[:V, :V] = torch.tensor(rows, dtype=torch.float64)
    return law


# ---------------------------------------------------------------------------- toy trees


def multi_drafter_tree() -> DraftTree:
    """Children from two drafters; some offered by both (deduplicated), depth 3."""
    tree = DraftTree.from_root(0, dtype=torch.float64)
    weak = Proposal(
        parents=torch.tensor([0, 0, 0]),
        tokens=torch.tensor([[1, 2, 3], [4, -1, -1], [7, 6, -1]]),
        logp=torch.full((3, 3), -1.0, dtype=torch.float64),
    )
    strong = Proposal(
        parents=torch.tensor([0, 0, 0, 0]),
        tokens=torch.tensor([[1, 5], [4, 2], [6, -1], [1, 2]]),  # 1, 4 and 1 -> 2 again
        logp=torch.full((4, 2), -0.5, dtype=torch.float64),
    )
    tree, _ = tree.extend(weak, drafter=0)
    tree, _ = tree.extend(strong, drafter=1)
    return tree


def wide_tree() -> DraftTree:
    """Six of the eight tokens under the root, a chain of two below one of them."""
    parents = [-1, 0, 0, 0, 0, 0, 0, 2, 7, 1]
    tokens = [5, 3, 1, 7, 0, 5, 2, 6, 4, 1]
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


def every_token_tree() -> DraftTree:
    """Every token is a child of the root (no mass left for recovery there), depth 3."""
    parents = [-1, *[0] * V, 3, 3, 3, 9]
    tokens = [2, *range(V), 6, 0, 4, 4]
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


CASES = {
    "multi_drafter_top_k": (multi_drafter_tree, PointMassConfig(temperature=1.0, top_k=3)),
    "wide_top_p": (wide_tree, PointMassConfig(temperature=0.7, top_p=0.8)),
    "every_token_unfiltered": (every_token_tree, PointMassConfig(temperature=1.3)),
    "top_k_and_top_p": (wide_tree, PointMassConfig(temperature=1.0, top_k=4, top_p=0.7)),
    "min_p": (multi_drafter_tree, PointMassConfig(temperature=1.2, min_p=0.2)),
}


# ---------------------------------------------------------------------------- exact enumeration

#: Acceptance probability of a child given the current (zeroed, unnormalised) law, the child's
#: token, the child's position among its siblings and the node's unfiltered law.
AcceptRule = Callable[[list[float], int, int, list[float]], float]


def renormalised_rule(law: list[float], tok: int, rank: int, original: list[float]) -> float:
    total = sum(law)
    return law[tok] / total if total > 0 else 0.0


def first_child_rule(law: list[float], tok: int, rank: int, original: list[float]) -> float:
    return 1.0 if rank == 0 else 0.0


def unrenormalised_rule(law: list[float], tok: int, rank: int, original: list[float]) -> float:
    return original[tok]


def emissions(tree: DraftTree, laws: list[list[float]], node: int, rule: AcceptRule) -> dict:
    """Exact law of the verifier's decision at `node`: {(token, accepted child or None): prob}."""
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    law, reach, out = list(laws[node]), 1.0, {}
    children = [c for c in range(tree.n_nodes) if parents[c] == node]
    for rank, child in enumerate(children):
        accept = rule(law, tokens[child], rank, laws[node])
        out[(tokens[child], child)] = reach * accept
        reach *= 1.0 - accept
        law[tokens[child]] = 0.0
    total = sum(law)
    if total == 0:
        out[(NOTHING, None)] = reach
        return out
    for tok in range(V):
        if law[tok] > 0:
            out[(tok, None)] = reach * law[tok] / total
    return out


def verifier_two_token_law(tree: DraftTree, config: PointMassConfig, rule: AcceptRule) -> Tensor:
    """`[V + 1, V + 1]` float64 exact law of the first two tokens a verifier following `rule`
    commits (`NOTHING` where it finds no mass left to draw from)."""
    laws = [reference_law(row, config) for row in tree_logits(tree)]
    law = torch.zeros(V + 1, V + 1, dtype=torch.float64)
    for (x1, child), p1 in emissions(tree, laws, 0, rule).items():
        if x1 == NOTHING:
            law[NOTHING, NOTHING] += p1
        elif child is None:  # the next step verifies an empty tree: a plain draw from the target
            next_law = reference_law(toy_logits((x1,)), config)
            law[x1, :V] += p1 * torch.tensor(next_law, dtype=torch.float64)
        else:
            for (x2, _), p2 in emissions(tree, laws, child, rule).items():
                law[x1, x2] += p1 * p2
    return law


# ---------------------------------------------------------------------------- sampling


class FirstChildVerifier(PointMassVerifier):
    """Deliberately wrong: always accepts the first child."""

    def accept_children(
        self, is_child: Tensor, uniforms: Tensor, mass: Tensor, remaining: Tensor
    ) -> Tensor:
        return is_child


class UnrenormalisedVerifier(PointMassVerifier):
    """Deliberately wrong: accepts child c with its original P(c), never renormalising."""

    def accept_children(
        self, is_child: Tensor, uniforms: Tensor, mass: Tensor, remaining: Tensor
    ) -> Tensor:
        return is_child & (uniforms < mass)


WRONG = {
    "first_child": (FirstChildVerifier, first_child_rule),
    "unrenormalised": (UnrenormalisedVerifier, unrenormalised_rule),
}


def sample_two_tokens(verifier: PointMassVerifier, tree: DraftTree, samples: int) -> Tensor:
    """`[samples, 2]` first two committed tokens, through the verifier's real sampling path."""
    out = verifier.verify_batch(tree, tree_logits(tree), samples)
    drafted = tree.tokens[out.path.clamp(min=0)]  # [B, n]
    first = torch.where(out.length >= 2, drafted[:, 1], out.bonus)
    second = torch.where(out.length >= 3, drafted[:, 2], out.bonus)
    alone = (out.length == 1) & (first >= 0)  # a wrong verifier may find nothing left to draw
    for tok in first[alone].unique().tolist():
        rows = alone & (first == tok)
        root_only = DraftTree.from_root(tok)
        nxt = verifier.verify_batch(root_only, toy_logits((tok,))[None], int(rows.sum()))
        second[rows] = nxt.bonus
    return torch.stack([first, second], dim=-1)


@attrs.frozen
class ChiSquare:
    statistic: float
    dof: int
    p_value: float


def chi_square(pairs: Tensor, law: Tensor) -> ChiSquare:
    """Pearson's test of observed token pairs against `law` (`[V + 1, V + 1]`); rare cells pooled.

    Token -1 (nothing left to draw) counts in the `NOTHING` cells. A pair observed where `law` is
    exactly 0 makes the statistic infinite. The survival function of the chi-square distribution is
    the regularised upper incomplete gamma `Q(dof/2, x/2)`.
    """
    cells = torch.where(pairs < 0, NOTHING, pairs)  # [B, 2]
    observed = torch.bincount(cells[:, 0] * (V + 1) + cells[:, 1], minlength=(V + 1) ** 2).double()
    expected = law.flatten() * pairs.shape[0]
    if bool((observed[expected == 0] > 0).any()):
        return ChiSquare(math.inf, 0, 0.0)
    rare = expected < MIN_EXPECTED
    obs = torch.cat([observed[~rare], observed[rare].sum().reshape(1)])
    exp = torch.cat([expected[~rare], expected[rare].sum().reshape(1)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    if dof == 0:  # a single possible outcome, observed every time
        return ChiSquare(stat, dof, 1.0)
    p = torch.special.gammaincc(
        torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return ChiSquare(stat, dof, float(p))


def verifier(cls: type[PointMassVerifier], config: PointMassConfig, seed: int) -> PointMassVerifier:
    v = cls(config)
    v.begin(seed)
    return v


# ---------------------------------------------------------------------------- law tests


def test_toy_trees_cover_the_hard_cases() -> None:
    tree = multi_drafter_tree()
    assert tree.n_nodes == 1 + 9  # 13 proposed tokens, 4 merged into existing children
    assert set(tree.proposer[1:].tolist()) == {0, 1}
    for make, config in CASES.values():
        tree = make()
        assert int(tree.depth.max()) <= 3
        mass = target_probs(tree_logits(tree), **attrs.asdict(config))[
            tree.parents[1:], tree.tokens[1:]
        ]
        if config.top_k or config.top_p < 1 or config.min_p:
            assert bool((mass == 0).any()), "a filtered-out child must be in the tree"


@pytest.mark.parametrize("case", CASES)
def test_exact_law_of_the_rule_is_the_target_law(case: str) -> None:
    make, config = CASES[case]
    law = verifier_two_token_law(make(), config, renormalised_rule)
    torch.testing.assert_close(law, target_two_token_law(config), rtol=0, atol=1e-12)


@pytest.mark.parametrize("wrong", WRONG)
@pytest.mark.parametrize("case", CASES)
def test_exact_law_of_a_wrong_rule_differs(case: str, wrong: str) -> None:
    make, config = CASES[case]
    law = verifier_two_token_law(make(), config, WRONG[wrong][1])
    assert float((law - target_two_token_law(config)).abs().max()) > 1e-2


@pytest.mark.parametrize("case", CASES)
def test_sampled_law_passes_chi_square(case: str) -> None:
    make, config = CASES[case]
    pairs = sample_two_tokens(verifier(PointMassVerifier, config, seed=11), make(), SAMPLES)
    test = chi_square(pairs, target_two_token_law(config))
    assert test.p_value > 1e-3, test


@pytest.mark.parametrize("wrong", WRONG)
@pytest.mark.parametrize("case", CASES)
def test_wrong_verifier_fails_chi_square(case: str, wrong: str) -> None:
    """The same test rejects a wrong verifier, whose samples do follow its own enumerated law."""
    make, config = CASES[case]
    cls, rule = WRONG[wrong]
    pairs = sample_two_tokens(verifier(cls, config, seed=11), make(), SAMPLES)
    against_target = chi_square(pairs, target_two_token_law(config))
    assert against_target.p_value < 1e-9, against_target
    against_own_law = chi_square(pairs, verifier_two_token_law(make(), config, rule))
    assert against_own_law.p_value > 1e-3, against_own_law


@st.composite
def toy_trees(draw: st.DrawFn) -> DraftTree:
    """Random trees over the toy vocabulary: depth <= 3, distinct children."""
    parents, tokens, depth = [-1], [draw(st.integers(0, V - 1))], [0]
    for _ in range(draw(st.integers(0, 14))):
        parent = draw(st.sampled_from([i for i, d in enumerate(depth) if d < 3]))
        taken = {t for p, t in zip(parents, tokens, strict=True) if p == parent}
        free = [t for t in range(V) if t not in taken]
        if free:
            parents.append(parent)
            tokens.append(draw(st.sampled_from(free)))
            depth.append(depth[parent] + 1)
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


configs = st.builds(
    PointMassConfig,
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
    top_k=st.integers(0, V),
    top_p=st.sampled_from([0.3, 0.9, 1.0]),
    min_p=st.sampled_from([0.0, 0.2, 1.0]),
)


@given(tree=toy_trees(), config=configs)
def test_exact_law_matches_target_on_random_trees(tree: DraftTree, config: PointMassConfig) -> None:
    law = verifier_two_token_law(tree, config, renormalised_rule)
    torch.testing.assert_close(law, target_two_token_law(config), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- the code path


def test_batch_rows_are_successive_verify_calls() -> None:
    tree, config = multi_drafter_tree(), PointMassConfig(temperature=0.9, top_k=5)
    logits = tree_logits(tree)
    batch = verifier(PointMassVerifier, config, seed=3).verify_batch(tree, logits, 6)
    single = verifier(PointMassVerifier, config, seed=3)
    for row in range(6):
        verdict = single.verify(tree, logits)
        assert torch.equal(verdict.path, batch.path[row])
        assert torch.equal(verdict.length, batch.length[row])
        assert torch.equal(verdict.bonus, batch.bonus[row])


def test_verdict_is_a_root_path_of_device_tensors() -> None:
    tree = multi_drafter_tree()
    out = verifier(PointMassVerifier, PointMassConfig(), seed=0).verify_batch(
        tree, tree_logits(tree), 2000
    )
    assert out.path.dtype == out.length.dtype == out.bonus.dtype == torch.long
    assert bool((out.path[:, 0] == 0).all())
    depth = torch.arange(tree.n_nodes)
    on_path = depth[None, :] < out.length[:, None]  # [B, n]
    assert torch.equal(out.path >= 0, on_path)
    child, parent = out.path[:, 1:], out.path[:, :-1]
    linked = tree.parents[child.clamp(min=0)] == parent
    assert bool((linked | ~on_path[:, 1:]).all())
    assert {1, 2, 3} <= set(out.length.tolist())  # the walk does stop at every depth
    verdict = PointMassVerifier(PointMassConfig()).verify(tree, tree_logits(tree))
    assert verdict.path.shape == (tree.n_nodes,) and verdict.length.ndim == verdict.bonus.ndim == 0


def test_zero_probability_children_are_never_accepted() -> None:
    tree, config = every_token_tree(), PointMassConfig(top_k=2)
    logits = tree_logits(tree)
    probs = target_probs(logits, top_k=2)
    out = verifier(PointMassVerifier, config, seed=5).verify_batch(tree, logits, 5000)
    accepted = out.path[:, 1:][out.path[:, 1:] >= 0]
    assert bool((probs[tree.parents[accepted], tree.tokens[accepted]] > 0).all())
    last = out.path.gather(1, (out.length - 1)[:, None])[:, 0]
    assert bool((probs[last, out.bonus] > 0).all())


def test_one_host_read_per_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy for device syncs on CPU: count tensor -> Python conversions inside `verify`."""
    tree = wide_tree()
    logits = tree_logits(tree)
    v = verifier(PointMassVerifier, PointMassConfig(top_p=0.9), seed=0)
    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, _counted(original, name, reads))
    assert bool(torch.tensor(True)) and reads == ["__bool__"]  # the counter does count
    reads.clear()
    v.verify(tree, logits)
    monkeypatch.undo()
    assert reads == ["tolist"]


def _counted(original: Any, name: str, reads: list[str]) -> Any:
    def wrapper(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        reads.append(name)
        return original(self, *args, **kwargs)

    return wrapper


def test_same_seed_same_verdicts_different_seed_different() -> None:
    tree, config = wide_tree(), PointMassConfig(temperature=0.8, top_p=0.95)
    logits = tree_logits(tree)

    def bonuses(seed: int) -> Tensor:
        return verifier(PointMassVerifier, config, seed).verify_batch(tree, logits, 64).bonus

    assert torch.equal(bonuses(1), bonuses(1))
    assert not torch.equal(bonuses(1), bonuses(2))


@given(tree=toy_trees(), temperature=st.sampled_from([0.3, 1.0, 4.0]))
def test_top_k_1_is_the_greedy_verdict(tree: DraftTree, temperature: float) -> None:
    logits = tree_logits(tree)
    greedy = GreedyVerifier(NoConfig()).verify(tree, logits)
    top_1 = verifier(PointMassVerifier, PointMassConfig(temperature=temperature, top_k=1), 0)
    sampled = top_1.verify_batch(tree, logits, 50)
    assert bool((sampled.path == greedy.path).all())
    assert bool((sampled.length == greedy.length).all() and (sampled.bonus == greedy.bonus).all())


def test_target_probs_filters_like_the_plain_reference() -> None:
    logits = torch.stack([toy_logits((t,)) for t in range(V)])
    for config in (
        PointMassConfig(0.7, 3, 1.0),
        PointMassConfig(1.2, 0, 0.6),
        PointMassConfig(1.0, 5, 0.5),
        PointMassConfig(0.9, 0, 1.0, 0.25),
        PointMassConfig(1.5, 6, 0.8, 0.1),
    ):
        expected = torch.tensor([reference_law(row, config) for row in logits], dtype=torch.float64)
        torch.testing.assert_close(
            target_probs(logits, **attrs.asdict(config)), expected, rtol=0, atol=1e-12
        )
    ties = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(target_probs(ties, top_k=1).argmax(-1), ties.argmax(-1))  # lower id wins
    assert target_probs(ties, top_k=1).max(-1).values.tolist() == [1.0, 1.0]
    plain = target_probs(logits.float(), temperature=2.0)
    assert plain.dtype == torch.float64
    torch.testing.assert_close(plain, torch.softmax(logits / 2.0, dim=-1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("config", [
    PointMassConfig(0.7, 0, 1.0), PointMassConfig(1.0, 3, 1.0), PointMassConfig(1.3, 0, 0.6),
    PointMassConfig(0.5, 5, 0.8), PointMassConfig(1.0, 0, 1.0, 0.2),
    PointMassConfig(2.0, 7, 0.9, 0.05), PointMassConfig(1.0, 1, 0.3, 1.0),
], ids=repr)  # fmt: skip
def test_target_probs_is_the_law_of_transformers_sampling_warpers(config: PointMassConfig) -> None:
    """The docs claim `generate(do_sample=True)`'s law: its warpers in its order (temperature,
    top-k, top-p, min-p; one token kept at least), on logits without ties (where the two break
    ties differently, docs/losslessness.md#low-precision)."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits[::3, 7] = -math.inf  # a token the model rules out
    scores = TemperatureLogitsWarper(config.temperature)(None, logits.clone())
    if config.top_k:
        scores = TopKLogitsWarper(config.top_k)(None, scores)
    if config.top_p < 1:
        scores = TopPLogitsWarper(config.top_p)(None, scores)
    if config.min_p:
        scores = MinPLogitsWarper(config.min_p)(None, scores)
    expected = torch.softmax(scores, dim=-1)
    got = target_probs(logits, **attrs.asdict(config))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("config", [PointMassConfig(), PointMassConfig(0.9, 3, 0.7, 0.1)], ids=repr)
def test_target_probs_of_one_row_or_a_batch_of_rows(config: PointMassConfig) -> None:
    """The law of one `[V]` row (a plain sampler's) was an IndexError once a filter was on, a
    `[B, n, V]` batch a RuntimeError under top-p; both are the `[n, V]` law's rows now."""
    logits = torch.stack([toy_logits((t,)) for t in range(6)]).reshape(2, 3, V)  # [2, 3, V]
    rows = target_probs(logits.reshape(6, V), **attrs.asdict(config))
    assert torch.equal(target_probs(logits, **attrs.asdict(config)), rows.reshape(2, 3, V))
    assert torch.equal(target_probs(logits[1, 2], **attrs.asdict(config)), rows[5])
    for bad in (torch.zeros(3, 0), torch.tensor(1.0), [1.0, 2.0]):
        with pytest.raises(ArgumentError, match=r"^target_probs: logits: expected a tensor"):
            target_probs(bad)


@pytest.mark.parametrize("temperature", [1e-6, 1e-200, 1e-310, 5e-324])
def test_tiny_temperature_keeps_the_top_tokens_not_nan(temperature: float) -> None:
    """A temperature that overflows `logits / temperature` still gives the limit law: the top
    logits share the mass (a tie splits it), every other token has none."""
    logits = torch.tensor([[3.0, 1.0, 3.0, -2.0], [-5.0, 0.5, 0.25, 0.0]], dtype=torch.float64)
    expected = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    for top_k, top_p in ((0, 1.0), (3, 1.0), (0, 0.9)):
        probs = target_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        assert torch.equal(probs, expected), (top_k, top_p)
    tree = DraftTree.from_parents(torch.tensor([0, 1, 0]), torch.tensor([-1, 0, 1]))
    config = PointMassConfig(temperature=temperature)
    sampled = verifier(PointMassVerifier, config, 0).verify_batch(tree, logits[[1, 1, 1]], 20)
    assert sampled.bonus.tolist() == [1] * 20  # node 1 (token 1) accepted, its leaf 2 rejected


def test_huge_temperature_ranks_by_the_logits() -> None:
    """At a temperature where the logits' gaps divided by it round to 0, top-k still keeps the
    largest logits (`top_k = 1` is greedy at any temperature), not the lowest token ids."""
    logits = torch.tensor([[0.0, 1e-20, -1e-20, 2e-20]], dtype=torch.float64)
    for temperature in (1e300, 1e305):
        probs = target_probs(logits, temperature=temperature, top_k=1)
        assert probs[0].tolist() == [0.0, 0.0, 0.0, 1.0]
        probs = target_probs(logits, temperature=temperature, top_k=2)
        assert probs[0].tolist() == [0.0, 0.5, 0.0, 0.5]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": 0}, "temperature: expected a finite float > 0, got 0"),
        ({"temperature": -1.0}, "temperature: expected a finite float > 0, got -1.0"),
        ({"temperature": math.nan}, "temperature: expected a finite float > 0, got nan"),
        ({"temperature": math.inf}, "temperature: expected a finite float > 0, got inf"),
        ({"top_k": -1}, "top_k: expected an int >= 0, got -1"),
        ({"top_k": 1.5}, "top_k: expected an int >= 0, got 1.5"),
        ({"top_p": 0.0}, "top_p: expected a float with 0 < value <= 1, got 0.0"),
        ({"top_p": 1.5}, "top_p: expected a float with 0 < value <= 1, got 1.5"),
        ({"top_p": math.nan}, "top_p: expected a float with 0 < value <= 1, got nan"),
        ({"min_p": -0.1}, "min_p: expected a float with 0 <= value <= 1, got -0.1"),
        ({"min_p": 1.5}, "min_p: expected a float with 0 <= value <= 1, got 1.5"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_target_probs_refuses_settings_outside_their_ranges(settings: dict, message: str) -> None:
    """A plain-sampling baseline calls `target_probs` with its own settings: a temperature or
    top-p of 0 gave NaN probabilities, a negative temperature the reversed law, a negative
    top-k or a top-p above 1 no filter, all silently."""
    with pytest.raises(ArgumentError) as info:
        target_probs(torch.zeros(2, V), **settings)
    assert str(info.value) == f"target_probs: {message}"


@pytest.mark.parametrize(
    ("logits", "match"),
    [
        (torch.zeros(4, V), r"expected shape \[n, V\] = \[3, V\].*got \[4, 8\]"),
        (torch.zeros(3), r"expected shape \[n, V\] = \[3, V\].*got \[3\]"),
        (torch.zeros(3, V, dtype=torch.long), "expected a floating dtype"),
        (torch.zeros(3, 5), r"tree tokens span \[2, 6\], outside the vocabulary \[0, 5\)"),
        (
            torch.zeros(3, V).index_fill_(1, torch.tensor([4]), math.nan),
            r"row 0 \(tree node 0\) has no finite largest logit",
        ),
        (
            torch.zeros(3, V, dtype=torch.float64).index_fill_(0, torch.tensor([2]), -math.inf),
            r"row 2 \(tree node 2\) has no finite largest logit",
        ),
        (
            torch.zeros(3, V, dtype=torch.float16).index_fill_(0, torch.tensor([1]), math.inf),
            r"row 1 \(tree node 1\) has no finite largest logit",
        ),
    ],
)
def test_bad_inputs_are_rejected_clearly(logits: Tensor, match: str) -> None:
    tree = DraftTree.from_parents(torch.tensor([2, 6, 3]), torch.tensor([-1, 0, 0]))
    with pytest.raises(ValueError, match=match) as caught:
        PointMassVerifier(PointMassConfig()).verify(tree, logits)
    overflow = "no finite largest logit" in match  # the command line's error, not "a bug"
    assert isinstance(caught.value, NonFiniteLogitsError) == overflow


@pytest.mark.parametrize("seed", [-1, 2**32, 2.0, None])
def test_begin_refuses_a_seed_torch_would_alias_or_reject(seed: Any) -> None:
    """-1 and 2**32 drew the numbers of 2**32 - 1 and 0 (torch keeps 32 bits), 2.0 and None
    failed inside torch at the first verify."""
    with pytest.raises(ArgumentError, match=r"^PointMassVerifier.begin: seed: expected an int"):
        PointMassVerifier(PointMassConfig()).begin(seed)


@pytest.mark.parametrize("samples", [0, 2.5, True, "3", None])
def test_verify_batch_refuses_a_count_that_is_no_int(samples: Any) -> None:
    """2.5, True, "3" or None were raw TypeErrors from `torch.rand` or `<`; the generator is
    left untouched, so the next call draws what it would have drawn."""
    tree = wide_tree()
    v = verifier(PointMassVerifier, PointMassConfig(), seed=4)
    with pytest.raises(ArgumentError, match=r"^verify_batch: samples: expected an int >= 1, got"):
        v.verify_batch(tree, tree_logits(tree), samples)
    fresh = verifier(PointMassVerifier, PointMassConfig(), seed=4)
    assert torch.equal(
        v.verify(tree, tree_logits(tree)).bonus, fresh.verify(tree, tree_logits(tree)).bonus
    )


# ---------------------------------------------------------------------------- end to end


#: The layered builder's default cap on strong calls is measured from wall-clock times, so the tree
#: (and with it which random numbers decide what) would vary from run to run; fix it for seed tests.
FIXED_CAP = {"max_strong_calls": 3}


def pipeline_dict(verifier_spec: dict, seed: int = 3, **builder: Any) -> dict:
    return {
        "target": "mem:target",
        "drafters": {"w": {"name": "ngram"}, "s": {"name": "hf_lm", "model": "mem:draft"}},
        "builder": {"name": "layered", "depth": 3, "top_k": 3, "budget": 12, **builder},
        "scheduler": "always",
        "verifier": verifier_spec,
        "decoding": {"max_new_tokens": 30, "dtype": "float64", "seed": seed},
    }


PROMPT = [3, 17, 5, 3, 17, 9, 40, 3, 17]


def generate(
    target: Any, draft: Any, verifier_spec: dict, seed: int = 3, **builder: Any
) -> tuple[tuple[int, ...], int]:
    """Generated token ids and how many draft tokens were accepted on the way."""
    resources = memory_resources(target=target, draft=draft)
    pipe = load_pipeline(pipeline_dict(verifier_spec, seed, **builder), resources=resources)
    out = pipe.generate(PROMPT)
    return out.token_ids, sum(e.accepted for e in out.events)


@pytest.fixture(params=["unrelated_drafter", "target_as_drafter"])
def draft_model(request: pytest.FixtureRequest, tiny_target: Any, tiny_drafter: Any) -> Any:
    """The strong drafter's model: a random one (few acceptances) or the target (many)."""
    return tiny_drafter if request.param == "unrelated_drafter" else tiny_target


def test_top_k_1_commits_the_greedy_continuation(tiny_target: Any, draft_model: Any) -> None:
    spec = {"name": "pointmass", "temperature": 0.8, "top_k": 1}
    sampled, accepted = generate(tiny_target, draft_model, spec)
    assert sampled == generate(tiny_target, draft_model, {"name": "greedy"})[0]
    assert list(sampled) == greedy_reference(tiny_target, torch.tensor(PROMPT), 30)
    if draft_model is tiny_target:
        assert accepted >= 10  # the walk really descends the tree


def test_same_seed_same_output_end_to_end(tiny_target: Any, draft_model: Any) -> None:
    spec = {"name": "pointmass", "temperature": 0.8, "top_p": 0.95}
    resources = memory_resources(target=tiny_target, draft=draft_model)
    pipe = load_pipeline(pipeline_dict(spec, seed=3, **FIXED_CAP), resources=resources)
    first = pipe.generate(PROMPT).token_ids
    assert pipe.generate(PROMPT).token_ids == first  # begin() reseeds every generation
    again, accepted = generate(tiny_target, draft_model, spec, seed=3, **FIXED_CAP)
    assert again == first
    others = {generate(tiny_target, draft_model, spec, seed=s, **FIXED_CAP)[0] for s in (4, 5)}
    assert first not in others
    if draft_model is tiny_target:
        assert accepted > 0


def test_same_seed_same_output_through_steps_and_after_an_interrupted_generation(
    tiny_target: Any,
) -> None:
    """`steps` (what `stream` wraps) draws what `generate` draws, and a generation abandoned
    half-way (its verifier's stream advanced) does not shift the next one's numbers."""
    spec = {"name": "pointmass", "temperature": 0.8, "top_p": 0.95}
    resources = memory_resources(target=tiny_target, draft=tiny_target)
    pipe = load_pipeline(pipeline_dict(spec, seed=3, **FIXED_CAP), resources=resources)
    first = pipe.generate(PROMPT).token_ids
    assert tuple(t for e in pipe.steps(PROMPT) for t in e.tokens) == first
    events = pipe.steps(PROMPT)
    next(events), next(events)
    events.close()
    assert pipe.generate(PROMPT).token_ids == first


def test_the_decoders_seed_gives_another_sample_and_refuses_an_aliasing_one(
    tiny_target: Any,
) -> None:
    """The documented way to draw several samples of one prompt: set `pipe.decoder.seed`. A
    seed torch's CPU generator would alias (-1 reads as 2**32 - 1, 2**32 as 0) was taken
    silently; now an `ArgumentError`, and the decoder keeps its seed."""
    spec = {"name": "pointmass", "temperature": 0.8, "top_p": 0.95}
    resources = memory_resources(target=tiny_target, draft=tiny_target)
    pipe = load_pipeline(pipeline_dict(spec, seed=3, **FIXED_CAP), resources=resources)
    twice = pipe.generate([PROMPT, PROMPT])
    assert twice[0].token_ids == twice[1].token_ids  # each generation starts from the seed
    pipe.decoder.seed = 4
    assert pipe.generate(PROMPT).token_ids != twice[0].token_ids
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ArgumentError, match=r"^decoder\.seed: expected an int"):
            pipe.decoder.seed = bad
    assert pipe.decoder.seed == 4


def test_first_two_tokens_follow_the_targets_joint_law(tiny_target: Any) -> None:
    """End to end (drafts, tree forward, commit, next step): the pair of the first two tokens,
    over many seeds, passes a chi-square test against `P(x1) * P(x2 | x1)` of the target."""
    config = PointMassConfig(temperature=0.5, top_k=6, top_p=0.9)
    spec = pipeline_dict({"name": "pointmass", **attrs.asdict(config)}, **FIXED_CAP)
    pipe = load_pipeline(spec, resources=memory_resources(target=tiny_target, draft=tiny_target))
    law = lambda logits: target_probs(logits, **attrs.asdict(config))  # noqa: E731
    with torch.no_grad():
        first = law(tiny_target(torch.tensor([PROMPT])).logits[0, -1:])[0]  # [V]
        after = torch.tensor([[*PROMPT, t] for t in range(first.numel())])  # [V, T + 1]
        second = law(tiny_target(after).logits[:, -1])  # [V, V]
    joint = (first[:, None] * second).flatten()  # [V * V]
    counts = torch.zeros_like(joint)
    accepted = 0
    for seed in range(600):
        pipe.decoder.seed = seed
        out = pipe.generate(PROMPT, max_new_tokens=2)
        counts[out.token_ids[0] * first.numel() + out.token_ids[1]] += 1
        accepted += sum(e.accepted for e in out.events)
    assert accepted > 150  # the pairs really come from accepted drafts too
    assert chi_square_p_value(counts, joint) > 1e-3


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("temperature", 0, "pipeline.verifier.temperature: expected float > 0, got 0"),
        (
            "temperature",
            float("inf"),
            "pipeline.verifier.temperature: expected float > 0, not infinite, got inf",
        ),
        ("top_p", 1.5, "pipeline.verifier.top_p: expected float with 0 < value <= 1, got 1.5"),
        ("top_k", -1, "pipeline.verifier.top_k: expected int >= 0, got -1"),
    ],
)
def test_bad_configs_name_their_path(key: str, value: Any, message: str) -> None:
    spec = pipeline_dict({"name": "pointmass", key: value})
    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(spec)
    assert str(info.value).startswith(message)


def test_good_config_is_structured() -> None:
    spec = pipeline_spec_from_dict(
        pipeline_dict({"name": "pointmass", "temperature": 0.8, "top_p": 0.95})
    )
    assert spec.verifier.config == PointMassConfig(temperature=0.8, top_k=0, top_p=0.95)
