"""How a model forward runs: one setting, `decoding.forward`, for the target and the LM drafters.

| `decoding.forward` | models load with | the target's tree forwards | LM drafters' forwards |
|---|---|---|---|
| `lean` | SDPA | the lean forward (`lean.LeanForward`: `transformers`' operations without its module stack, bitwise equal logits); an error for a model it does not support | the fused lean forward (`lean.FusedForward`: fewer, larger operations, logits equal up to rounding; drafts only steer what the target verifies) |
| `transformers` | SDPA (eager where the architecture has no SDPA) | `transformers`' own forward with a dense tree mask | the same |
| `tree` | the tree-attention kernel (`treegraft_tree`) | `transformers`' forward, attention through `treegraft.kernels.tree_attention` (Triton on CUDA, its pure-torch reference on CPU) | the same |
| `auto` (default) | `tree` on CUDA; elsewhere as `lean` where a model qualifies, as `transformers` where not | | |

Every path is exact: the target's logits are those of its own forward (bitwise for `lean`,
and checked by the load-time probe for every model). `TREEGRAFT_KERNELS=reference|triton` picks
the backend of the kernels themselves, for tests and debugging (docs/kernels.md); it does not
change which forward runs.
"""

from __future__ import annotations

import attrs
import torch

#: the values of `decoding.forward`
FORWARD_SETTINGS = ("auto", "lean", "transformers", "tree")


@attrs.frozen
class ForwardPlan:
    """What one `decoding.forward` value means on one device."""

    #: the setting, as written (`auto`, `lean`, `transformers` or `tree`)
    setting: str
    #: models load with the tree-attention kernel (`treegraft_tree`) instead of SDPA
    tree_kernel: bool
    #: the `CausalLMRunner` forward of the target: `auto` (lean where supported), `lean` or
    #: `transformers`
    target: str
    #: the `CausalLMRunner` forward of an LM drafter (`fused`: the fused lean forward where
    #: supported)
    drafter: str

    def describe(self) -> str:
        """One line for stats and errors, e.g. `auto (lean where supported, SDPA)`."""
        how = {
            "lean": "lean forward, SDPA",
            "transformers": "transformers' forward, SDPA",
            "tree": "transformers' forward, tree-attention kernel",
        }
        if self.setting == "auto":
            return "auto: " + (how["tree"] if self.tree_kernel else "lean where supported, SDPA")
        return how[self.setting]


def plan_forward(setting: str, device: torch.device) -> ForwardPlan:
    """The `ForwardPlan` of `decoding.forward: setting` on `device`."""
    if setting not in FORWARD_SETTINGS:
        raise ValueError(f"forward: expected one of {', '.join(FORWARD_SETTINGS)}, got {setting!r}")
    if setting == "tree" or (setting == "auto" and device.type == "cuda"):
        return ForwardPlan(setting, True, "transformers", "transformers")
    if setting == "transformers":
        return ForwardPlan(setting, False, "transformers", "transformers")
    return ForwardPlan(setting, False, setting, "fused")
