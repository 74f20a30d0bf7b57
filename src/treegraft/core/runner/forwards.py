"""How a model forward runs: one setting, `decoding.forward`, for the target and the LM drafters.

| `decoding.forward` | models load with | the target's tree forwards | LM drafters' forwards |
|---|---|---|---|
| `lean` | SDPA | the lean forward (`lean.LeanForward`: `transformers`' operations without its module stack, bitwise equal logits); an error for a model it does not support | the fused lean forward (`lean.FusedForward`: fewer, larger operations, logits equal up to rounding; drafts only steer what the target verifies) |
| `lean-fast` | SDPA | as `lean`, but blocks of 4+ tokens multiply by contiguous transposed weights on a float32 CPU even where their bits differ from `F.linear`'s (`CausalLMRunner.bitwise` False): logits equal to `transformers`' up to rounding, tree forwards cheaper | as `lean` |
| `transformers` | SDPA (eager where the architecture has no SDPA) | `transformers`' own forward with a dense tree mask | the same |
| `tree` | the tree-attention kernel (`treegraft_tree`) | `transformers`' forward, attention through `treegraft.kernels.tree_attention` (Triton on CUDA, its pure-torch reference on CPU) | the same |
| `auto` (default) | `tree` on CUDA; elsewhere as `lean-fast` where a model qualifies, as `transformers` where not | | |

Every path is exact: the target's logits are those of its own forward (bitwise for `lean`,
to rounding for `lean-fast`, `auto` and `tree`, and checked by the load-time probe for every
model). Against plain decoding, which forwards one token at a time, no tree forward is bitwise
anyway: a block of several tokens takes other kernels than one token (their sums round
otherwise), whichever setting runs it; `auto` takes the cheaper products
(docs/losslessness.md#floating-point-precision).
`TREEGRAFT_KERNELS=reference|triton` picks the backend of the kernels themselves, for tests and
debugging (docs/kernels.md); it does not change which forward runs.
"""

from __future__ import annotations

import inspect
from typing import Any

import attrs
import torch

from treegraft.core.errors import ArgumentError

#: the values of `decoding.forward`
FORWARD_SETTINGS = ("auto", "lean", "transformers", "tree", "lean-fast")


@attrs.frozen
class ForwardPlan:
    """What one `decoding.forward` value means on one device."""

    #: the setting, as written (`auto`, `lean`, `transformers`, `tree` or `lean-fast`)
    setting: str
    #: models load with the tree-attention kernel (`treegraft_tree`) instead of SDPA
    tree_kernel: bool
    #: the `CausalLMRunner` forward of the target: `auto` (lean where supported), `lean` or
    #: `transformers`
    target: str
    #: the `CausalLMRunner` forward of an LM drafter (`fused`: the fused lean forward where
    #: supported)
    drafter: str
    #: the target runner's lean products are `F.linear`'s bit for bit (`CausalLMRunner.bitwise`;
    #: False for `lean-fast`)
    bitwise: bool = True

    def describe(self) -> str:
        """One line for stats and errors, e.g. `auto (lean where supported, SDPA)`."""
        how = {
            "lean": "lean forward, SDPA",
            "lean-fast": "lean forward, transposed products (logits to rounding), SDPA",
            "transformers": "transformers' forward, SDPA",
            "tree": "transformers' forward, tree-attention kernel",
        }
        if self.tree_kernel and self.setting != "tree":
            return f"{self.setting}: {how['tree']}"
        if self.setting == "auto":
            return "auto: lean where supported (transposed products, logits to rounding), SDPA"
        return how[self.setting]


def plan_forward(setting: str, device: torch.device) -> ForwardPlan:
    """The `ForwardPlan` of `decoding.forward: setting` on `device`."""
    if setting not in FORWARD_SETTINGS:
        raise ArgumentError(
            f"forward: expected one of {', '.join(FORWARD_SETTINGS)}, got {setting!r}"
        )
    if setting == "tree" or (setting == "auto" and device.type == "cuda"):
        return ForwardPlan(setting, True, "transformers", "transformers")
    if setting == "transformers":
        return ForwardPlan(setting, False, "transformers", "transformers")
    if setting == "lean-fast":
        return ForwardPlan(setting, False, "lean", "fused", bitwise=False)
    # `auto` off CUDA: lean where supported, with `lean-fast`'s cheaper products
    return ForwardPlan(setting, False, setting, "fused", bitwise=setting == "lean")


def cache_kwarg(model: Any) -> str:
    """The name `model`'s forward takes its key/value cache under."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def quiet_outputs(model: Any) -> dict[str, bool]:
    """Keyword arguments that switch off outputs a tree forward must not compute although the
    config asks for them: a mixture of experts' router logits (`output_router_logits`, kept
    on in checkpoints fine-tuned with a load-balancing loss), whose auxiliary loss reads the
    attention mask as a `[batch, tokens]` padding mask and fails on a tree's. They change no
    logits."""
    params = inspect.signature(model.forward).parameters
    return {"output_router_logits": False} if "output_router_logits" in params else {}
