"""`treegraft datastore build/info`, pipelines drafting from a datastore (lossless), and the
errors a wrong datastore gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import greedy_reference, memory_resources, tiny_llama, word_tokenizer
from tests.plugins.test_datastore import damaged_copies
from tests.test_cli import invoke, pipeline_file, wide_consoles  # noqa: F401
from tests.test_cli_errors import assert_clean
from treegraft.core.config import ConfigError
from treegraft.core.datastore import Datastore, DatastoreWarning
from treegraft.core.pipeline import load_pipeline


def test_build_tokenizes_text_and_jsonl_files_with_the_models_tokenizer(
    tmp_path: Path, model_dir: Path
) -> None:
    (tmp_path / "a.txt").write_text("t1 t2 t3 t4 t5")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"body": "t1 t2 t3 t9"}) + "\n" + json.dumps({"body": "t7"}) + "\n"
    )
    out = tmp_path / "store" / "s.npz"
    result = invoke(
        "datastore", "build", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"),
        "--tokenizer", str(model_dir), "--out", str(out), "--field", "body",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "10 tokens (vocabulary 64, contexts of 4 tokens)" in result.stdout
    store = Datastore.load(out)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok.convert_tokens_to_ids(f"t{i}") for i in (1, 2, 3, 4, 5, 1, 2, 3, 9, 7)]
    assert store.tokens.tolist() == ids  # no end-of-text token in a word vocabulary
    # t1 t2 t3 is followed by t9 in the second text (the first 4 positions have no context)
    assert store.lookup(ids[:3], min_n=3, length=2, cap=10).chain == (ids[8], ids[9])
    info = invoke("datastore", "info", str(out))
    assert info.exit_code == 0 and "10 tokens, vocabulary 64" in info.stdout


def test_build_refuses_a_file_given_twice(tmp_path: Path, model_dir: Path) -> None:
    """The same file named twice (also through another spelling of its path) doubled the
    corpus silently: its n-grams counted twice in every lookup."""
    (tmp_path / "a.txt").write_text("t1 t2 t3 t4 t5")
    out = tmp_path / "s.npz"
    again = tmp_path / "." / "a.txt"
    result = invoke(
        "datastore", "build", str(tmp_path / "a.txt"), str(again),
        "--tokenizer", str(model_dir), "--out", str(out),
    )  # fmt: skip
    assert_clean(result, 2, "INPUTS:", "is given twice (also as", "give each file once")
    assert not out.exists()


def test_build_and_info_refuse_bad_input_naming_it(tmp_path: Path, model_dir: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_text("t1 t2 t3 t4 t5 t6")
    out = str(tmp_path / "s.npz")

    def build(source: Path, to: str = out, tokenizer: str = str(model_dir)):
        return invoke("datastore", "build", str(source), "--tokenizer", tokenizer, "--out", to)

    assert_clean(build(tmp_path / "no.txt"), 2, "INPUTS: no such file", "no.txt")
    result = build(text, str(tmp_path / "s.bin"))
    assert_clean(result, 2, "--out: expected a file name ending in .npz")
    result = build(text, tokenizer="zoo:nope")
    assert_clean(result, 2, "--tokenizer:", "zoo:nope")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 3}\n')
    result = build(bad)
    assert_clean(result, 2, "bad.jsonl:1: expected an object with a string 'text' field")
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": 1, "content": "a b c"}\n')
    assert_clean(
        build(other),
        2,
        "other.jsonl:1: expected an object with a string 'text' field; its string fields: "
        "'content' (read one of them with --field NAME)",
    )
    result = invoke("datastore", "info", str(text))
    assert_clean(result, 2, "cannot read a datastore")
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    result = build(empty)
    assert_clean(result, 2, "INPUTS: no text in", "a datastore needs a corpus")
    assert not Path(out).exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the output's folder should be
    result = build(text, str(blocker / "s.npz"))
    assert_clean(result, 2, "--out: cannot write", "s.npz")
    folder = tmp_path / "folder.npz"
    folder.mkdir()  # a folder named like the output: refused as --out, before tokenizing
    assert_clean(build(text, str(folder)), 2, "--out:", "folder.npz", "a folder")
    result = build(tmp_path)  # a folder: its files are named, not guessed
    assert_clean(result, 2, "INPUTS:", "a folder, expected files; name its files")
    short = tmp_path / "short.txt"
    short.write_text("t1 t2")  # no position has the 4 tokens of context a key needs
    result = build(short)
    assert_clean(result, 2, "INPUTS: the corpus is 2 tokens long", "needs more than 4 (its")
    assert not Path(out).exists()
    upper = tmp_path / "b.JSONL"
    upper.write_text('{"text": 3}\n')  # a JSONL file whatever the suffix's case
    assert_clean(build(upper), 2, "b.JSONL:1: expected an object with a string 'text' field")
    long = tmp_path / ("x" * 3000)  # too long for the file system: no raw OSError
    assert_clean(build(long), 2, "INPUTS: no such file", "characters)")
    assert_clean(build(text, tokenizer=str(long)), 2, "--tokenizer:", "not found")


def test_build_checks_out_tokenizer_and_fields_before_tokenizing(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import treegraft.core.datastore as datastore

    def no_tokenizing(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenized before the arguments were checked")

    monkeypatch.setattr(datastore, "tokenize_texts", no_tokenizing)
    text = tmp_path / "a.txt"
    text.write_text("t1 t2 t3 t4 t5 t6")
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the output's folder should be: refused first

    def build(to: str, tokenizer: str = str(model_dir)):
        return invoke("datastore", "build", str(text), "--tokenizer", tokenizer, "--out", to)

    result = build(str(blocker / "sub" / "s.npz"))
    assert_clean(result, 2, "--out: cannot write", f"{blocker} is a file")
    result = build(str(tmp_path / "s.npz"), tokenizer=" ")  # named as the option, not internally
    assert_clean(result, 2, "--tokenizer: expected a model reference or a tokenizer.json, got ' '")
    assert "Resources" not in result.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 3}\n')
    result = invoke(
        "datastore", "build", str(bad), "--tokenizer", str(model_dir), "--out", str(tmp_path / "s.npz")
    )  # fmt: skip
    assert_clean(result, 2, "bad.jsonl:1: expected an object with a string 'text' field, got 3")


def test_build_refuses_a_tokenizer_file_that_is_not_one_and_text_that_is_not_utf8(
    tmp_path: Path, model_dir: Path
) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("def f(x):\n    return x\n")
    out = tmp_path / "s.npz"
    args = ("datastore", "build", str(text), "--out", str(out))
    result = invoke(*args, "--tokenizer", str(text))
    assert_clean(result, 2, f"--tokenizer: {text} is not a tokenizer.json (expected value at")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9 t1 t2\n")
    result = invoke(
        "datastore", "build", str(latin), "--out", str(out), "--tokenizer", str(model_dir)
    )
    assert_clean(result, 2, f"INPUTS: {latin} is not UTF-8 text: byte 0xe9 at offset 3 (line 1)")
    assert not out.exists()


def test_info_and_pipelines_refuse_damaged_stores_naming_the_file(tmp_path: Path) -> None:
    for name, message in damaged_copies(tmp_path).items():
        path = tmp_path / f"{name}.npz"
        stderr = assert_clean(invoke("datastore", "info", str(path)), 2, str(path))
        assert re.search(f"{path}: {message}", stderr), stderr
    res = memory_resources(target=tiny_llama(seed=1, vocab=40))
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram", "store": str(tmp_path / "trunc.npz")}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
    }
    with pytest.raises(
        ConfigError,
        match=r"drafters\.weak\.store: .*trunc.npz: cannot read a datastore \(a damaged",
    ):
        load_pipeline(spec, resources=res)


def test_a_pipeline_drafting_from_a_built_store_is_lossless(
    tmp_path: Path, model_dir: Path
) -> None:
    """The store holds the target's own greedy continuation, so its chains are drafted (and
    mostly accepted); the output is plain greedy decoding's either way."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    prompt = "t1 t2 t3 t4 t9 t8 t7"
    ids = torch.tensor(tok(prompt, add_special_tokens=False)["input_ids"])
    continuation = greedy_reference(model, ids, 24)
    corpus = tmp_path / "c.txt"
    corpus.write_text(tok.decode([*ids.tolist(), *continuation]))
    store = tmp_path / "s.npz"
    built = invoke(
        "datastore", "build", str(corpus), "--tokenizer", str(model_dir), "--out", str(store)
    )
    assert built.exit_code == 0, built.output

    def pipeline(**store_keys: object) -> Path:
        weak = {"name": "ngram", "max_ngram": 3, "min_ngram": 2, **store_keys}
        decoding = {"max_new_tokens": 24, "dtype": "float64", "device": "cpu"}
        return pipeline_file(tmp_path, str(model_dir), drafters={"weak": weak}, decoding=decoding)

    alone = load_pipeline(pipeline()).generate(ids)
    path = pipeline(store=str(store), store_depth=2)
    out = load_pipeline(path).generate(ids)
    assert list(out.token_ids) == list(alone.token_ids) == continuation
    assert out.summary.tau > alone.summary.tau + 2  # the store's chains were accepted (7.5 vs 2)
    result = invoke("generate", "--pipeline", str(path), "--prompt", prompt, "--compare")
    assert result.exit_code == 0 and "identical: yes" in result.stderr, result.output


