"""Value objects returned by the kernels."""

from __future__ import annotations

import attrs
from torch import Tensor


@attrs.frozen
class GreedyAcceptance:
    """Outcome of greedy verification of a draft tree against the target's argmax tokens.

    Glossary (DESIGN.md §3): the *accepted path* starts at the root and follows, at each node, the
    child whose token equals the target's argmax there; the *bonus* token is the target's argmax
    after the last accepted node. All fields stay on the device (no host sync).

    Attributes:
        path: [n] int64 node indices of the accepted path in depth order (``path[0] == 0``),
            padded with -1 after its end.
        length: [] int64 number of nodes on the path, root included (>= 1).
        bonus: [] int64 token the target emits after the last accepted node.
    """

    path: Tensor
    length: Tensor
    bonus: Tensor
