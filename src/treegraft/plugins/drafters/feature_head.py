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

from treegraft.core.errors import TreegraftError, shown

CONFIG_FILE = "head.json"
WEIGHTS_FILE = "head.safetensors"
#: where `zoo:NAME` heads live (beside the zoo's models, not among them: a head is no causal LM)
HEADS_DIR = Path(__file__).resolve().parents[2] / "zoo" / "heads"
#: the sizes `head.json` must state, each a positive integer
SIZES = ("hidden_size", "intermediate_size", "vocab_size")


class HeadError(TreegraftError, ValueError):
    """A feature head's folder holds no head that loads: `head.json` or the weights are
    missing, damaged or of other shapes than it states."""


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
    if not ref.strip() or not (path / CONFIG_FILE).is_file():  # Path("") is the working folder
        shipped = sorted(p.name for p in HEADS_DIR.glob("*") if (p / CONFIG_FILE).is_file())
        raise FileNotFoundError(
            f"head {ref!r} not found: expected 'zoo:NAME' (shipped: "
            f"{', '.join(shipped) or 'none'}) or a folder holding {CONFIG_FILE} "
            "(written by `treegraft zoo train-head`)"
        )
    return path


def read_spec(ref: str) -> tuple[Path, HeadSpec]:
    """The folder of head `ref` and the shape its `head.json` states, checked: a JSON object
    with positive integer sizes and no unknown key (`HeadError`; a missing folder is the
    `FileNotFoundError` of `resolve_head`). No weights load."""
    folder = resolve_head(ref)
    where = f"head {ref!r}: {folder / CONFIG_FILE}"
    try:
        data = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HeadError(f"{where} does not load ({exc}); write the head again") from None
    if not isinstance(data, dict):
        raise HeadError(f"{where}: expected a JSON object, got {shown(data)}")
    known = [f.name for f in attrs.fields(HeadSpec)]
    if unknown := sorted(set(data) - set(known)):
        raise HeadError(f"{where}: unknown key {unknown[0]!r}; expected keys: {', '.join(known)}")
    for key in SIZES:
        if key not in data:
            raise HeadError(f"{where}: {key}: missing (expected an integer >= 1)")
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HeadError(f"{where}: {key}: expected an integer >= 1, got {shown(value)}")
    if not isinstance(data.get("target", ""), str):
        raise HeadError(f"{where}: target: expected a string, got {shown(data['target'])}")
    eps = data.get("eps", 1e-6)
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 < eps < 1:
        raise HeadError(f"{where}: eps: expected a number in (0, 1), got {shown(eps)}")
    return folder, HeadSpec(**data)


def check_weights(ref: str, folder: Path, spec: HeadSpec) -> None:
    """`head.safetensors` holds the tensors of a head of `spec`'s shape (read from its header;
    `HeadError` naming the first that differs)."""
    from safetensors import safe_open

    path = folder / WEIGHTS_FILE
    with torch.device("meta"):
        expected = {k: list(v.shape) for k, v in FeatureHead(spec).state_dict().items()}
    try:
        with safe_open(str(path), framework="pt") as file:
            found = {k: list(file.get_slice(k).get_shape()) for k in file.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error type, or an OSError
        raise HeadError(
            f"head {ref!r}: {path} does not load ({str(exc) or type(exc).__name__}); write the "
            "head again"
        ) from None
    for name in sorted(expected.keys() | found.keys()):
        if expected.get(name) != found.get(name):
            raise HeadError(
                f"head {ref!r}: {path}: tensor {name!r} has shape {found.get(name, 'absent')}, "
                f"but {CONFIG_FILE} states a head of shape {expected.get(name, 'absent')} "
                f"(hidden_size {spec.hidden_size}, intermediate_size {spec.intermediate_size})"
            )


def load_head(ref: str, *, dtype: torch.dtype, device: Any = "cpu") -> FeatureHead:
    """The head `ref` (see `resolve_head`) in `dtype` on `device`, in eval mode; `head.json`
    and the weights' shapes are checked first (`read_spec`, `check_weights`)."""
    from safetensors.torch import load_file

    folder, spec = read_spec(ref)
    check_weights(ref, folder, spec)
    head = FeatureHead(spec)
    head.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)