def _other_and_own_stores(tmp_path: Path, model_dir: Path) -> Path:
    """Stores of one corpus (returned) in `tmp_path`: `other.npz` by a tokenizer of the same
    size with the ids reversed (its tokenizer.json left in `tmp_path`), `own.npz` by the
    target's."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": 62 - i for i in range(63)} | {"[UNK]": 63}  # the ids reversed
    other = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    other.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other.save(str(tmp_path / "tokenizer.json"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("t1 t2 t3 t4 t5 t6 t7")
    for name, tokenizer in (("other", tmp_path / "tokenizer.json"), ("own", model_dir)):
        built = invoke(
            "datastore", "build", str(corpus), "--tokenizer", str(tokenizer),
            "--out", str(tmp_path / f"{name}.npz"),
        )  # fmt: skip
        assert built.exit_code == 0, built.output
    return corpus


def test_a_store_built_with_another_tokenizer_of_the_same_size_is_refused(
    tmp_path: Path, model_dir: Path
) -> None:
    """Same vocabulary size, other ids: the store records its tokenizer and a target whose
    tokenizer.json differs refuses it, naming both (a store that recorded none still loads)."""
    corpus = _other_and_own_stores(tmp_path, model_dir)
    assert Datastore.load(tmp_path / "other.npz").vocab_size == 64
    info = invoke("datastore", "info", str(tmp_path / "other.npz"))
    assert re.search(r"tokenizer [0-9a-f]{16}$", info.stdout.strip()), info.stdout
    alone = tmp_path / "tokenizer-only"  # a folder holding a tokenizer.json and no model
    alone.mkdir()
    (alone / "tokenizer.json").write_bytes((tmp_path / "tokenizer.json").read_bytes())
    built = invoke(
        "datastore", "build", str(corpus), "--tokenizer", str(alone),
        "--out", str(tmp_path / "alone.npz"),
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    assert Datastore.load(tmp_path / "alone.npz").tokenizer == (
        Datastore.load(tmp_path / "other.npz").tokenizer
    )

    def load(store: Path) -> object:
        weak = {"name": "ngram", "store": str(store)}
        return load_pipeline(pipeline_file(tmp_path, str(model_dir), drafters={"weak": weak}))

    with pytest.raises(
        ConfigError,
        match=r"drafters\.weak\.store: '.*other\.npz' was built with another tokenizer than "
        r"the target's \(.*tokenizer\.json\).*--tokenizer",
    ):
        load(tmp_path / "other.npz")
    assert load(tmp_path / "own.npz").decoder.drafters[0].store.tokenizer is not None
    unrecorded = tmp_path / "unrecorded.npz"  # a store saved without its tokenizer
    Datastore.from_tokens(Datastore.load(tmp_path / "other.npz").tokens, 64).save(unrecorded)
    assert load(unrecorded).decoder.drafters[0].store.tokenizer is None


def test_a_target_with_only_slow_tokenizer_files_or_in_memory_checks_the_stores_tokenizer(
    tmp_path: Path, model_dir: Path
) -> None:
    """Without a tokenizer.json beside the target (a GPT-2 style folder of vocab.json and
    merges.txt, an in-memory model given its tokenizer) the store's recorded tokenizer is
    compared with the target's loaded tokenizer: another one is refused naming both."""
    _other_and_own_stores(tmp_path, model_dir)
    slow = tmp_path / "slow"  # the model's own word ids, as slow GPT-2 style files
    tiny_llama(seed=5, vocab=64).save_pretrained(slow)
    (slow / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(63)} | {"[UNK]": 63}))
    (slow / "merges.txt").write_text("#version: 0.2\n")
    (slow / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "GPT2Tokenizer", "unk_token": "[UNK]"}
            | dict.fromkeys(("bos_token", "eos_token", "pad_token"))
        )
    )
    assert not (slow / "tokenizer.json").exists()
    refused = r"drafters\.weak\.store: '.*other\.npz' was built with another tokenizer"

    def load(target: str, store: str, resources: object = None) -> object:
        weak = {"name": "ngram", "store": str(tmp_path / f"{store}.npz")}
        spec = pipeline_file(tmp_path, target, drafters={"weak": weak})
        return load_pipeline(spec, resources=resources)

    with pytest.raises(ConfigError, match=refused):
        load(str(slow), "other")
    assert load(str(slow), "own").decoder.drafters[0].store.tokenizer is not None
    res = memory_resources()
    res.add_model("mem:target", tiny_llama(seed=5, vocab=64), tokenizer=word_tokenizer(64))
    with pytest.raises(ConfigError, match=refused):
        load("mem:target", "other", res)
    assert load("mem:target", "own", res).decoder.drafters[0].store is not None


