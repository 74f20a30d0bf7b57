"""`zoo:corpus`: the zoo's training corpus as a datastore, built once into the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from treegraft.core.datastore import Datastore
from treegraft.core.resources import Resources
from treegraft.zoo import tokenizer_path
from treegraft.zoo.datastore import corpus_datastore


@pytest.mark.slow
def test_zoo_corpus_is_built_once_in_the_targets_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path))
    tokenizer = tokenizer_path() / "tokenizer.json"
    path = corpus_datastore(tokenizer, 8192)
    assert path.parent == tmp_path / "datastores" and path.is_file()
    built = path.stat().st_mtime_ns
    assert corpus_datastore(tokenizer, 8192) == path and path.stat().st_mtime_ns == built
    store = Datastore.load(path)
    assert store.vocab_size == 8192 and store.width == 4 and store.tokens.size > 1_000_000
    # through the resources, for a pipeline whose target is a zoo model
    res = Resources()
    res.target_ref = "zoo:target"
    again = res.datastore("zoo:corpus")
    assert again.tokens.size == store.tokens.size and res.datastore("zoo:corpus") is again
    assert list(res.datastores) == ["zoo:corpus for zoo:target"]  # another target: its own
    # text the corpus' word problems write: it knows how they go on
    from treegraft.zoo.tokenizer import load_tokenizer

    ids = load_tokenizer()("Answer:", add_special_tokens=False)["input_ids"]
    assert store.lookup(ids, min_n=1, length=2, cap=256) is not None
