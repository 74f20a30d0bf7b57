"""What the runner's rules read first from a model config: its decoder's config, and the
recurrent architectures whose configs state no layer types."""

from __future__ import annotations

from typing import Any

#: recurrent architectures whose configs state no `layer_types` (Mamba's and others' do)
RECURRENT_TYPES = frozenset({"rwkv", "xlstm"})


def text_config(config: Any) -> Any:
    """The decoder's config of a (possibly composite) model config."""
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config