def test_a_store_of_another_vocabulary_or_an_unknown_zoo_store_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.npz"
    Datastore.from_tokens(np.array([1, 2, 99]), vocab_size=100).save(big)
    res = memory_resources(target=tiny_llama(seed=1, vocab=40))
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram", "store": str(big)}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
    }
    with pytest.raises(
        ConfigError,
        match=r"drafters\.weak\.store: .* vocabulary of 100, the target 'mem:target' has 40",
    ):
        load_pipeline(spec, resources=res)
    spec["drafters"]["weak"]["store"] = "zoo:nope"
    with pytest.raises(
        ConfigError, match=r"drafters\.weak\.store: unknown zoo datastore 'zoo:nope'"
    ):
        load_pipeline(spec, resources=res)
    spec["drafters"]["weak"]["store"] = str(tmp_path / "missing.npz")
    with pytest.raises(
        ConfigError, match=r"drafters\.weak\.store: .*missing.npz: cannot read a datastore"
    ):
        load_pipeline(spec, resources=res)


def test_a_min_ngram_above_the_stores_context_width_is_refused(tmp_path: Path) -> None:
    """The store keys at most `width` tokens: a longer `min_ngram` would never draft from it."""
    store = tmp_path / "s.npz"
    Datastore.from_tokens(np.array([1, 2, 3, 4, 5, 6]), vocab_size=40).save(store)
    res = memory_resources(target=tiny_llama(seed=1, vocab=40))
    weak = {"name": "ngram", "store": str(store), "min_ngram": 5, "max_ngram": 6}
    spec = {
        "target": "mem:target",
        "drafters": {"weak": weak},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
    }
    with pytest.raises(
        ConfigError,
        match=r"drafters\.weak\.min_ngram: 5 is above the context width of the store .*s\.npz' "
        r"\(4 tokens .*expected min_ngram <= 4",
    ):
        load_pipeline(spec, resources=res)
    weak["min_ngram"] = 4
    assert load_pipeline(spec, resources=res).decoder.drafters[0].store.width == 4


