"""Train and load the byte-level BPE tokenizer shared by every zoo model."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from treegraft.zoo import formats

VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 1024


def train_tokenizer(texts: Iterable[str], out: Path, *, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train a byte-level BPE on ``texts`` and save it in Hugging Face format under ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(formats.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=formats.EOS,
        bos_token=formats.EOS,
        pad_token=formats.PAD,
        additional_special_tokens=[formats.USER, formats.ASSISTANT],
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def load_tokenizer(path: Path | None = None):
    """Load the zoo tokenizer (``AutoTokenizer``) from ``path`` or the packaged copy."""
    from transformers import AutoTokenizer

    from treegraft.zoo import tokenizer_path

    return AutoTokenizer.from_pretrained(str(path or tokenizer_path()))


def batched(texts: Iterable[str], size: int = 256) -> Iterator[list[str]]:
    """Group ``texts`` into lists of ``size`` for batch encoding."""
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
