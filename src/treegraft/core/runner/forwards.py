"""How a model forward runs: one setting, `decoding.forward`, for the target and the LM drafters.

| `decoding.forward` | models load with | the target's tree forwards | LM drafters' forwards |
|---|---|---|---|
| `lean` | SDPA | the lean forward (`lean.LeanForward`: `transformers`' operations without its module stack, bitwise equal logits); an error for a model it does not support | the fused lean forward (`lean.FusedForward`: fewer, larger operations, logits equal up to rounding; drafts only steer what the target verifies) |
| `lean-fast` | SDPA | as `lean`, but blocks of 4+ tokens multiply by contiguous transposed weights on a float32 CPU even where their bits differ from `F.linear`'s (`CausalLMRunner.bitwise` False): logits equal to `transformers`' up to rounding, tree forwards cheaper | as `lean` |
| `transformers` | SDPA (eager where the architecture has no SDPA) | `transformers`' own forward with a dense tree mask | the same |
| `tree` | the tree-attention kernel (`treegraft_tree`) | `transformers`' forward, attention through `treegraft.kernels.tree_attention` (Triton on CUDA, its pure-torch reference on CPU) | the same |
| `auto` (default) | on CUDA, per model: `tree` where the kernel computes the model's own attention (`kernel_problem`), else as off CUDA; elsewhere as `lean-fast` where a model qualifies, as `transformers` where not | | |

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
from pathlib import Path
from typing import Any

import attrs
import torch

from treegraft.core.errors import ArgumentError
from treegraft.core.runner.attention_rules import ModelRefused, attention_rules

#: the values of `decoding.forward`
FORWARD_SETTINGS = ("auto", "lean", "transformers", "tree", "lean-fast")


@attrs.frozen
class ForwardPlan:
    """What one `decoding.forward` value means on one device (and, `for_model`, for one model)."""

    #: the setting, as written (`auto`, `lean`, `transformers`, `tree` or `lean-fast`)
    setting: str
    #: models load with the tree-attention kernel (`treegraft_tree`) instead of SDPA (`auto` on
    #: CUDA before `for_model`: those the kernel can serve)
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
    #: `auto` on CUDA, chosen for one model (`for_model`): why the kernel serves it or not
    #: (None: not chosen per model)
    reason: str | None = None

    def describe(self) -> str:
        """One line for stats and errors, e.g. `lean forward, SDPA`."""
        how = {
            "lean": "lean forward, SDPA",
            "lean-fast": "lean forward, transposed products (logits to rounding), SDPA",
            "transformers": "transformers' forward, SDPA",
            "tree": "transformers' forward, tree-attention kernel",
        }
        lean = "lean where supported (transposed products, logits to rounding), SDPA"
        if self.setting != "auto":
            return how[self.setting]
        if self.tree_kernel and self.reason is None:
            return (
                f"auto: {how['tree']} for models whose attention it computes (plain causal, "
                "SDPA's); for the others lean where supported, else transformers' forward"
            )
        if self.tree_kernel:
            return f"auto: {how['tree']} ({self.reason})"
        if self.reason is not None:  # on CUDA: no transposed products
            return (
                "auto: lean where supported, else transformers' forward; not the tree-attention "
                f"kernel: {self.reason}"
            )
        return f"auto: {lean}"

    def for_model(self, model: Any, *, features: bool = False) -> ForwardPlan:
        """This plan for `model`: `auto` on CUDA takes the tree-attention kernel where it computes
        the model's own attention (`kernel_problem`), else SDPA as off CUDA; others are as they
        are for every model. `features`: a drafter reads the model's hidden states (the target's,
        `Drafter.reads_target_features`), which only the lean forward keeps: `auto` takes SDPA."""
        if self.setting != "auto" or not self.tree_kernel or self.reason is not None:
            return self
        why = FEATURES_READ if features else kernel_problem(model)
        if why is None:
            return attrs.evolve(self, reason="its attention is plain causal SDPA attention")
        return ForwardPlan(self.setting, False, "auto", "fused", bitwise=False, reason=why)


#: why `auto` takes SDPA for a target whose hidden states a drafter reads
FEATURES_READ = "a drafter reads its hidden states, which only the lean forward keeps"


def plan_forward(setting: str, device: torch.device) -> ForwardPlan:
    """The `ForwardPlan` of `decoding.forward: setting` on `device` (`ForwardPlan.for_model`:
    for one model)."""
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


def kernel_problem(model: Any) -> str | None:
    """Why the tree-attention kernel would not compute `model`'s own attention (None: it
    would). The kernel takes one causal tree mask for every layer and computes SDPA's
    attention, so a model with other rules on some layers (sliding windows, chunks:
    `attention_rules`) or whose attention SDPA cannot express (its class supports no SDPA:
    soft-capping, sinks) is not the kernel's."""
    name = type(model).__name__
    try:
        rules = attention_rules(model.config)
    except ModelRefused as err:
        return f"{name}: {err}"
    if not rules.plain:
        return f"{name} has {rules.describe()}, and the kernel takes one causal tree mask"
    if not getattr(model, "_supports_sdpa", False):
        return f"{name} has no SDPA attention, and the kernel computes SDPA's"
    return None


def attend(model: Any, plan: ForwardPlan) -> None:
    """Switch `model` to the attention implementation `plan` (for this model) loads it with:
    the tree kernel, or back from it to SDPA (eager where the architecture has none); other
    implementations (eager where SDPA is not supported, a user's own) stay."""
    from treegraft.kernels.tree_attention.hf import register

    current = getattr(model.config, "_attn_implementation", None)
    if plan.tree_kernel and current != (kernel := register()):
        model.set_attn_implementation(kernel)
    elif not plan.tree_kernel and current == register():
        model.set_attn_implementation(
            "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"
        )


def attention_for(path: Path) -> str:
    """`sdpa` where the architecture supports it (an explicit mask is then honoured by torch's
    fused attention), else `eager` (e.g. Gemma 2, GPT-OSS, whose soft-capping or sinks SDPA
    cannot express)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ValueError, OSError):
        return "sdpa"  # from_pretrained names the problem itself
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


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


def generate_hands_positions(model: Any) -> bool:
    """Whether `generate` passes the model `position_ids` (`transformers`' rule: a forward that
    takes them, a config that is not encoder-decoder)."""
    takes = "position_ids" in inspect.signature(model.forward).parameters
    return takes and not getattr(model.config, "is_encoder_decoder", False)