def test_a_target_zoo_corpus_cannot_be_built_for_drafts_from_its_context_and_says_so() -> None:
    """`zoo:corpus` is built from the tokenizer.json beside the target: a target without one (an
    in-memory model, a checkpoint with only a slow tokenizer) keeps the pipeline working, its
    n-gram drafter drafting from the context alone, with a warning that says why and what to do."""
    res = memory_resources(target=tiny_llama(seed=1, vocab=40))
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram", "store": "zoo:corpus", "memory": 8}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4, "adaptive": True},
        "decoding": {"max_new_tokens": 12, "dtype": "float64"},
    }
    with pytest.warns(
        DatastoreWarning,
        match=r"store: zoo:corpus is built in the target's tokens.*'mem:target' has none.*"
        r"treegraft datastore build.*drafting from the context alone",
    ):
        pipe = load_pipeline(spec, resources=res)
    assert pipe.decoder.drafters[0].store is None
    prompt = torch.tensor([3, 4, 5, 3, 4, 5, 3, 4])
    want = greedy_reference(res.models["mem:target"], prompt, 12)
    assert list(pipe.generate(prompt).token_ids) == want


def test_info_of_zoo_corpus_says_where_its_files_are(tmp_path: Path, monkeypatch) -> None:
    """`datastore info zoo:corpus` (a pipeline's store reference) was 'No such file or directory'."""
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path))
    result = invoke("datastore", "info", "zoo:corpus")
    message = " ".join(assert_clean(result, 2, "PATH: 'zoo:corpus' is a reference").split())
    assert f"into {tmp_path / 'datastores'} (corpus-*.npz); name one of those files" in message
