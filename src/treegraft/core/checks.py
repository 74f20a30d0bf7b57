"""The invariants losslessness rests on, checked on what a component hands back.

Each check takes a component's return value and answers None (it holds) or one sentence naming
the broken invariant (`node 3: depth 5, expected parent 1's depth + 1 = 2`). Structure (types,
shapes, dtypes, devices) is read on the host for free; values are tested with a few vectorised
ops whose flags are read to the host together, once per check (one device sync); only a failed
check spends more to describe what it found. `treegraft.core.boundary` calls them where a
component's output crosses into the decoder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from treegraft.core.errors import shown
from treegraft.core.interfaces import BuildResult, Graft, Peek, Rescoring, Verdict
from treegraft.core.tree import DraftTree, Proposal

INT_FIELDS = ("tokens", "parents", "depth", "proposer", "scorer")
FLOAT_FIELDS = ("edge_logp", "score")


def describe(value: object) -> str:
    """`a Tensor [3, 4] torch.float32`, `a list`, `None`: what a component returned."""
    if isinstance(value, Tensor):
        return f"a Tensor {list(value.shape)} {value.dtype}"
    return "None" if value is None else f"a {type(value).__name__}"


def tensor_problem(
    name: str, value: object, *, ndim: int, floating: bool, device: torch.device | None = None
) -> str | None:
    """Type, rank, dtype and device of one returned tensor."""
    if not isinstance(value, Tensor):
        return f"{name}: expected a Tensor, got {describe(value)}"
    kind = "floating" if floating else "int64"
    if value.ndim != ndim:
        return f"{name}: expected {ndim} dimension(s), got {describe(value)}"
    if (value.is_floating_point() if floating else value.dtype == torch.int64) is False:
        return f"{name}: expected a {kind} tensor, got {describe(value)}"
    if device is not None and value.device != device:
        return f"{name}: expected a tensor on {device}, got one on {value.device}"
    return None


def first_failure(flags: Sequence[Tensor], messages: Sequence[str]) -> str | None:
    """Read the 0-d bool `flags` to the host at once (one sync); the message of the first set."""
    if not flags:
        return None
    read = torch.stack([f.reshape(()) for f in flags]).tolist()
    return next((m for m, bad in zip(messages, read, strict=True) if bad), None)


def first_index(bad: Tensor) -> int:
    """Index of the first True of a 1-D bool tensor (a failed check's detail; syncs)."""
    return int(torch.nonzero(bad).flatten()[0])


def tree_problem(
    tree: object, *, vocab: int, root: Tensor | None = None, device: torch.device | None = None
) -> str | None:
    """The documented invariants of a `DraftTree`: `[n]` tensors of the documented dtypes (on
    `device` when given), n >= 1, parents first (`parents[0] == -1`, `0 <= parents[i] < i`), depth
    = parent's depth + 1, tokens inside `[0, vocab)`, the root token `root` (the last committed
    token), siblings carrying distinct tokens, no NaN or +inf score or edge log-prob (-inf marks a
    deleted node; the root's score is finite: it is never deleted)."""
    if not isinstance(tree, DraftTree):
        return f"expected a DraftTree, got {describe(tree)}"
    for name in (*INT_FIELDS, *FLOAT_FIELDS):
        problem = tensor_problem(
            f"tree.{name}",
            getattr(tree, name),
            ndim=1,
            floating=name in FLOAT_FIELDS,
            device=device,
        )
        if problem:
            return problem
    n = tree.n_nodes
    for name in (*INT_FIELDS, *FLOAT_FIELDS):
        value = getattr(tree, name)
        if value.shape[0] != n or value.device != tree.device:
            return f"tree.{name}: expected [{n}] on {tree.device} like tree.tokens, got {describe(value)} on {value.device}"
    if n == 0:
        return "the tree has no nodes; expected at least the root"
    return _tree_values_problem(tree, vocab, root)


def _tree_values_problem(tree: DraftTree, vocab: int, root: Tensor | None) -> str | None:
    n, parents, depth, tokens = tree.n_nodes, tree.parents, tree.depth, tree.tokens
    idx = torch.arange(n, device=tree.device)
    bad_parent = (parents[1:] < 0) | (parents[1:] >= idx[1:])  # [n-1]
    safe = torch.where(bad_parent, 0, parents[1:])
    bad_depth = depth[1:] != depth[safe] + 1
    bad_token = (tokens < 0) | (tokens >= vocab)
    key = parents * (vocab + 1) + tokens.clamp(-1, vocab)  # one key per (parent, token)
    dup = (
        torch.sort(key[1:]).values.diff() == 0
        if n > 2
        else torch.zeros(0, dtype=torch.bool, device=tree.device)
    )
    bad_score = torch.isnan(tree.score) | (tree.score == float("inf"))
    bad_edge = torch.isnan(tree.edge_logp) | (tree.edge_logp == float("inf"))
    flags = [parents[0] != -1, bad_parent.any(), depth[0] != 0, bad_depth.any(), bad_token.any()]
    flags += [dup.any(), bad_score.any(), bad_edge.any(), tree.score[0] == float("-inf")]
    messages = ["parents", "parent", "root depth", "depth", "token", "dup", "score", "edge"]
    messages.append("root score")
    if root is not None:
        flags.append(tokens[0] != root.to(tokens.device))
        messages.append("root")
    found = first_failure(flags, messages)
    if found is None:
        return None
    return _tree_detail(found, tree, vocab, root, bad_parent, bad_depth, bad_token, bad_score)


def _tree_detail(
    found: str,
    tree: DraftTree,
    vocab: int,
    root: Tensor | None,
    bad_parent: Tensor,
    bad_depth: Tensor,
    bad_token: Tensor,
    bad_score: Tensor,
) -> str:
    """The sentence for a failed tree check (slow path: reads what it names)."""
    parents, depth, tokens = tree.parents, tree.depth, tree.tokens
    if found == "parents":
        return f"parents[0] = {int(parents[0])}: expected -1 (node 0 is the root)"
    if found == "parent":
        i = first_index(bad_parent) + 1
        return f"parents[{i}] = {int(parents[i])}: expected 0 <= parent < {i} (parents before children)"
    if found == "root depth":
        return f"depth[0] = {int(depth[0])}: expected 0 (the root)"
    if found == "depth":
        i = first_index(bad_depth) + 1
        p = int(parents[i])
        return f"node {i}: depth {int(depth[i])}, expected its parent {p}'s depth + 1 = {int(depth[p]) + 1}"
    if found == "token":
        i = first_index(bad_token)
        return f"node {i}: token id {int(tokens[i])} outside the target's vocabulary [0, {vocab})"
    if found == "dup":
        return "two children of one parent carry the same token: siblings must be distinct"
    if found == "root score":
        return "root score -inf: expected a finite score (-inf deletes a node; the root stays)"
    if found in ("score", "edge"):
        name = "score" if found == "score" else "edge_logp"
        values = getattr(tree, name)
        i = first_index(torch.isnan(values) | (values == float("inf")))
        return f"node {i}: {name} {float(values[i])}, expected a log-probability (not NaN or +inf)"
    return f"root token {int(tokens[0])}: expected the last committed token {int(root)}"


def proposal_problem(
    proposal: object, tree: DraftTree, *, vocab: int, verb: str = "expand"
) -> str | None:
    """A `Proposal` from `Drafter.expand` (or `.chain`, `verb`): `parents` `[m]` int64 nodes of
    `tree`, `tokens` `[m, c]` int64 in `[0, vocab)` or -1 padding, `logp` `[m, c]` floating, no
    NaN or +inf on a token."""
    if not isinstance(proposal, Proposal):
        return f"{verb} returned {describe(proposal)}, expected a Proposal"
    device = tree.device
    for name, ndim, floating in (("parents", 1, False), ("tokens", 2, False), ("logp", 2, True)):
        problem = tensor_problem(
            f"proposal.{name}",
            getattr(proposal, name),
            ndim=ndim,
            floating=floating,
            device=device,
        )
        if problem:
            return problem
    m = proposal.parents.shape[0]
    if proposal.tokens.shape[0] != m or proposal.logp.shape != proposal.tokens.shape:
        return (
            f"proposal shapes: parents {list(proposal.parents.shape)}, tokens "
            f"{list(proposal.tokens.shape)}, logp {list(proposal.logp.shape)}; expected [m], "
            "[m, c], [m, c]"
        )
    if m == 0:
        return None
    live = proposal.tokens >= 0
    logp = proposal.logp
    flags = [
        ((proposal.parents < 0) | (proposal.parents >= tree.n_nodes)).any(),
        ((proposal.tokens < -1) | (proposal.tokens >= vocab)).any(),
        ((torch.isnan(logp) | (logp == float("inf"))) & live).any(),
    ]
    found = first_failure(flags, ["parent", "token", "logp"])
    if found == "parent":
        bad = proposal.parents[(proposal.parents < 0) | (proposal.parents >= tree.n_nodes)]
        return f"proposal parent {int(bad[0])}: expected a node of the tree, 0 <= parent < {tree.n_nodes}"
    if found == "token":
        bad = proposal.tokens[(proposal.tokens < -1) | (proposal.tokens >= vocab)]
        return f"proposed token id {int(bad[0])}: expected a token of the target's vocabulary [0, {vocab}) (or -1 padding)"
    if found == "logp":
        return "proposal logp: NaN or +inf for a proposed token; expected log-probabilities"
    return None


def logp_problem(logp: object, *, n: int, vocab: int, device: torch.device) -> str | None:
    """`Drafter.score_tree`'s `[n, V]` next-token log-probs: floating, the tree's node count, the
    target's vocabulary, no NaN or +inf (-inf marks tokens it did not score)."""
    problem = tensor_problem("score_tree", logp, ndim=2, floating=True, device=device)
    if problem:
        return problem
    if tuple(logp.shape) != (n, vocab):
        return f"score_tree returned shape {list(logp.shape)}, expected [n_nodes, vocab] = [{n}, {vocab}]"
    if first_failure([(torch.isnan(logp) | (logp == float("inf"))).any()], ["x"]):
        return "score_tree returned NaN or +inf log-probs"
    return None


def nodes_problem(name: str, nodes: object, tree: DraftTree) -> str | None:
    """`[f]` int64 node indices of `tree` (a frontier, graft positions, kept nodes)."""
    problem = tensor_problem(name, nodes, ndim=1, floating=False, device=tree.device)
    if problem:
        return problem
    if nodes.numel() and first_failure([((nodes < 0) | (nodes >= tree.n_nodes)).any()], ["x"]):
        return f"{name}: node index outside the tree's {tree.n_nodes} nodes"
    return None


def rescoring_problem(rescoring: object, tree: DraftTree) -> str | None:
    """`Rescorer.rescore`: `edge_logp` and `score`, `[n]` floating on the tree's device, no NaN
    or +inf, the root's score finite."""
    if not isinstance(rescoring, Rescoring):
        return f"rescore returned {describe(rescoring)}, expected a Rescoring"
    for name in ("edge_logp", "score"):
        value = getattr(rescoring, name)
        problem = tensor_problem(
            f"rescoring.{name}", value, ndim=1, floating=True, device=tree.device
        )
        if problem:
            return problem
        if value.shape[0] != tree.n_nodes:
            return (
                f"rescoring.{name}: expected [{tree.n_nodes}] (one per node), got {describe(value)}"
            )
        if first_failure([(torch.isnan(value) | (value == float("inf"))).any()], ["x"]):
            return f"rescoring.{name}: NaN or +inf; expected log-probabilities"
    if first_failure([rescoring.score[0] == float("-inf")], ["x"]):
        return "rescoring.score: -inf for the root; expected a finite score (the root stays)"
    return None


def graft_problem(graft: object, before: DraftTree, *, vocab: int) -> str | None:
    """`Grafter.graft`: a valid tree keeping every node of `before` in place (non-destructive),
    and a frontier of its nodes."""
    if not isinstance(graft, Graft):
        return f"graft returned {describe(graft)}, expected a Graft"
    problem = tree_problem(graft.tree, vocab=vocab, root=before.tokens[0], device=before.device)
    if problem:
        return f"graft tree: {problem}"
    n0 = before.n_nodes
    if graft.tree.n_nodes < n0:
        return f"graft tree has {graft.tree.n_nodes} nodes, fewer than the {n0} before the graft (a graft never deletes)"
    kept_in_place = (graft.tree.parents[:n0] == before.parents).all() & (
        graft.tree.tokens[:n0] == before.tokens
    ).all()
    if first_failure([~kept_in_place], ["x"]):
        return "graft tree moved or changed nodes of the tree it was given (a graft only appends)"
    return nodes_problem("graft frontier", graft.frontier, graft.tree)


def build_problem(built: object, *, vocab: int, root: Tensor, n_drafters: int) -> str | None:
    """`TreeBuilder.build`: both trees valid under the committed root (on its device), `kept`
    mapping each verified node to a node of the unpruned tree carrying the same token and
    matching parent, `calls` indices of the `n_drafters` drafters."""
    if not isinstance(built, BuildResult):
        return f"build returned {describe(built)}, expected a BuildResult"
    for name in ("tree", "unpruned"):
        problem = tree_problem(getattr(built, name), vocab=vocab, root=root, device=root.device)
        if problem:
            return f"{name}: {problem}"
    tree, full = built.tree, built.unpruned
    problem = nodes_problem("kept", built.kept, full)
    if problem:
        return problem
    if built.kept.shape[0] != tree.n_nodes:
        return (
            f"kept: expected [{tree.n_nodes}] (one per verified node), got {describe(built.kept)}"
        )
    calls = built.calls
    if not isinstance(calls, (tuple, list)) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < n_drafters for c in calls
    ):
        return (
            f"calls: expected a tuple of drafter indices (0 <= index < {n_drafters}), "
            f"got {shown(calls)}"
        )
    kept = built.kept
    mapped_parent = torch.where(tree.parents >= 0, kept[tree.parents.clamp(min=0)], -1)
    same = (full.tokens[kept] == tree.tokens).all() & (full.parents[kept] == mapped_parent).all()
    if first_failure([~same], ["x"]):
        return "kept: the verified tree's tokens or parents differ from the unpruned nodes `kept` names"
    return None


