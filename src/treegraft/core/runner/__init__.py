"""The runner and its forwards: how a model's tree forwards run, exactly.

- `causal_lm`: `CausalLMRunner`, the one runner of the target and the LM drafters (prefill, tree
  forwards, KV commit);
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

from treegraft.core.runner.causal_lm import CACHE_CHUNK, CausalLMRunner
from treegraft.core.runner.watchers import watch_forwards

__all__ = ["CACHE_CHUNK", "CausalLMRunner", "watch_forwards"]
