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
from treegraft.core.errors import TreegraftError, shown
from treegraft.core.interfaces import LayerState, Scheduler
from treegraft.core.resources import Resources

PLANS_FORMAT = "treegraft-oracle-plans/1"
PLANS_FILE = "plans.json"


class OracleMismatch(TreegraftError, RuntimeError):
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
        """A trajectory from its `plans.json` form; ValueError naming the first bad entry."""
        if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list):
            raise ValueError(f"expected an object with a 'steps' list, got {shown(raw)}")
        prompt_len = count(raw.get("prompt_len"), "prompt_len", 1)
        steps = []
        for i, s in enumerate(raw["steps"]):
            if not isinstance(s, dict) or not isinstance(s.get("plan"), list):
                raise ValueError(
                    f"steps[{i}]: expected an object with a 'plan' list, got {shown(s)}"
                )
            committed = count(s.get("committed_len"), f"steps[{i}].committed_len", prompt_len)
            plan = tuple(count(d, f"steps[{i}].plan", 0) for d in s["plan"])
            steps.append(OracleStep(committed, plan))
        return cls(str(raw.get("prompt_id", "")), prompt_len, tuple(steps))

    def as_dict(self) -> dict[str, Any]:
        steps = [{"committed_len": s.committed_len, "plan": list(s.plan)} for s in self.steps]
        return {"prompt_id": self.prompt_id, "prompt_len": self.prompt_len, "steps": steps}


def count(value: Any, key: str, low: int) -> int:
    """`value` if it is an int >= `low` (not a bool, a float or text), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}: expected int >= {low}, got {shown(value)}")
    return value


def write_plans(trajectories: Sequence[Trajectory], path: Path) -> Path:
    """Write `plans.json` (see the module docstring)."""
    data = {"format": PLANS_FORMAT, "trajectories": [t.as_dict() for t in trajectories]}
    path.write_text(json.dumps(data) + "\n")
    return path


def read_plans(ref: Path | str) -> tuple[Trajectory, ...]:
    """Trajectories from a `plans.json` file or a dataset directory holding one."""
    path = Path(ref).expanduser()
    path = path / PLANS_FILE if path.is_dir() else path
    if not str(ref).strip() or not path.is_file():  # Path('') is the working directory
        raise ConfigError(
            f"pipeline.scheduler.plans: {str(ref)!r} not found: expected a {PLANS_FILE} file or a "
            "dataset directory written by `treegraft scheduler collect`"
        )
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != PLANS_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"expected format {PLANS_FORMAT!r}, got {got!r}")
        trajectories = data.get("trajectories")
        if not isinstance(trajectories, list) or not trajectories:
            raise ValueError(
                f"'trajectories': expected a non-empty list, got {shown(trajectories)}"
            )
        out = []
        for i, t in enumerate(trajectories):
            try:
                out.append(Trajectory.from_dict(t))
            except ValueError as exc:
                raise ValueError(f"trajectories[{i}]: {exc}") from None
        return tuple(out)
    except (ValueError, OSError) as exc:  # JSON and UTF-8 errors are ValueErrors
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

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        """Every drafter index of the plans names one of this pipeline's drafters."""
        for traj in self.trajectories:
            for i, step in enumerate(traj.steps):
                if any(who >= n_drafters for who in step.plan):
                    raise ValueError(
                        f"plans: trajectory {traj.prompt_id!r}, step {i} names drafter "
                        f"{max(step.plan)} but the pipeline has {n_drafters} drafters (indices "
                        f"0 to {n_drafters - 1}): the plans were collected on another pipeline"
                    )

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
