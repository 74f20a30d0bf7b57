"""The draft tree: a flat, tensor-backed tree stored as a parent array.

Node 0 is the **root**: the last committed token, whose key/value entries are not yet in the
target's cache. Every other node is a draft token. Nodes are stored parents-first
(`parents[i] < i`), so any prefix of the node list is itself a tree, and no two children of one
parent carry the same token.

Every tensor is one-dimensional with one entry per node (`[n]`); the tree is immutable, and each
growing operation returns a new tree plus the indices of the nodes it touched.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.errors import ArgumentError
from treegraft.core.tree_checks import (
    check_count,
    check_k,
    check_keep,
    check_parent_array,
    check_proposal,
    first_occurrence,
    node_index,
    root_token,
)
from treegraft.kernels import ancestor_mask, tree_depth
from treegraft.kernels._checks import INDEX_DTYPES, float_vector, index_vector, same_device
from treegraft.kernels.host_tensor import host_tensor

#: Drafter index stored for the root (it was committed, nobody proposed it).
NO_DRAFTER = -1


@attrs.frozen(eq=False)
class Proposal:
    """Chains of draft tokens a drafter wants to hang under existing tree nodes.

    Row `r` is a chain: `tokens[r, 0]` is a child of node `parents[r]`, `tokens[r, t]` is a child
    of `tokens[r, t - 1]`. Rows end early with `-1` padding. A language-model drafter proposes
    chains of length 1; the n-gram drafter proposes longer ones.
    """

    parents: Tensor  # [m] int64, existing tree nodes
    tokens: Tensor  # [m, c] int64, -1 = padding
    logp: Tensor  # [m, c] float, edge log-probs log q(token | path to its parent)

    @classmethod
    def empty(
        cls, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> Proposal:
        """A proposal with no rows."""
        return cls(
            parents=torch.zeros(0, dtype=torch.long, device=device),
            tokens=torch.zeros(0, 1, dtype=torch.long, device=device),
            logp=torch.zeros(0, 1, dtype=dtype, device=device),
        )

    @property
    def n_rows(self) -> int:
        return int(self.parents.shape[0])


class HostTree(NamedTuple):
    """A tree's per-node lists on the host (`DraftTree.host`); shared, never to be changed."""

    tokens: list[int]
    parents: list[int]
    depth: list[int]
    score: list[float]


