"""The runner and its forwards: how a model's tree forwards run, exactly.

- `causal_lm`: `CausalLMRunner`, the runner of the target and the LM drafters (prefill, tree
  forwards, KV commit);
- `state_runner`: `StateRunner`, the target's runner where the model's layers carry a state
  (one chain per step through the model's own cache); `state_models`: which models those are;
- `sequence_runner`: `SequenceRunner`, the target's runner of attention models that take no
  draft tree's mask nor a cache it extends (one chain per step, the whole sequence forwarded);
  `chain_models`: which attention models verify chains, and through which runner;
- `state_snapshot`: the state a step's forward may have to undo, copied and put back (models
  whose cache cannot crop it);
- `chain_tokens`: the committed-token buffer both chain runners keep;
- `watchers`: `watch_forwards`, callbacks told the size of every runner forward of a model;
- `forwards`: the one setting that decides how a forward runs (`decoding.forward`);
- `lean`: the lean forward (bitwise equal to `transformers`' SDPA forward, without its module
  stack) and its fused variant for drafters;
- `kv_cache`: the preallocated, chunk-grown key/value cache (a tensor per shape of layer);
- `positions`: each node's position handed to decoders that number their tokens themselves;
- `attention_rules`: the model's own attention rules (sliding windows, chunks, per-layer types)
  and the refusal of architectures a tree forward cannot reproduce;
- `slot_windows`: GPT-Neo's local windows, read from a table by cache slot, set by position;
- `model_check`: the load-time probe (one tree forward against sequential forwards);
- `wide_copy`: the float64 copy of a half-precision model's architecture that probe also checks;
- `latency`: latency curves measured through a runner;
- `placement`: device maps (layers across devices, offload).
"""

from typing import Any

from treegraft.core.runner.causal_lm import CACHE_CHUNK, CausalLMRunner
from treegraft.core.runner.sequence_runner import SequenceRunner, chain_runner
from treegraft.core.runner.state_runner import StateRunner
from treegraft.core.runner.watchers import watch_forwards

__all__ = [
    "CACHE_CHUNK",
    "CausalLMRunner",
    "SequenceRunner",
    "StateRunner",
    "runner_for",
    "watch_forwards",
]


def runner_for(
    model: Any, *, forward: str = "auto", bitwise: bool = True, pad_small_blocks: bool | None = None
) -> Any:
    """The runner of `model` as a target: the chain runner `sequence_runner.chain_runner`
    names (a `StateRunner` where its layers carry a state, a `SequenceRunner` or `StateRunner`
    for an attention model that takes no draft tree's mask: `chain_models`), else a
    `CausalLMRunner` (`pad_small_blocks`: its attribute)."""
    if (runner := chain_runner(model)) is not None:
        return runner(model, forward=forward)
    return CausalLMRunner(
        model, forward=forward, bitwise=bitwise, pad_small_blocks=pad_small_blocks
    )
