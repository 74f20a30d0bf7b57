"""What the harness records per request, and how a record is written to and read from JSONL."""

from __future__ import annotations

import math
from typing import Any

import attrs

MEASURED = "measured"
REPLAY = "replay"

#: The four parts of a request's wall time.
SPLIT_KEYS = ("target", "strong", "weak", "framework")


@attrs.frozen
class Mismatch:
    """Where a method's output first differs from plain decoding of the same prompt.

    Attributes:
        position: 0-based index into the generated tokens.
        expected: plain decoding's token there (-1 where plain decoding had already ended).
        got: the method's token there (-1 where the method had already ended).
        margin: the target's top-1 minus top-2 logit at that position, from one forward on the
            plain-decoding prefix (a small margin means a near-tie: precision, not a bug).
    """

    position: int
    expected: int
    got: int
    margin: float | None


@attrs.frozen
class Request:
    """One prompt decoded by one method (Spec-Bench style, per-step detail included).

    Attributes:
        pair: label of the (target, drafter) pair.
        suite: the suite of the prompt.
        prompt_id: the prompt's id in its suite.
        method: `ar`, a baseline or a pipeline label.
        mode: `measured`, or `replay` (target forwards predicted, not run).
        repeat: 0-based repetition of the sweep.
        prompt_tokens: prompt length in tokens.
        new_tokens: tokens generated.
        wall_s: wall seconds from the first forward to the last token (predicted in replay).
        steps: target forwards.
        committed: tokens the target forwards committed, bonus tokens included (tau numerator;
            can exceed `new_tokens` when a stop cuts an accepted block).
        split: seconds of target forwards / strong drafter / weak drafter / framework overhead.
        peak_mem_mib: peak resident memory (CPU) or peak allocated CUDA memory during the request.
        output_ids: the generated tokens.
        accept_lengths: tokens committed per step, bonus included (empty for HF baselines).
        strong_calls: strong-drafter calls per step.
        step_times: per step, seconds per stage (`build`, `drafter<i>`, `target`, `verify`, `commit`).
        exact: output equal to plain decoding, token for token.
        mismatch: where it first differs (None when exact).
        error: why a replay could not follow the recorded continuation (None otherwise).
    """

    pair: str
    suite: str
    prompt_id: str
    method: str
    mode: str
    repeat: int
    prompt_tokens: int
    new_tokens: int
    wall_s: float
    steps: int
    committed: int
    split: dict[str, float]
    peak_mem_mib: float
    output_ids: tuple[int, ...]
    accept_lengths: tuple[int, ...] = ()
    strong_calls: tuple[int, ...] = ()
    step_times: tuple[dict[str, float], ...] = ()
    exact: bool = True
    mismatch: Mismatch | None = None
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward, bonus included."""
        return self.committed / self.steps if self.steps else 0.0

    @property
    def key(self) -> tuple[str, str, str, int]:
        """Which prompt of which pair and repetition (pairs a method with its AR run)."""
        return (self.pair, self.suite, self.prompt_id, self.repeat)


def request_to_json(request: Request, speedup: float | None = None) -> dict[str, Any]:
    """A JSON-ready dict with the derived `tokens_per_s`, `tau` and `speedup` added."""
    out = attrs.asdict(request)
    out.update(tokens_per_s=request.tokens_per_s, tau=request.tau, speedup=speedup)
    return out


def known_fields(cls: type, data: Any, what: str) -> dict[str, Any]:
    """The items of the JSON object `data` that are fields of the attrs class `cls` (others, such
    as derived keys or a later version's fields, are left out); a `ValueError` saying which
    field is missing, or that `data` is no object, where `cls` cannot be built from it."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} is a JSON {type(data).__name__}, expected an object")
    fields = attrs.fields(cls)
    missing = [f.name for f in fields if f.default is attrs.NOTHING and f.name not in data]
    if missing:
        raise ValueError(f"{what} without {', '.join(repr(m) for m in missing)}")
    names = {f.name for f in fields}
    return {k: v for k, v in data.items() if k in names}


def untimed(request: Request) -> str | None:
    """Why `request` (one without an error) has no tokens/s a speedup can be taken of: no
    token, or a wall time that is not a finite positive number (None: it has one). A sweep
    never records one; a hand-built or edited record may."""
    wall = request.wall_s
    if request.new_tokens >= 1 and isinstance(wall, (int, float)) and 0 < wall < math.inf:
        return None
    return (
        f"the request of pair {request.pair!r}, suite {request.suite!r}, prompt "
        f"{request.prompt_id!r}, method {request.method!r} ({request.mode}), repetition "
        f"{request.repeat} has new_tokens {request.new_tokens!r} in wall_s {wall!r}: no tokens/s "
        "to take a speedup of (expected new_tokens >= 1 and a finite wall_s > 0)"
    )


def request_from_json(data: dict[str, Any]) -> Request:
    """Inverse of `request_to_json` (derived keys, and fields this version does not know, are
    dropped); a `ValueError` names a missing field."""
    values = known_fields(Request, data, "a request")
    for key in ("output_ids", "accept_lengths", "strong_calls", "step_times"):
        values[key] = tuple(values.get(key, ()))
    if values.get("mismatch") is not None:
        values["mismatch"] = Mismatch(**values["mismatch"])
    return Request(**values)
