"""What the runner's rules read first from a model config: its decoder's config, the
recurrent architectures whose configs state no layer types, and the layer types and fields of
attention a draft tree's mask cannot reproduce (read by `attention_rules` and `chain_models`)."""

from __future__ import annotations

from typing import Any

#: recurrent architectures whose configs state no `layer_types` (Mamba's and others' do)
RECURRENT_TYPES = frozenset({"rwkv", "xlstm"})
#: layer types whose keys an indexer selects per query (DeepSeek's sparse attention)
INDEXED_TYPES = frozenset({"indexed_attention"})
#: layer types that pool keys into compressed entries by window of tokens (DeepSeek-V4's)
COMPRESSED_TYPES = frozenset({"compressed_sparse_attention", "heavily_compressed_attention"})
#: config fields of indexers that count, pool or keep keys by cache slot (Kolibri 1.1's)
SLOT_INDEX_FIELDS = ("index_num_local_tokens", "index_num_sink_tokens", "index_pool_size")


def text_config(config: Any) -> Any:
    """The decoder's config of a (possibly composite) model config."""
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config
