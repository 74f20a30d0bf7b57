"""Test helper: a random tiny Llama written as a GGUF file, the way llama.cpp's converter writes one.

F32 tensors (dequantising them is exact), q/k rows permuted for llama.cpp's rotary layout, and the
zoo tokenizer stored as `gpt2` (byte-level BPE) metadata with a chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from treegraft.zoo import tokenizer_path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|user|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_llama(*, vocab_size: int, tie: bool = True, seed: int = 0) -> LlamaForCausalLM:
    """A random Llama with 3 layers, hidden 32, 4 heads (2 KV heads), in float32."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms, so a lost norm weight would show in the logits
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (interleaved rotary pairs); transformers undoes it on load."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _zoo_vocab() -> tuple[list[str], list[int], list[str]]:
    data = json.loads((tokenizer_path() / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in data["added_tokens"] if a.get("special")}
    types = [3 if t in special else 1 for t in tokens]  # 3 CONTROL, 1 NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, types, merges


def write_tiny_gguf(model: LlamaForCausalLM, path: Path) -> Path:
    """Write `model` (and the zoo tokenizer) as the GGUF file `path`."""
    import gguf

    cfg = model.config
    tokens, types, merges = _zoo_vocab()
    assert len(tokens) == cfg.vocab_size
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for key, tensor in model.state_dict().items():
        if cfg.tie_word_embeddings and key == "lm_head.weight":
            continue
        w = tensor.detach().numpy().astype(np.float32)
        if key.endswith("q_proj.weight"):
            w = _permute(w, cfg.num_attention_heads)
        elif key.endswith("k_proj.weight"):
            w = _permute(w, cfg.num_key_value_heads)
        writer.add_tensor(names.get_name(key, try_suffixes=(".weight",)), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
