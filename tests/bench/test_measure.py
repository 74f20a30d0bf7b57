"""Forward meters, first differences and logit margins."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_llama
from treegraft.bench.measure import (
    ForwardMeter,
    PeakMemory,
    StageTimer,
    exactness,
    first_difference,
    logit_margin,
)


@pytest.mark.parametrize(
    ("a", "b", "pos"),
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2), ([], [4], 0)],
)
def test_first_difference(a, b, pos):
    assert first_difference(a, b) == pos


def test_forward_meter_counts_forwards_inside_its_block_only():
    model = tiny_llama(seed=3)
    ids = torch.tensor([[1, 2, 3]])
    with ForwardMeter(model) as meter:
        model(ids)
        model(ids)
    model(ids)
    assert meter.calls == 2 and meter.seconds > 0
    with ForwardMeter(None) as nothing:
        model(ids)
    assert nothing.calls == 0


def test_logit_margin_and_exactness():
    model = tiny_llama(seed=3)
    prompt = torch.tensor([4, 5, 6])
    with torch.no_grad():
        logits = model(torch.tensor([[4, 5, 6, 7]])).logits[0, -1]
    top = logits.topk(2).values
    assert logit_margin(model, torch.tensor([4, 5, 6, 7])) == pytest.approx(float(top[0] - top[1]))
    exact, mismatch = exactness(model, prompt, [7, 8, 9], [7, 1, 9])
    assert not exact and (mismatch.position, mismatch.expected, mismatch.got) == (1, 8, 1)
    assert mismatch.margin == pytest.approx(logit_margin(model, torch.tensor([4, 5, 6, 7])))
    assert exactness(model, prompt, [7, 8], [7, 8]) == (True, None)


def test_peak_memory_reads_a_positive_number_on_cpu():
    mem = PeakMemory(torch.device("cpu"))
    mem.reset()
    assert mem.read_mib() > 0


def test_gpu_forward_times_come_from_cuda_events_read_once(monkeypatch):
    """With `torch.cuda` mocked: a CUDA `ForwardMeter` never synchronises per forward; the
    times are read from events when asked, with one wait on the last one."""
    from tests.core.test_clock import FakeEvent, no_device_sync

    FakeEvent.waits = 0
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", no_device_sync)
    model = tiny_llama(seed=3)
    with ForwardMeter(model, sync=True) as meter:
        for _ in range(3):
            model(torch.tensor([[1, 2, 3]]))
    assert meter.calls == 3 and FakeEvent.waits == 0
    assert 0 < meter.seconds < 1.0 and FakeEvent.waits == 1
    timer = StageTimer(cuda=True)
    assert timer.seconds() == 0.0
    timer.start()
    timer.stop()
    assert timer.seconds() >= 0.0 and FakeEvent.waits == 2