@attrs.frozen(eq=False)
class DraftTree:
    """A draft tree as flat tensors (one entry per node, root first, parents before children).

    Attributes:
        tokens: `[n]` int64 token ids; `tokens[0]` is the root (last committed token).
        parents: `[n]` int64; `parents[0] == -1`, `parents[i] < i`.
        depth: `[n]` int64; root depth 0.
        edge_logp: `[n]` float, `log q(token | path to parent)` from the drafter that scored the
            node last (0 for the root).
        score: `[n]` float, cumulative path log-prob; never increases from parent to child.
        proposer: `[n]` int64, index of the drafter that proposed the node (-1 for the root).
        scorer: `[n]` int64, index of the drafter that scored the node last (-1 for the root).
    """

    tokens: Tensor
    parents: Tensor
    depth: Tensor
    edge_logp: Tensor
    score: Tensor
    proposer: Tensor
    scorer: Tensor
    # the host lists of `host()`, filled on first use (or by `extend_host`, which has them)
    _host: HostTree | None = attrs.field(default=None, init=False, repr=False)

    @classmethod
    def from_root(
        cls,
        token: int | Tensor,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> DraftTree:
        """A tree holding only the root `token` (an int >= 0, or a one-element integer tensor),
        its scores in the floating `dtype`."""
        root = root_token(token, dtype)
        if torch.device(device).type == "cpu" and dtype in _NUMPY_REALS:
            return cls._root_host(token if root is None else root, _NUMPY_REALS[dtype])
        tok = torch.as_tensor(token, dtype=torch.long, device=device).reshape(1)
        zeros_f = torch.zeros(1, dtype=dtype, device=device)
        return cls(
            tokens=tok,
            parents=torch.full((1,), -1, dtype=torch.long, device=device),
            depth=torch.zeros(1, dtype=torch.long, device=device),
            edge_logp=zeros_f,
            score=zeros_f.clone(),
            proposer=torch.full((1,), NO_DRAFTER, dtype=torch.long, device=device),
            scorer=torch.full((1,), NO_DRAFTER, dtype=torch.long, device=device),
        )

    @classmethod
    def _root_host(cls, token: int | Tensor, real: type) -> DraftTree:
        """`from_root` on the CPU from numpy arrays (a fraction of seven torch constructors),
        with its host lists."""
        root = int(token)
        ints = np.array([[root], [-1], [0], [NO_DRAFTER], [NO_DRAFTER]], dtype=np.int64)
        tokens, parents, depth, proposer, scorer = (torch.from_numpy(row) for row in ints)
        edge_logp, score = (torch.from_numpy(row) for row in np.zeros((2, 1), dtype=real))
        out = cls(tokens, parents, depth, edge_logp, score, proposer, scorer)
        object.__setattr__(out, "_host", HostTree([root], [-1], [0], [0.0]))
        return out

    @classmethod
    def from_parents(
        cls,
        tokens: Tensor,
        parents: Tensor,
        *,
        edge_logp: Tensor | None = None,
        proposer: Tensor | None = None,
    ) -> DraftTree:
        """Build a tree from raw arrays, validating the parents-first and unique-sibling rules
        (`ArgumentError` naming the argument otherwise; tensors on the meta device have no
        values to check). Integer arrays of any width are taken as int64."""
        op = "DraftTree.from_parents"
        tokens, parents = index_vector(op, "tokens", tokens), index_vector(op, "parents", parents)
        check_parent_array(tokens, parents)
        n = tokens.shape[0]
        if edge_logp is None:
            edge_logp = torch.zeros(n, dtype=torch.float32, device=tokens.device)
        edge_logp = float_vector(op, "edge_logp", edge_logp, n).clone()
        edge_logp[0] = 0
        anc = ancestor_mask(parents)
        # [n] path sums; a select, not a product: 0 * -inf (a dead edge) or 0 * NaN is NaN
        score = torch.where(anc, edge_logp[None, :], 0).sum(-1)
        if proposer is not None:
            proposer = index_vector(op, "proposer", proposer, n)
        else:
            proposer = torch.zeros_like(tokens)
            proposer[0] = NO_DRAFTER
        return cls(
            tokens=tokens,
            parents=parents,
            depth=tree_depth(parents),
            edge_logp=edge_logp,
            score=score,
            proposer=proposer,
            scorer=proposer.clone(),
        )

    # ------------------------------------------------------------------ views

    @property
    def n_nodes(self) -> int:
        """Number of nodes, root included (known on the host without a device sync; from the
        host lists where the tree has them: read several times per step, a tensor's shape costs
        more)."""
        host = self._host
        return len(host.tokens) if host is not None else int(self.tokens.shape[0])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def on_host(self) -> bool:
        """True for CPU trees whose scores numpy holds (not bfloat16): `extend` and `select` run
        on the host for them, with torch ops otherwise."""
        floats = (self.score.dtype, self.edge_logp.dtype)
        return self.device.type == "cpu" and all(f in _NUMPY_REALS for f in floats)

    def host(self) -> HostTree:
        """`tokens`, `parents`, `depth` and `score` as Python lists, read once per tree.

        CPU bookkeeping (the n-gram drafter, `extend`, `best`, the builder's layer statistics)
        reads them several times per layer; the tree is immutable, so the first read is kept.
        The lists are shared: read them, never change them. Reads the device on GPU trees.
        """
        if self._host is None:
            lists = HostTree(
                self.tokens.tolist(),
                self.parents.tolist(),
                self.depth.tolist(),
                self.score.tolist(),
            )
            object.__setattr__(self, "_host", lists)
            return lists
        return self._host

    def ancestor_mask(self) -> Tensor:
        """`[n, n]` bool: `mask[i, j]` iff node j is node i or one of its ancestors."""
        return ancestor_mask(self.parents)

    def positions(self, root_position: int) -> Tensor:
        """`[n]` int64 sequence positions: the root sits at `root_position` (an int >= 0), a node
        at root + depth."""
        check_count("DraftTree.positions", "root_position", root_position)
        return self.depth + root_position

    def is_leaf(self) -> Tensor:
        """`[n]` bool, True for nodes without children."""
        leaf = torch.ones(self.n_nodes, dtype=torch.bool, device=self.device)
        leaf[self.parents[1:]] = False
        return leaf

    def paths(self) -> Tensor:
        """Root-to-leaf paths, `[n_leaves, max_depth + 1]` int64 node indices padded with -1."""
        leaves = torch.nonzero(self.is_leaf()).flatten()  # [L]
        anc = self.ancestor_mask()[leaves]  # [L, n]
        width = int(self.depth.max()) + 1 if self.n_nodes else 1
        out = torch.full((leaves.shape[0], width), -1, dtype=torch.long, device=self.device)
        rows, cols = torch.nonzero(anc, as_tuple=True)
        out[rows, self.depth[cols]] = cols
        return out

    def path_to(self, node: int) -> Tensor:
        """Node indices from the root to `node`, `[depth(node) + 1]` int64."""
        node = node_index("DraftTree.path_to", "node", node, self.n_nodes)
        anc = self.ancestor_mask()[node]
        nodes = torch.nonzero(anc).flatten()
        return nodes[torch.argsort(self.depth[nodes])]

    # ------------------------------------------------------------------ growth

    def extend(self, proposal: Proposal, drafter: int) -> tuple[DraftTree, Tensor]:
        """Hang the proposal's chains under their parents, merging duplicates.

        A proposed token that already exists as a child of the same parent (or that an earlier row
        of the same proposal already added) is not added again: its existing node is reused and
        keeps its score. New nodes are numbered column by column, rows in order. Returns the new
        tree and `[m, c]` int64 node indices for every proposal entry (-1 where the row was padded
        or its parent was). On CPU it runs on the host (`extend_host`: one dictionary lookup per
        entry where the tensor version costs some twenty small torch ops per column); elsewhere
        on the device (`extend_on_device`); both give identical trees.
        """
        check_count("DraftTree.extend", "drafter", drafter)
        if getattr(getattr(proposal, "tokens", None), "dtype", None) not in INDEX_DTYPES:
            check_proposal(proposal, self.n_nodes, Proposal)  # raises (bool ids were taken as 0, 1)
        try:
            if self.on_host():
                return extend_host(self, proposal, drafter)
            return self.extend_on_device(proposal, drafter)
        except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):
            check_proposal(proposal, self.n_nodes, Proposal)  # an ArgumentError naming the field
            raise

    def extend_on_device(self, proposal: Proposal, drafter: int) -> tuple[DraftTree, Tensor]:
        """`extend` with torch ops on the tree's device (one pass per proposal column)."""
        tree = self
        m, c = proposal.tokens.shape
        node_of = torch.full((m, c), -1, dtype=torch.long, device=self.device)
        if m == 0:
            return tree, node_of
        parent = proposal.parents
        for col in range(c):
            tok = proposal.tokens[:, col]
            live = (tok >= 0) & (parent >= 0)
            tree, idx = tree._add_level(parent, tok, proposal.logp[:, col], live, drafter)
            node_of[:, col] = idx
            parent = idx
        return tree, node_of

    def _add_level(
        self, parent: Tensor, tok: Tensor, logp: Tensor, live: Tensor, drafter: int
    ) -> tuple[DraftTree, Tensor]:
        """Add one child per live row (deduplicated); return `[m]` node indices (-1 if not live)."""
        n = self.n_nodes
        existing = _find_children(self, parent, tok) & live[:, None]  # [m, n]
        has_existing = existing.any(-1)
        existing_idx = torch.where(has_existing, existing.long().argmax(-1), -1)
        fresh = live & ~has_existing
        first = first_occurrence(parent, tok, fresh)  # [m] row index of the first equal fresh row
        is_new = fresh & (first == torch.arange(parent.shape[0], device=self.device))
        new_rows = torch.nonzero(is_new).flatten()
        new_index = torch.full_like(parent, -1)
        new_index[new_rows] = torch.arange(n, n + new_rows.shape[0], device=self.device)
        idx = torch.where(has_existing, existing_idx, torch.where(fresh, new_index[first], -1))
        grown = self._append(parent[new_rows], tok[new_rows], logp[new_rows], drafter)
        return grown, idx

    def _append(self, parent: Tensor, tok: Tensor, logp: Tensor, drafter: int) -> DraftTree:
        """Append nodes whose parents already exist (no deduplication)."""
        logp = logp.to(self.score.dtype)
        who = torch.full_like(tok, drafter)
        return attrs.evolve(
            self,
            tokens=torch.cat([self.tokens, tok]),
            parents=torch.cat([self.parents, parent]),
            depth=torch.cat([self.depth, self.depth[parent] + 1]),
            edge_logp=torch.cat([self.edge_logp, logp]),
            score=torch.cat([self.score, self.score[parent] + logp]),
            proposer=torch.cat([self.proposer, who]),
            scorer=torch.cat([self.scorer, who]),
        )

    def best(self, nodes: Tensor, k: int) -> Tensor:
        """The best `k` live nodes among `nodes` by score (ties: shallower, then older), ascending.

        Nodes with score -inf are dead (logically deleted) and never chosen; entries < 0 are
        ignored. On CPU it runs on the host (`best_host`, a Python sort of the candidates: a few
        microseconds where a dozen small torch ops cost over a hundred, several times per
        layer); elsewhere on the device.
        """
        check_k("DraftTree.best", k)
        nodes = index_vector("DraftTree.best", "nodes", nodes)
        if self.device.type == "cpu":
            cand = sorted({i for i in nodes.tolist() if i >= 0})
            if cand and cand[-1] >= self.n_nodes:
                node_index("DraftTree.best", "nodes", cand[-1], self.n_nodes)  # raises
            host = self.host()
            return host_tensor(best_host(host.score, host.depth, cand, k))
        return self.best_on_device(nodes, k)

    def best_near(self, frontier: Tensor, lookback: int, k: int) -> Tensor:
        """The best `k` live nodes (as `best`) at depths `[d - lookback, d]`, `d` the deepest
        frontier node's depth (the tree's deepest when the frontier is empty), ascending.
        Frontier entries < 0 are ignored, as in `best`."""
        op = "DraftTree.best_near"
        check_k(op, k)
        check_count(op, "lookback", lookback)
        frontier = index_vector(op, "frontier", frontier)
        if self.device.type == "cpu":
            host = self.host()
            depth, front = host.depth, [i for i in frontier.tolist() if i >= 0]
            if front and max(front) >= len(depth):
                node_index(op, "frontier", max(front), len(depth), "holds")  # raises
            d = max(depth[i] for i in front) if front else max(depth)
            window = [i for i, x in enumerate(depth) if d - lookback <= x <= d]
            return host_tensor(best_host(host.score, depth, window, k))
        return self.best_near_on_device(frontier, lookback, k)

    def best_near_on_device(self, frontier: Tensor, lookback: int, k: int) -> Tensor:
        """`best_near` with torch ops on the tree's device."""
        if frontier.numel():  # entries < 0 ignored; none left: the tree's deepest
            front = torch.where(frontier >= 0, self.depth[frontier.clamp(min=0)], -1).max()
            d = torch.where(front >= 0, front, self.depth.max())
        else:
            d = self.depth.max()
        window = (self.depth >= d - lookback) & (self.depth <= d)
        return self.best_on_device(torch.nonzero(window).flatten(), k)

    def best_on_device(self, nodes: Tensor, k: int) -> Tensor:
        """`best` with torch ops on the tree's device (any device; `best` uses it off the CPU)."""
        nodes = torch.unique(nodes[nodes >= 0])
        nodes = nodes[torch.isfinite(self.score[nodes])]
        if nodes.numel() <= k:
            return nodes
        # lexicographic (score desc, depth asc, index asc): stable sorts, least significant first
        order = torch.argsort(self.depth[nodes], stable=True)
        order = order[torch.argsort(self.score[nodes][order], descending=True, stable=True)]
        return torch.sort(nodes[order[:k]]).values

    def with_scores(self, edge_logp: Tensor, score: Tensor, scorer: Tensor) -> DraftTree:
        """The same nodes with new edge log-probs, scores and scorer ids (all `[n]`; an
        `ArgumentError` naming the one of another shape or kind)."""
        op, n = "DraftTree.with_scores", self.n_nodes
        edge_logp, score = (
            float_vector(op, "edge_logp", edge_logp, n),
            float_vector(op, "score", score, n),
        )
        scorer = index_vector(op, "scorer", scorer, n)
        same_device(op, tokens=self.tokens, edge_logp=edge_logp, score=score, scorer=scorer)
        return attrs.evolve(self, edge_logp=edge_logp, score=score, scorer=scorer)

    def select(self, keep: Tensor) -> DraftTree:
        """The subtree of the nodes `keep` (`[m]` ascending, ancestor-closed, containing the root).

        On CPU trees `keep` is checked (`ArgumentError` naming the first node out of place);
        elsewhere it is taken as given (a check would read the device)."""
        keep = index_vector("DraftTree.select", "keep", keep)
        if self.on_host():  # numpy indexing: a fraction of torch's per-call cost
            k = keep.numpy()
            check_keep(k, self.n_nodes)
            remap = np.full(self.n_nodes, -1, dtype=np.int64)
            remap[k] = np.arange(k.shape[0])
            parents = self.parents.numpy()[k]
            new_parents = np.where(parents >= 0, remap[np.maximum(parents, 0)], -1)
            if (new_parents[1:] < 0).any():
                i = int(np.flatnonzero(new_parents[1:] < 0)[0]) + 1
                raise ArgumentError(
                    f"DraftTree.select: keep holds node {int(k[i])} but not its parent "
                    f"{int(parents[i])}; expected an ancestor-closed set of nodes"
                )
            return DraftTree(
                parents=torch.from_numpy(new_parents),
                **{f: torch.from_numpy(getattr(self, f).numpy()[k]) for f in _NODE_FIELDS},
            )
        return self.select_on_device(keep)

    def select_on_device(self, keep: Tensor) -> DraftTree:
        """`select` with torch ops on the tree's device."""
        remap = torch.full((self.n_nodes,), -1, dtype=torch.long, device=self.device)
        remap[keep] = torch.arange(keep.shape[0], device=self.device)
        parents = self.parents[keep]
        new_parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], -1)
        return DraftTree(parents=new_parents, **{f: getattr(self, f)[keep] for f in _NODE_FIELDS})


