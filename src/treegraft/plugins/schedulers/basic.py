"""Fixed schedulers: never call a stronger drafter, always call the strongest, or at fixed layers."""

from __future__ import annotations

import attrs

from treegraft.core.config import NoConfig, at_least, each, field
from treegraft.core.interfaces import LayerState, Scheduler, check_drafter_index


@attrs.define
class NeverScheduler(Scheduler):
    """The cheapest drafter (index 0) grows every layer: the weak-only endpoint."""

    Config = NoConfig
    config: NoConfig

    def decide(self, state: LayerState) -> int:
        return 0

    def done_for_step(self) -> bool:
        """Every layer goes to the cheapest drafter: the builder asks at a step's first layer
        only and skips the later layers' statistics."""
        return True


@attrs.define
class AlwaysScheduler(Scheduler):
    """The strongest drafter (the last one) acts at every layer: the strong-every-layer endpoint."""

    Config = NoConfig
    config: NoConfig

    def decide(self, state: LayerState) -> int:
        return state.n_drafters - 1


@attrs.frozen
class LayersConfig:
    """Hyper-parameters of the fixed-layers scheduler."""

    layers: list[int] = field(
        check=each(at_least(0)), doc="0-based layers at which the strong drafter acts"
    )
    drafter: int = field(-1, doc="drafter index that acts at those layers (-1: the strongest)")

    def __attrs_post_init__(self) -> None:
        if not self.layers:  # the drafter would never act
            raise ValueError(
                "layers: expected at least one layer, got []; for the cheapest drafter alone "
                "write scheduler: never"
            )


@attrs.define
class LayersScheduler(Scheduler):
    """A stronger drafter acts at a fixed list of layers; the cheapest one elsewhere."""

    Config = LayersConfig
    config: LayersConfig

    def decide(self, state: LayerState) -> int:
        if state.layer not in self.config.layers:
            return 0
        return self.config.drafter % state.n_drafters

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        check_drafter_index(self.config.drafter, n_drafters, stronger=True)
        past = [layer for layer in self.config.layers if depth is not None and layer >= depth]
        if past:
            raise ValueError(
                f"layers: {past[0]} is past the builder's depth {depth} (layers 0 .. "
                f"{depth - 1}): the drafter would never act there"
            )
