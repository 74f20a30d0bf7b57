"""The step-cost model of the scheduler's value system.

`CostModel` turns a built tree into modelled seconds of one decoding step from latency curves and
constants measured on this machine (see `treegraft.bench.value_eval.measure_costs`);
`QueryCounter` counts the tokens a strong drafter forwards while a tree is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from treegraft.bench.replay import LatencyCurve


@attrs.frozen
class CostModel:
    """Modelled seconds of one decoding step, from curves and constants measured on a machine.

    Attributes:
        target: seconds of one target forward vs tokens in it (pending tokens + tree nodes).
        strong: seconds of one strong-drafter forward vs tokens in it.
        weak_layer_s: seconds of one weak (n-gram) layer.
        strong_extra_s: seconds of one strong call besides its forward (rescore, graft).
        step_overhead_s: seconds of a step outside the models (glue, verify, commit).
    """

    target: LatencyCurve
    strong: LatencyCurve
    weak_layer_s: float = 0.0
    strong_extra_s: float = 0.0
    step_overhead_s: float = 0.0

    def step_seconds(
        self,
        *,
        target_queries: int,
        strong_queries: Sequence[int],
        strong_calls: int,
        weak_layers: int,
    ) -> float:
        """Modelled seconds of a step with these forwards and layers."""
        return (
            self.target(target_queries)
            + sum(self.strong(q) for q in strong_queries)
            + strong_calls * self.strong_extra_s
            + weak_layers * self.weak_layer_s
            + self.step_overhead_s
        )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CostModel:
        def curve(c: Mapping[str, Any]) -> LatencyCurve:
            return LatencyCurve(c["model"], c["context"], tuple(c["queries"]), tuple(c["seconds"]))

        scalars = {k: float(v) for k, v in raw.items() if k not in ("target", "strong")}
        return cls(target=curve(raw["target"]), strong=curve(raw["strong"]), **scalars)


@attrs.define
class QueryCounter:
    """Records the number of tokens of every forward of one model (a forward pre-hook)."""

    module: Any
    queries: list[int] = attrs.field(factory=list)
    _handle: Any = None

    def __enter__(self) -> QueryCounter:
        self._handle = self.module.register_forward_pre_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _record(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.queries.append(int(ids.shape[-1]))

    def take(self) -> tuple[int, ...]:
        """The forwards recorded since the last `take`."""
        out, self.queries = tuple(self.queries), []
        return out
