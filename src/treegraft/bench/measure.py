"""Measuring instruments: forward counters and timers on models, peak memory, exactness."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from treegraft.bench.records import Mismatch

PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


@attrs.define
class StageTimer:
    """Adds up the seconds of timed blocks (`start` ... `stop`) without synchronising per block.

    On CUDA each block is a pair of CUDA events recorded on the current stream; their times are
    read once, by `seconds()`, which waits for the last event (one synchronisation per request).
    On CPU a block is wall time (`time.perf_counter`).
    """

    cuda: bool = False
    _events: list[tuple[Any, Any]] = attrs.field(factory=list)
    _open: Any = None
    _wall: float = 0.0

    def start(self) -> None:
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._open = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._open, end))
        else:
            self._wall += time.perf_counter() - self._open
        self._open = None

    def seconds(self) -> float:
        """Total seconds of the blocks so far; on CUDA, synchronises with the last event."""
        if not self._events:
            return self._wall
        self._events[-1][1].synchronize()
        return self._wall + sum(a.elapsed_time(b) for a, b in self._events) / 1e3


@attrs.define
class ForwardMeter:
    """Counts and times the forwards of one model through forward hooks, inside a `with` block.

    With `sync=True` (CUDA) each forward is timed by CUDA events (`StageTimer`): the time belongs
    to the forward that launched the work, and nothing waits for the device between forwards.
    A meter on `None` measures nothing.
    """

    module: Any
    sync: bool = False
    calls: int = 0
    _timer: StageTimer = attrs.field(init=False)
    _handles: list[Any] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        self._timer = StageTimer(cuda=self.sync)

    @property
    def seconds(self) -> float:
        """Seconds of the forwards so far (on CUDA, waits for the last one to finish)."""
        return self._timer.seconds()

    def __enter__(self) -> ForwardMeter:
        if self.module is not None:
            self._handles = [
                self.module.register_forward_pre_hook(self._before),
                self.module.register_forward_hook(self._after),
            ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _before(self, *_: Any) -> None:
        self._timer.start()

    def _after(self, *_: Any) -> None:
        self._timer.stop()
        self.calls += 1


@attrs.define
class PeakMemory:
    """Peak memory of one request: allocated CUDA memory, or resident memory (RSS) on CPU.

    On Linux the RSS high-water mark is reset per request (`/proc/self/clear_refs`); where that
    is not allowed, the process's lifetime peak is reported instead.
    """

    device: torch.device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        with contextlib.suppress(OSError):
            PROC_CLEAR_REFS.write_text("5")

    def read_mib(self) -> float:
        """Peak since the last `reset`, in MiB (synchronises CUDA)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        try:
            for line in PROC_STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_difference(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """First index where two token sequences differ (a length difference counts), else None."""
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def logit_margin(model: Any, prefix: torch.Tensor) -> float:
    """Top-1 minus top-2 logit of the model's next-token prediction after `prefix` (`[T]` ids).

    One plain forward with an all-ones attention mask; synchronises the device.
    """
    ids = prefix.to(model.device)[None, :]
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1]
    top = logits.double().topk(2).values
    return float(top[0] - top[1])


def exactness(
    model: Any, prompt: torch.Tensor, reference: Sequence[int], got: Sequence[int]
) -> tuple[bool, Mismatch | None]:
    """Compare an output with plain decoding; on a mismatch, locate it and measure the margin."""
    pos = first_difference(reference, got)
    if pos is None:
        return True, None
    prefix = torch.cat([prompt.cpu(), torch.tensor(list(reference[:pos]), dtype=torch.long)])
    return False, Mismatch(
        position=pos,
        expected=int(reference[pos]) if pos < len(reference) else -1,
        got=int(got[pos]) if pos < len(got) else -1,
        margin=logit_margin(model, prefix),
    )
