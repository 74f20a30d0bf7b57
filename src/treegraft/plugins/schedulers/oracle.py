"""The oracle scheduler: replays, step by step, the best schedule found by the value system.

Under greedy decoding the value system (`treegraft scheduler collect`) builds the tree of every
schedule at every step and knows which one commits the most tokens per modelled second; it writes
those per-step best schedules to `plans.json` beside the dataset. This scheduler follows them:
it is the per-step upper bound that any online scheduler (which cannot see the continuation) is
measured against.

Limits, by construction:

- It only reproduces the oracle on the prompts, pipeline and decoding length that were collected,
  generated in the collected order (greedy: the trajectory then repeats exactly). Generation `i`
  follows the next trajectory whose prompt length matches; every step checks the committed
  length against the record and raises `OracleMismatch` on any divergence.
- It is an evaluation device (replay mode, reports), not a way to decode new prompts.

`plans.json` format (`treegraft-oracle-plans/1`)::

    {"format": "treegraft-oracle-plans/1",
     "trajectories": [{"prompt_id": str, "prompt_len": int,
                       "steps": [{"committed_len": int, "plan": [int, ...]}, ...]}, ...]}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from treegraft.core.config import ConfigError, field
from treegraft.core.interfaces import LayerState, Scheduler
from treegraft.core.resources import Resources

PLANS_FORMAT = "treegraft-oracle-plans/1"
PLANS_FILE = "plans.json"


class OracleMismatch(RuntimeError):
    """A generation left the trajectory the oracle's plans were collected on."""


@attrs.frozen
class OracleStep:
    """One step of a collected trajectory: the committed length before it and its best plan."""

    committed_len: int
    plan: tuple[int, ...]


@attrs.frozen
class Trajectory:
    """The best plan of every step of one collected generation."""

    prompt_id: str
    prompt_len: int
    steps: tuple[OracleStep, ...]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Trajectory:
        steps = tuple(OracleStep(int(s["committed_len"]), tuple(s["plan"])) for s in raw["steps"])
        return cls(str(raw["prompt_id"]), int(raw["prompt_len"]), steps)

    def as_dict(self) -> dict[str, Any]:
        steps = [{"committed_len": s.committed_len, "plan": list(s.plan)} for s in self.steps]
        return {"prompt_id": self.prompt_id, "prompt_len": self.prompt_len, "steps": steps}


def write_plans(trajectories: Sequence[Trajectory], path: Path) -> Path:
    """Write `plans.json` (see the module docstring)."""
    data = {"format": PLANS_FORMAT, "trajectories": [t.as_dict() for t in trajectories]}
    path.write_text(json.dumps(data) + "\n")
    return path


def read_plans(ref: Path | str) -> tuple[Trajectory, ...]:
    """Trajectories from a `plans.json` file or a dataset directory holding one."""
    path = Path(ref).expanduser()
    path = path / PLANS_FILE if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(
            f"pipeline.scheduler.plans: {str(ref)!r} not found: expected a {PLANS_FILE} file or a "
            "dataset directory written by `treegraft scheduler collect`"
        )
    try:
        data = json.loads(path.read_text())
        if data.get("format") != PLANS_FORMAT:
            raise ValueError(f"expected format {PLANS_FORMAT!r}, got {data.get('format')!r}")
        return tuple(Trajectory.from_dict(t) for t in data["trajectories"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"pipeline.scheduler.plans: {path}: malformed ({exc})") from None


@attrs.frozen
class OracleConfig:
    """Hyper-parameters of the oracle scheduler."""

    plans: str = field(
        doc="plans.json (or its dataset directory) from `treegraft scheduler collect`"
    )


@attrs.define
class OracleScheduler(Scheduler):
    """Follows the collected per-step best schedules (an upper bound; see the module docstring)."""

    Config = OracleConfig
    config: OracleConfig
    trajectories: tuple[Trajectory, ...]
    current: int = -1
    step: int = -1
    #: `begin` was called and no decision taken since: the next one starts a generation
    starting: bool = False

    @classmethod
    def from_config(cls, config: OracleConfig, resources: Resources) -> OracleScheduler:
        return cls(config, read_plans(config.plans))

    @classmethod
    def from_trajectories(cls, trajectories: Sequence[Trajectory]) -> OracleScheduler:
        """An oracle over in-memory trajectories (no file)."""
        return cls(OracleConfig(plans="<memory>"), tuple(trajectories))

    def begin(self) -> None:
        self.starting = True

    def decide(self, state: LayerState) -> int:
        if state.layer == 0:
            self._advance(state)
        plan = self.trajectories[self.current].steps[self.step].plan
        return plan[state.layer] if state.layer < len(plan) else 0

    def _advance(self, state: LayerState) -> None:
        """Move to the next step, or to the next matching trajectory at a generation's start."""
        if self.starting:
            self.current, self.step = self._next_trajectory(state.prompt_len), 0
            self.starting = False
        else:
            self.step += 1
        traj = self.trajectories[self.current] if self.current >= 0 else None
        # the collected steps that asked no scheduler (silent steps' chains) are passed over
        while (
            traj is not None
            and self.step + 1 < len(traj.steps)
            and traj.steps[self.step].committed_len < state.committed_len
        ):
            self.step += 1
        if traj is None or self.step >= len(traj.steps):
            raise OracleMismatch(
                f"the oracle's plans hold no step {self.step} for this generation; decode at "
                "most the collected number of tokens, on the collected prompts"
            )
        want = traj.steps[self.step].committed_len
        if want != state.committed_len:
            raise OracleMismatch(
                f"trajectory {traj.prompt_id!r}, step {self.step}: committed length "
                f"{state.committed_len} but the plans were collected at {want}; the oracle needs "
                "the collected prompts, pipeline and greedy decoding, in the collected order"
            )

    def _next_trajectory(self, prompt_len: int) -> int:
        n = len(self.trajectories)
        for k in range(1, n + 1):
            i = (self.current + k) % n
            if self.trajectories[i].prompt_len == prompt_len:
                return i
        raise OracleMismatch(f"no collected trajectory has a prompt of {prompt_len} tokens")
