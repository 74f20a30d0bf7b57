"""The token datastore (retrieval drafting): lookups against brute force, files, errors, and the
n-gram drafter drafting from it where the context has no match."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treegraft.core.datastore import Datastore, DatastoreError, read_texts
from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.tree import DraftTree
from treegraft.plugins.drafters.ngram import STORE_PROBE, NgramConfig, NgramDrafter


def brute_force(tokens: list[int], width: int, context: list[int], min_n: int):
    """The longest suffix (<= width, >= min_n) of `context` ending before some position
    p >= width of `tokens`, and those positions."""
    for n in range(min(width, len(context)), min_n - 1, -1):
        found = [p for p in range(width, len(tokens)) if tokens[p - n : p] == list(context[-n:])]
        if found:
            return n, found
    return 0, []


def mode(values: list[int]) -> tuple[int, int]:
    """The most frequent value (the smallest among equals) and its count."""
    counts = Counter(values)
    best = min(counts, key=lambda v: (-counts[v], v))
    return best, counts[best]


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), min_size=0, max_size=80),
    context=st.lists(st.integers(0, 5), min_size=0, max_size=6),
    min_n=st.integers(1, 3),
    vote=st.integers(0, 3),
    length=st.integers(1, 6),
)
def test_lookup_votes_the_continuation_of_the_longest_suffix(tokens, context, min_n, vote, length):
    store = Datastore.from_tokens(np.array(tokens, dtype=np.int32), vocab_size=6)
    got = store.lookup(context, min_n=min_n, length=length, cap=10_000, vote=vote)
    n, where = brute_force(tokens, store.width, context, min_n)
    if not where:
        assert got is None
        return
    assert (got.n, got.support) == (n, len(where))
    assert len(got.chain) == len(got.shares) <= length
    # the voted tokens: each the mode among the positions that agreed on the ones before
    voted = 0
    for t in range(min(vote, length)):
        if len(where) <= 1:
            break
        where = [p for p in where if p + t < len(tokens)]
        if not where:
            break
        best, count = mode([tokens[p + t] for p in where])
        assert got.chain[t] == best and got.shares[t] == count / len(where)
        where = [p for p in where if tokens[p + t] == best]
        voted += 1
    # the rest: the continuation of the earliest position that agreed on every voted token
    rest = list(got.chain[voted:])
    if where:
        first = min(where)
        assert rest == tokens[first + voted : first + length]
    else:
        assert rest == []
    assert all(share == 1.0 for share in got.shares[voted:])


def test_lookup_prefers_the_longer_suffix_and_backs_off():
    # (the first `width` positions have no full context and are not indexed)
    tokens = [0, 0, 0, 0, 1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3, 5, 6]
    store = Datastore.from_tokens(np.array(tokens), vocab_size=10)
    got = store.lookup([1, 2, 3], min_n=2, length=3, cap=100)
    assert (got.chain, got.n, got.support) == ((4, 9, 2), 3, 1)  # only 1 2 3 -> 4
    got = store.lookup([8, 2, 3], min_n=2, length=3, cap=100)  # 8 2 3 unseen; 2 3 thrice
    assert got.n == 2 and got.support == 3 and got.chain == (5, 6, 7)
    assert got.shares[0] == pytest.approx(2 / 3)
    assert store.lookup([8, 8], min_n=2, length=3, cap=100) is None


def test_tokens_outside_the_stores_vocabulary_match_nowhere():
    """A target with more tokens than the store's tokenizer writes ids the store never holds:
    only the suffix after the last such token is looked up (no overflowing key, no crash)."""
    tokens = [0, 0, 0, 0, 1, 2, 3, 4, 9, 2, 3, 5]
    store = Datastore.from_tokens(np.array(tokens), vocab_size=2**16)  # 4 tokens of 16 bits
    assert store.lookup([1, 2, 2**16 + 4], min_n=1, length=2, cap=100) is None
    assert store.lookup([1, 2, -1], min_n=1, length=2, cap=100) is None
    got = store.lookup([7, 2**16 + 1, 2, 3], min_n=1, length=2, cap=100)
    assert (got.n, got.support) == (2, 2)
    small = Datastore.from_tokens(np.array(tokens), vocab_size=10)  # 4 tokens of 4 bits
    assert small.lookup([1, 17, 3], min_n=1, length=2, cap=100).n == 1


def test_the_vote_is_capped_to_evenly_spread_positions():
    tokens = [1, 2] * 50 + [1, 3] * 50  # after 1: 2 fifty times, then 3 fifty times
    store = Datastore.from_tokens(np.array(tokens), vocab_size=4)
    full = store.lookup([1], min_n=1, length=1, cap=1000)
    few = store.lookup([1], min_n=1, length=1, cap=10)
    assert full.support == few.support == 98  # positions 5, 7, .. 199 (from width 4 on)
    assert few.shares[0] == pytest.approx(0.5, abs=0.1)  # spread over both halves, not the first 10


@pytest.mark.parametrize(
    ("vocab", "width", "bits"), [(2, 4, 1), (8192, 4, 13), (49152, 4, 16), (128256, 3, 17)]
)
def test_contexts_per_key_follow_the_vocabulary(vocab, width, bits):
    rng = np.random.default_rng(0)
    tokens = rng.integers(max(0, vocab - 3), vocab, 200)  # the largest ids: the highest bits
    store = Datastore.from_tokens(tokens, vocab_size=vocab)
    assert (store.width, store.bits) == (width, bits)
    assert np.all(np.diff(store.keys.astype(object)) >= 0)
    context = tokens[50 : 50 + width].tolist()
    got = store.lookup(context, min_n=width, length=2, cap=1000)
    n, where = brute_force(tokens.tolist(), width, context, width)
    assert got.n == n == width and got.support == len(where)


def test_a_saved_datastore_loads_the_same(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 50, 500)
    store = Datastore.from_tokens(tokens, vocab_size=50)
    store.save(tmp_path / "s.npz")
    back = Datastore.load(tmp_path / "s.npz")
    assert np.array_equal(back.tokens, store.tokens) and np.array_equal(back.keys, store.keys)
    for context in ([3, 4], [1], [7, 7, 7, 7]):
        assert back.lookup(context, min_n=1, length=4, cap=64) == store.lookup(
            context, min_n=1, length=4, cap=64
        )


def test_a_save_writes_the_tokenizer_and_an_interrupted_one_keeps_the_old_file(
    tmp_path, monkeypatch
):
    path = tmp_path / "s.npz"
    Datastore.from_tokens(np.arange(8), vocab_size=10, tokenizer="abc").save(path)
    assert Datastore.load(path).tokenizer == "abc"

    def interrupted(file, **arrays):
        Path(file).write_bytes(b"PK\x03\x04 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Datastore.from_tokens(np.arange(6), vocab_size=10).save(path)
    assert Datastore.load(path).tokens.tolist() == list(range(8))  # the old store, whole
    assert [p.name for p in tmp_path.iterdir()] == ["s.npz"]  # no partial file left


def test_bad_datastores_are_refused_naming_the_problem(tmp_path):
    with pytest.raises(
        DatastoreError, match=r"ids must lie in 0 \.\. 9 \(vocab_size\), got 0 \.\. 12"
    ):
        Datastore.from_tokens(np.array([0, 12]), vocab_size=10)
    with pytest.raises(DatastoreError, match=r"expected a 1-D array, got shape \(2, 2\)"):
        Datastore.from_tokens(np.zeros((2, 2)), vocab_size=10)
    with pytest.raises(DatastoreError, match="cannot read a datastore"):
        Datastore.load(tmp_path / "missing.npz")
    with pytest.raises(DatastoreError, match=r"expected a datastore file, got ''"):
        Datastore.load("")  # not the current folder
    with pytest.raises(DatastoreError, match=r"cannot read a datastore \(embedded null byte\)"):
        Datastore.load(f"{tmp_path}/s\0.npz")
    with pytest.raises(DatastoreError, match=r"x\.\.\.x+ \(3000 characters\): cannot read"):
        Datastore.load("x" * 3000)  # the name shortened in the message
    np.savez(tmp_path / "other.npz", tokens=np.zeros(3))
    with pytest.raises(
        DatastoreError, match=r"not a treegraft datastore.*treegraft datastore build"
    ):
        Datastore.load(tmp_path / "other.npz")
    good = Datastore.from_tokens(np.arange(20) % 7, vocab_size=7)
    np.savez(tmp_path / "short.npz", format=np.array("treegraft-datastore-1"), tokens=good.tokens,
             positions=good.positions[:-1], vocab_size=np.array(7))  # fmt: skip
    with pytest.raises(DatastoreError, match=r"damaged datastore \(its positions do not fit"):
        Datastore.load(tmp_path / "short.npz")
    np.savez(tmp_path / "order.npz", format=np.array("treegraft-datastore-1"), tokens=good.tokens,
             positions=good.positions[::-1], vocab_size=np.array(7))  # fmt: skip
    with pytest.raises(DatastoreError, match=r"damaged datastore \(its positions are out of order"):
        Datastore.load(tmp_path / "order.npz")
    with pytest.raises(DatastoreError, match=r"vocab_size: expected 1 \.\. 2\*\*32, got 0"):
        Datastore.from_tokens(np.zeros(0), vocab_size=0)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DatastoreError, match="cannot read a datastore"):
        Datastore.load(tmp_path / "junk.npz")


def test_corpus_files_are_read_one_text_per_line_or_file(tmp_path):
    (tmp_path / "a.txt").write_text("one text\nstill the same text\n")
    (tmp_path / "b.jsonl").write_text('{"text": "first"}\n\n{"text": "second", "x": 1}\n')
    assert read_texts(tmp_path / "a.txt") == ["one text\nstill the same text\n"]
    assert read_texts(tmp_path / "b.jsonl") == ["first", "second"]
    (tmp_path / "c.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    with pytest.raises(ArgumentError, match=r"c.jsonl:2: expected an object with a string 'text'"):
        read_texts(tmp_path / "c.jsonl")
    (tmp_path / "d.jsonl").write_text("{oops\n")
    with pytest.raises(ArgumentError, match=r"d.jsonl:1: malformed JSON at column 2"):
        read_texts(tmp_path / "d.jsonl")
    (tmp_path / "e.jsonl").write_text('{"text": "ok"}\n["a list"]\n')
    with pytest.raises(ArgumentError, match=r"e.jsonl:2: expected a JSON object, got list"):
        read_texts(tmp_path / "e.jsonl")
    (tmp_path / "f.txt").write_bytes(b"caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(
        ArgumentError, match=r"INPUTS: .*f.txt is not UTF-8 text: byte 0xe9 at offset 3 \(line 1\)"
    ):
        read_texts(tmp_path / "f.txt")
    for name, encoding in (("le", "utf-16"), ("be", "utf-16-be")):  # Windows editors' "Unicode"
        (tmp_path / f"{name}.txt").write_bytes(b"\xfe\xff" * (name == "be") + "ab".encode(encoding))
        with pytest.raises(
            ArgumentError,
            match=rf"{name}.txt is not UTF-8 text: .*; save it as UTF-8 \(it starts "
            r"with a UTF-16 byte-order mark\)",
        ):
            read_texts(tmp_path / f"{name}.txt")
    with pytest.raises(ArgumentError, match=r"--corpus: .*missing.txt not found"):
        read_texts(tmp_path / "missing.txt", what="--corpus")


def damaged_copies(tmp_path) -> dict[str, str]:
    """Files that are not a datastore `save` wrote, and the message each is refused with."""
    good = Datastore.from_tokens(np.arange(40) % 9, vocab_size=9)
    good.save(tmp_path / "good.npz")
    saved = dict(np.load(tmp_path / "good.npz"))
    (tmp_path / "trunc.npz").write_bytes((tmp_path / "good.npz").read_bytes()[:300])
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "text.npz").write_text("def f(x):\n    return x\n")
    np.savez(tmp_path / "tok2d.npz", **{**saved, "tokens": saved["tokens"].reshape(2, -1)})
    np.savez(tmp_path / "tokf.npz", **{**saved, "tokens": saved["tokens"].astype(float)})
    np.savez(tmp_path / "vocab.npz", **{**saved, "vocab_size": np.array(4)})
    np.savez(tmp_path / "vstr.npz", **{**saved, "vocab_size": np.array("nine")})
    np.savez(tmp_path / "tokint.npz", **{**saved, "tokenizer": np.array([1, 2])})
    np.savez(tmp_path / "old.npz", **{**saved, "format": np.array("treegraft-datastore-0")})
    return {
        "trunc": r"cannot read a datastore \(a damaged or incomplete .npz file: ",
        "empty": r"cannot read a datastore \(an empty file\); a datastore is the .npz file",
        "text": r"cannot read a datastore \(not an .npz file\); a datastore is the .npz file",
        "tok2d": r"a damaged datastore \(tokens: expected a 1-D array of ints, got int32 of shape "
        r"\[2, 20\]\)",
        "tokf": r"a damaged datastore \(tokens: expected a 1-D array of ints, got float64",
        "vocab": r"a damaged datastore \(its token ids 0 \.\. 8 do not fit its vocab_size 4\)",
        "vstr": r"a damaged datastore \(vocab_size: expected an int in 1 \.\. 2\*\*32, got nine\)",
        "tokint": r"a damaged datastore \(tokenizer: expected a string, got int64 of shape \[2\]\)",
        "old": r"a datastore of format 'treegraft-datastore-0', this version reads "
        r"'treegraft-datastore-1'; build it again",
    }


def test_damaged_or_foreign_files_are_refused_naming_the_file(tmp_path):
    for name, message in damaged_copies(tmp_path).items():
        with pytest.raises(DatastoreError, match=f"{tmp_path}/{name}.npz: {message}"):
            Datastore.load(tmp_path / f"{name}.npz")


# ---------------------------------------------------------------------------- the n-gram drafter

CORPUS = [7, 8, 1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 4, 6, 0, 1, 2, 3, 4, 5]


def drafter_with_store(context: list[int], **cfg) -> NgramDrafter:
    store = Datastore.from_tokens(np.array(CORPUS), vocab_size=10)
    d = NgramDrafter(NgramConfig(max_ngram=3, min_ngram=2, chain_len=2, **cfg), store=store)
    d.begin(torch.tensor(context), max_len=64)
    return d


def test_the_store_drafts_where_the_context_has_no_match():
    d = drafter_with_store([6, 1, 2, 3], store_chain=3)
    prop = d.expand(DraftTree.from_root(3), torch.tensor([0]), k=4)
    # (1 2 3) never occurred in the context; in the corpus 4 follows it thrice, then 5 twice
    # of three; then the earliest of those two positions goes on with 9
    assert prop.tokens.tolist() == [[4, 5, 9]]
    shares = [1.0, 2 / 3, 1.0]  # times the prior rate 1/2
    assert prop.logp[0].tolist() == pytest.approx([math.log(0.5 * s) for s in shares], rel=1e-6)


def test_the_context_comes_first_and_the_store_only_at_shallow_nodes():
    d = drafter_with_store([1, 2, 3, 8, 1, 2, 3], store_chain=3)
    prop = d.expand(DraftTree.from_root(3), torch.tensor([0]), k=4)
    assert prop.tokens.tolist() == [[8, 1]]  # the context's own continuation, not the store's
    d = drafter_with_store([6, 5, 1, 2], store_chain=2, store_depth=0)
    tree = DraftTree.from_parents(torch.tensor([2, 3]), torch.tensor([-1, 0]))
    assert d.expand(tree, torch.tensor([1]), k=4).n_rows == 0  # depth 1 > store_depth 0
    assert d.expand(tree, torch.tensor([0]), k=4).tokens.tolist() == [[3, 4]]
    d = drafter_with_store([6, 5, 1, 2], store_chain=2, store_depth=1)
    assert d.expand(tree, torch.tensor([1]), k=4).tokens.tolist() == [[4, 5]]


def test_store_rows_learn_their_rate_and_peek_reads_them():
    d = drafter_with_store([6, 1, 2, 3], store_chain=2)
    assert d.peek(DraftTree.from_root(3)).chain == (4, 5)
    tree = DraftTree.from_root(3)
    prop = d.expand(tree, torch.tensor([0]), k=4)
    assert prop.tokens.tolist() == [[4, 5]]
    assert prop.logp[0].exp().tolist() == pytest.approx([0.5, (2 / 3) * 0.5])
    _, node_of = tree.extend(prop, 0)
    d.commit(torch.tensor([0, int(node_of[0, 0])]), torch.tensor([4, 7]))  # 4 right, 5 wrong
    cal = d.store_calibration
    assert cal.hits[3].tolist() == [1, 0] and cal.shares[3].tolist() == pytest.approx([1, 2 / 3])
    assert d.calibration.trials.sum() == 0  # the context's rates are not the store's


def test_a_text_whose_store_chains_keep_failing_stops_looking_them_up_but_probes():
    d = drafter_with_store([6, 1, 2, 3], store_chain=2)
    cal = d.store_calibration
    tree = DraftTree.from_root(3)
    assert cal.wanted() and d.expand(tree, torch.tensor([0]), k=4).n_rows == 1  # prior: 1 in 2
    d.rewind()
    for _ in range(4):  # four first tokens wrong: (0 + 1) / (4 + 2) < STORE_FLOOR
        cal.record(3, 0, 1.0, False)
    assert (cal.first_hits, cal.first_trials) == (0, 4)
    looked = []
    for _ in range(2 * STORE_PROBE):  # steps: the same answer however often a step asks
        rows = {d.expand(tree, torch.tensor([0]), k=4).n_rows for _ in range(3)}
        assert len(rows) == 1 and (d.peek(tree).chain != ()) == (rows == {1})
        looked.append(rows.pop())
        d.rewind()
        cal.stepped()  # what `commit` does once the step's outcomes are recorded
    assert looked == ([0] * (STORE_PROBE - 1) + [1]) * 2  # only the probe steps look it up
    cal.record(3, 0, 1.0, True)  # a probe that wins: (1 + 1) / (5 + 2) >= 0.2 again
    assert cal.wanted() and d.expand(tree, torch.tensor([0]), k=4).n_rows == 1
    d.begin(torch.tensor([6, 1, 2, 3]), max_len=64)  # a new text starts from the prior
    assert d.store_calibration.first_trials == 0 and d.store_calibration.wanted()


def test_commit_counts_the_steps_a_failing_store_waits():
    d = drafter_with_store([6, 1, 2, 3], store_chain=2)
    for _ in range(4):
        d.store_calibration.record(3, 0, 1.0, False)
    d.commit(torch.tensor([0]), torch.tensor([9]))
    d.commit(torch.tensor([0]), torch.tensor([9]))
    assert d.store_calibration.waited == 2


def test_memory_carries_the_store_rates_but_not_the_gate():
    """`memory`: a new text's store rates start from the last text's (scaled to at most
    `memory` shares per entry); its gate starts afresh (a store may suit one text, not the next)."""
    d = drafter_with_store([6, 1, 2, 3], store_chain=2, memory=2)
    cal = d.store_calibration
    for hit in (True, True, True, False):  # four first tokens of share 1: three right
        cal.record(3, 0, 1.0, hit)
    cal.record(3, 1, 0.5, True)
    d.begin(torch.tensor([6, 1, 2, 3]), max_len=64)
    new = d.store_calibration
    assert (new.first_hits, new.first_trials, new.waited) == (0, 0, 0)
    assert new.shares[3].tolist() == pytest.approx([2.0, 0.5])
    assert new.hits[3].tolist() == pytest.approx([1.5, 1.0])
    prop = d.expand(DraftTree.from_root(3), torch.tensor([0]), k=4)
    rates = [(1.5 + 1) / (2 + 2), (1 + 1) / (0.5 + 2)]
    assert prop.logp[0].exp().tolist() == pytest.approx([rates[0], (2 / 3) * rates[1]], rel=1e-6)


def test_a_datastore_error_is_a_treegraft_error() -> None:
    """The command line reports it as bad input, and so does any caller catching TreegraftError."""
    from treegraft.core.errors import TreegraftError

    assert issubclass(DatastoreError, TreegraftError) and issubclass(DatastoreError, ValueError)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: Datastore.from_tokens([1.5, 2.5], 9),
            "tokens: expected a 1-D array or list of int",
        ),
        (lambda: Datastore.from_tokens(np.array([2**40]), 9), "tokens: ids must lie in 0 .. 8"),
        (lambda: Datastore.from_tokens(None, 9), "tokens: expected a 1-D array or list of int"),
        (lambda: Datastore.from_tokens([1], "9"), "vocab_size: expected 1 .. 2**32, got '9'"),
        (lambda: Datastore.load(None), "Datastore.load: path: expected a file path"),
        (
            lambda: Datastore.from_tokens([1], 9).save("/"),
            "/: cannot write a datastore there: a di",
        ),
        (lambda: STORE.lookup([1, 2], min_n=None, length=3, cap=8), "lookup: min_n: expected an"),
        (lambda: STORE.lookup([1, 2], min_n=1, length=3, cap=1.5), "lookup: cap: expected an int"),
        (lambda: STORE.lookup(None, min_n=1, length=3, cap=8), "lookup: context: expected a seq"),
        (
            lambda: STORE.lookup([1, 2.7], min_n=1, length=3, cap=8),  # was looked up as [1, 2]
            "Datastore.lookup: context[1]: expected an int token id, got 2.7",
        ),
        (
            lambda: STORE.lookup(np.array([0.0, 1.0, 2.0]), min_n=1, length=3, cap=8),
            "Datastore.lookup: context[0]: expected an int token id, got 0.0",
        ),
        (
            lambda: STORE.lookup([1, True], min_n=1, length=3, cap=8),
            "Datastore.lookup: context[1]: expected an int token id, got True",
        ),
        (lambda: read_texts(3), "read_texts: path: expected a file path (str or Path), got int 3"),
    ],
)
def test_the_datastore_api_names_a_bad_argument(call, message: str) -> None:
    """Once floats truncated and ids past int32 wrapped into a store silently, or raw TypeErrors,
    an IndexError, IsADirectoryError."""
    with pytest.raises(TreegraftError) as info:
        call()
    assert message in str(info.value)


STORE = Datastore.from_tokens(np.arange(40) % 5, 5)