def verdict_problem(verdict: object, tree: DraftTree, *, vocab: int) -> str | None:
    """`Verifier.verify`: a root-first path down the tree's edges, its length, a bonus token."""
    if not isinstance(verdict, Verdict):
        return f"verify returned {describe(verdict)}, expected a Verdict"
    device = tree.device
    problem = tensor_problem("verdict.path", verdict.path, ndim=1, floating=False, device=device)
    for name in ("length", "bonus"):
        value = getattr(verdict, name)
        problem = problem or tensor_problem(f"verdict.{name}", value, ndim=0, floating=False)
        if not problem and value.device not in (device, torch.device("cpu")):
            where = "cpu" if device.type == "cpu" else f"{device} or cpu"
            problem = f"verdict.{name}: expected a tensor on {where}, got one on {value.device}"
    if problem:
        return problem
    length, bonus = int(verdict.length), int(verdict.bonus)
    if not 1 <= length <= min(tree.n_nodes, verdict.path.shape[0]):
        return f"verdict.length {length}: expected 1 <= length <= {tree.n_nodes}"
    if not 0 <= bonus < vocab:
        return f"verdict.bonus {bonus}: outside the target's vocabulary [0, {vocab})"
    path = verdict.path[:length]
    if int(path[0]) != 0 or ((path < 0) | (path >= tree.n_nodes)).any():
        return f"verdict.path {path.tolist()}: expected node indices of the tree, from the root 0"
    if length > 1 and not bool((tree.parents[path[1:]] == path[:-1]).all()):
        return f"verdict.path {path.tolist()}: not a path down the tree (each node's parent first)"
    return None


def peek_problem(peek: object, *, vocab: int) -> str | None:
    """`Drafter.peek`: None, or a `Peek` whose `expected` is a finite number >= 0, `first` a
    probability in [0, 1] and `chain` None or a tuple of token ids in `[0, vocab)` (host values,
    read for free)."""
    if peek is None:
        return None
    if not isinstance(peek, Peek):
        return f"peek returned {describe(peek)}, expected a Peek or None"
    if not _real(peek.expected) or not 0 <= peek.expected < math.inf:
        return f"peek.expected {shown(peek.expected)}: expected a finite number >= 0"
    if not _real(peek.first) or not 0 <= peek.first <= 1:
        return f"peek.first {shown(peek.first)}: expected a probability in [0, 1]"
    chain = peek.chain
    if chain is not None and not (
        isinstance(chain, tuple) and all(_int(t) and 0 <= t < vocab for t in chain)
    ):
        return (
            f"peek.chain {shown(chain)}: expected None or a tuple of token ids of the target's "
            f"vocabulary [0, {vocab})"
        )
    return None


def _real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