#: torch float dtypes numpy holds (`from_root` builds CPU roots from numpy)
_NUMPY_REALS = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}

#: the per-node fields `select` takes as they are (parents are renumbered)
_NODE_FIELDS = ("tokens", "depth", "edge_logp", "score", "proposer", "scorer")


def _find_children(tree: DraftTree, parent: Tensor, tok: Tensor) -> Tensor:
    """`[m, n]` bool: node j is a child of `parent[r]` carrying token `tok[r]`."""
    return (tree.parents[None, :] == parent[:, None]) & (tree.tokens[None, :] == tok[:, None])


def best_host(score: list[float], depth: list[int], nodes: list[int], k: int) -> list[int]:
    """`DraftTree.best` on the host: the best `k` live entries of `nodes` (distinct indices into
    the per-node `score` and `depth` lists) by score, ties to the shallower, then the older node;
    ascending. A Python sort of the few dozen candidates costs less than any array call."""
    live = [i for i in nodes if math.isfinite(score[i])]
    if len(live) > k:
        live = sorted(live, key=lambda i: (-score[i], depth[i], i))[:k]
    return sorted(live)


def extend_host(tree: DraftTree, proposal: Proposal, drafter: int) -> tuple[DraftTree, Tensor]:
    """`DraftTree.extend` for CPU trees, in Python and numpy: the children of every node sit in a
    dictionary keyed by (parent, token), the proposal is walked column by column, rows in order,
    and the new nodes are appended with one concatenation per field. A new node's score is its
    parent's plus its edge log-prob, added in the score's dtype as the tensor version adds it."""
    m, c = proposal.tokens.shape
    if m == 0:
        return tree, torch.from_numpy(np.full((m, c), -1, dtype=np.int64))
    score_np = tree.score.numpy()
    real = score_np.dtype.type  # float32 + float32 rounds as torch's float32 add does
    toks = proposal.tokens.tolist()
    logps = proposal.logp.detach().to(tree.score.dtype).numpy().tolist()  # bfloat16: no numpy
    parent_of_row = proposal.parents.tolist()
    n = tree.n_nodes
    if (
        len(parent_of_row) != m
        or max(parent_of_row, default=-1) >= n
        or proposal.logp.shape != proposal.tokens.shape
        or proposal.tokens.dtype.is_floating_point
    ):
        check_proposal(proposal, n, Proposal)  # raises
    host = tree.host()
    child = dict(zip(zip(host.parents, host.tokens, strict=True), range(n), strict=True))
    depth, score = list(host.depth), list(host.score)  # copies: the new tree's lists
    new_parent: list[int] = []
    new_tok: list[int] = []
    new_logp: list[float] = []
    node_of = [[-1] * c for _ in range(m)]  # lists: numpy's item assignment costs more
    for col in range(c):
        for r in range(m):
            parent, tok = parent_of_row[r], toks[r][col]
            if parent < 0 or tok < 0:
                parent_of_row[r] = -1
                continue
            node = child.get((parent, tok))
            if node is None:
                node = n + len(new_parent)
                child[(parent, tok)] = node
                new_parent.append(parent)
                new_tok.append(tok)
                new_logp.append(logps[r][col])
                depth.append(depth[parent] + 1)
                score.append(float(real(score[parent]) + real(logps[r][col])))
            node_of[r][col] = node
            parent_of_row[r] = node
    nodes = host_tensor(node_of)
    if not new_parent:
        return tree, nodes
    k = len(new_parent)
    real_dtype = score_np.dtype
    who = np.full(k, drafter, dtype=np.int64)

    def grown(field: str, new: Any, dtype: Any) -> Tensor:  # numpy: a fraction of torch.cat's cost
        old = getattr(tree, field).numpy()
        return torch.from_numpy(np.concatenate([old, np.asarray(new, dtype=dtype)]))

    out = DraftTree(
        tokens=grown("tokens", new_tok, np.int64),
        parents=grown("parents", new_parent, np.int64),
        depth=torch.from_numpy(np.asarray(depth, dtype=np.int64)),
        edge_logp=grown("edge_logp", new_logp, real_dtype),
        score=torch.from_numpy(np.asarray(score, dtype=real_dtype)),
        proposer=grown("proposer", who, np.int64),
        scorer=grown("scorer", who, np.int64),
    )
    # the new tree's host lists are at hand (each score was rounded to the score dtype above)
    lists = HostTree(host.tokens + new_tok, host.parents + new_parent, depth, score)
    object.__setattr__(out, "_host", lists)
    return out, nodes
