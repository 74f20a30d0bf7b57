"""The feature head: a small network predicting a target's next hidden state (EAGLE family).

A causal LM's final-norm hidden state at token `t` (its *feature* `f_t`, what the output head
reads) carries what the model knows of the text so far. The head predicts the next one from the
previous feature and the next token's embedding,

    f^_t = head(f_{t-1}, embed(x_t)),

and the target's own output head turns `f^_t` into a distribution of `x_{t+1}`. Fed its own
predictions, it goes on drafting deeper (`f^_{t+1} = head(f^_t, embed(x_{t+1}))`). Embeddings and
output head are the target's (shared, not stored with the head), so the head itself is small:
one projection of the concatenated pair back to the hidden size, then a gated MLP block with a
residual connection (the feature-prediction idea of EAGLE, Li et al. 2024, with an MLP block
instead of a decoder layer: the target's feature already attends over the context).

Stored as a folder: `head.json` (shape and the target it was distilled from) and
`head.safetensors` (weights).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

CONFIG_FILE = "head.json"
WEIGHTS_FILE = "head.safetensors"
#: where `zoo:NAME` heads live (beside the zoo's models, not among them: a head is no causal LM)
HEADS_DIR = Path(__file__).resolve().parents[2] / "zoo" / "heads"


@attrs.frozen
class HeadSpec:
    """Shape of a feature head and the target it serves."""

    hidden_size: int
    intermediate_size: int
    vocab_size: int
    target: str = ""  # the model reference it was distilled from (documentation only)
    eps: float = 1e-6


class FeatureHead(nn.Module):
    """Predicts the next feature from `[..., hidden]` features and token embeddings."""

    def __init__(self, spec: HeadSpec) -> None:
        super().__init__()
        self.spec = spec
        h, i = spec.hidden_size, spec.intermediate_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))
        self.gate = nn.Linear(h, i, bias=False)
        self.up = nn.Linear(h, i, bias=False)
        self.down = nn.Linear(i, h, bias=False)

    def forward(self, feature: Tensor, embedding: Tensor) -> Tensor:
        """`[..., hidden]` predicted next feature."""
        x = self.fc(torch.cat([feature, embedding], dim=-1))
        n = F.rms_norm(x, (x.shape[-1],), self.norm, self.spec.eps)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))

    def save(self, folder: Path) -> Path:
        """Write `head.json` and `head.safetensors` (bf16) into `folder`."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps(attrs.asdict(self.spec), indent=2) + "\n")
        weights = {
            k: v.detach().to(torch.bfloat16).contiguous() for k, v in self.state_dict().items()
        }
        save_file(weights, str(folder / WEIGHTS_FILE))
        return folder


def resolve_head(ref: str) -> Path:
    """The folder of head `ref`: `zoo:NAME` (shipped) or a folder holding `head.json` (`~`
    expanded, as in model references)."""
    path = (
        HEADS_DIR / ref.removeprefix("zoo:") if ref.startswith("zoo:") else Path(ref).expanduser()
    )
    if not (path / CONFIG_FILE).is_file():
        shipped = sorted(p.name for p in HEADS_DIR.glob("*") if (p / CONFIG_FILE).is_file())
        raise FileNotFoundError(
            f"head {ref!r} not found: expected 'zoo:NAME' (shipped: "
            f"{', '.join(shipped) or 'none'}) or a folder holding {CONFIG_FILE} "
            "(written by `treegraft zoo train-head`)"
        )
    return path


def load_head(ref: str, *, dtype: torch.dtype, device: Any = "cpu") -> FeatureHead:
    """The head `ref` (see `resolve_head`) in `dtype` on `device`, in eval mode."""
    from safetensors.torch import load_file

    folder = resolve_head(ref)
    spec = HeadSpec(**json.loads((folder / CONFIG_FILE).read_text()))
    head = FeatureHead(spec)
    head.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)
