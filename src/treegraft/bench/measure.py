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
class ForwardMeter:
    """Counts and times the forwards of one model through forward hooks, inside a `with` block.

    With `sync=True` (CUDA) the device is synchronised around each forward, so the time belongs
    to the forward that launched the work. A meter on `None` measures nothing.
    """

    module: Any
    sync: bool = False
    calls: int = 0
    seconds: float = 0.0
    _started: float = 0.0
    _handles: list[Any] = attrs.field(factory=list)

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
        if self.sync:
            torch.cuda.synchronize()
        self._started = time.perf_counter()

    def _after(self, *_: Any) -> None:
        if self.sync:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - self._started
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
