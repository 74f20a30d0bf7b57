"""The per-step clock: blocks add their time per label (wall time, or CUDA events on a GPU,
checked with `torch.cuda` mocked), exceptions still count, reset."""

from __future__ import annotations

import time

import pytest
import torch

from treegraft.core.metrics import Clock


def test_blocks_accumulate_per_label_and_reset_starts_over():
    clock = Clock()
    for _ in range(3):
        with clock.time("drafter0"):
            time.sleep(0.002)
    with clock.time("target"):
        time.sleep(0.004)
    assert clock.counts == {"drafter0": 3, "target": 1}
    assert clock.totals["drafter0"] >= 0.006 and clock.totals["target"] >= 0.004
    assert clock.totals["drafter0"] < 1.0  # seconds, not nanoseconds
    out = clock.reset()
    assert set(out) == {"drafter0", "target"}
    assert clock.totals == {} and clock.counts == {}


def test_a_block_that_raises_is_still_timed_and_the_error_propagates():
    clock = Clock()
    with pytest.raises(KeyError), clock.time("build"):
        time.sleep(0.001)
        raise KeyError("boom")
    assert clock.counts == {"build": 1} and clock.totals["build"] >= 0.001


def test_nested_blocks_time_both_labels():
    clock = Clock()
    with clock.time("build"), clock.time("drafter1"):
        time.sleep(0.002)
    assert clock.totals["build"] >= clock.totals["drafter1"] >= 0.002


class FakeEvent:
    """A stand-in for `torch.cuda.Event`: `record` notes the host time; counts its waits."""

    waits = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        FakeEvent.waits += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as CUDA events report


def no_device_sync(*args, **kwargs):
    raise AssertionError("torch.cuda.synchronize called in the step loop")


@pytest.fixture
def cuda_mocks(monkeypatch: pytest.MonkeyPatch) -> type[FakeEvent]:
    FakeEvent.waits = 0
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", no_device_sync)
    return FakeEvent


def test_on_cuda_blocks_are_timed_by_events_without_synchronising(cuda_mocks):
    clock = Clock(sync=True)
    with clock.time("build"), clock.time("drafter1"):
        time.sleep(0.002)
    with clock.time("commit", host=True):
        time.sleep(0.001)
    assert set(clock.totals) == {"commit"}  # the event blocks are read at `reset`
    assert [label for label, *_ in clock.pending] == ["drafter1", "build"]
    out = clock.reset()
    assert out["build"] >= out["drafter1"] >= 0.002 and out["commit"] >= 0.001
    assert out["build"] < 1.0  # seconds, not milliseconds
    assert cuda_mocks.waits == 2 and clock.pending == []


def test_a_cuda_decode_loop_never_synchronises_and_copies_through_a_pinned_buffer(
    cuda_mocks, monkeypatch: pytest.MonkeyPatch
):
    """The decoder as a CUDA pipeline runs it (`sync_clock`, `pinned`), on the CPU with
    `torch.cuda` mocked: no `torch.cuda.synchronize`, stage times from events, the committed
    tokens handed to every runner from one reused pinned buffer, and the output unchanged."""
    from tests.conftest import greedy_reference, memory_resources, tiny_llama
    from tests.core.test_decoder import repetitive_prompt
    from treegraft.core.pipeline import load_pipeline
    from treegraft.core.runner import CausalLMRunner

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    seen: list[int] = []
    commit = CausalLMRunner.commit

    def spy(self, accepted, tokens):
        assert accepted.device.type == "cpu"  # read on the host without a device wait
        seen.append(tokens.untyped_storage().data_ptr())
        return commit(self, accepted, tokens)

    monkeypatch.setattr(CausalLMRunner, "commit", spy)
    target, draft = tiny_llama(seed=1), tiny_llama(seed=2, hidden=16, layers=1, heads=2)
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}, "strong": {"name": "hf_lm", "model": "mem:d"}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "scheduler": {"name": "every_k", "k": 2},
        "decoding": {"max_new_tokens": 12, "dtype": "float64"},
    }
    pipe = load_pipeline(spec, resources=memory_resources(target=target, d=draft))
    seen.clear()  # the load-time probe commits through runners of its own
    pipe.decoder.sync_clock = pipe.decoder.pinned = True
    prompt = repetitive_prompt(1, 10) % 64
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 12)
    assert len(seen) == 2 * (len(out.events) - 1) and len(set(seen)) == 1  # one buffer
    assert cuda_mocks.waits >= len(out.events)
    for event in out.events:
        assert {"build", "target", "verify"} <= set(event.times)
        assert all(0 <= t < 1.0 for t in event.times.values())
