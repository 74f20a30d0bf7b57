"""The causal-LM runner: tree forwards equal plain forwards; commit compacts the cache correctly."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import tiny_llama
from treegraft.core.runner import CausalLMRunner, causal_lm, watch_forwards
from treegraft.core.tree import DraftTree


def plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def random_tree(rng: torch.Generator, root: int, n: int, vocab: int) -> DraftTree:
    parents, tokens = [-1], [root]
    for i in range(1, n):
        p = int(torch.randint(0, i, (1,), generator=rng))
        siblings = {t for q, t in zip(parents, tokens, strict=True) if q == p}
        free = [t for t in range(vocab) if t not in siblings]
        parents.append(p)
        tokens.append(free[int(torch.randint(0, len(free), (1,), generator=rng))])
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


def path_ids(tree: DraftTree, node: int) -> list[int]:
    return tree.tokens[tree.path_to(node)].tolist()


def check_trees_and_commits(
    model,
    runner: CausalLMRunner,
    seq: list[int],
    rng: torch.Generator,
    *,
    steps: int,
    nodes: int,
    vocab: int,
    bonus,
    tol: float = 1e-9,
) -> list[int]:
    """`steps` random trees of `nodes` nodes through `runner` (begun on `seq`): every node's
    logits are the plain forward's of its path; then the last node's path is committed with the
    token `bonus()` after it (`tol`: the relative and absolute tolerance). Returns the
    sequence committed."""
    for _ in range(steps):
        tree = random_tree(rng, seq[-1], nodes, vocab)
        with torch.no_grad():
            logits = runner.forward_tree(tree)
        for node in range(tree.n_nodes):
            want = plain_logits(model, seq + path_ids(tree, node)[1:])
            torch.testing.assert_close(logits[node], want, rtol=tol, atol=tol)
        path = tree.path_to(tree.n_nodes - 1)
        new = [*tree.tokens[path[1:]].tolist(), bonus()]
        runner.commit(path, torch.tensor(new))
        seq = seq + new
    return seq


@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(1, 20))
def test_tree_forward_matches_plain_forward_of_every_path(
    seed: int, n_nodes: int, prompt_len: int
) -> None:
    model = tiny_llama(seed=seed % 7, vocab=32)
    rng = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 32, (prompt_len,), generator=rng)
    runner = CausalLMRunner(model)
    runner.begin(prompt, max_len=64)
    tree = random_tree(rng, int(prompt[-1]), n_nodes, 32)
    with torch.no_grad():
        logits = runner.forward_tree(tree)
    for i in range(n_nodes):
        ids = prompt.tolist() + path_ids(tree, i)[1:]
        torch.testing.assert_close(logits[i], plain_logits(model, ids), rtol=1e-9, atol=1e-9)


@given(st.integers(0, 10_000), st.integers(2, 10))
def test_incremental_forwards_and_commit_match_plain_forwards(seed: int, steps: int) -> None:
    """Trees forwarded in two parts, commits of random accepted paths, lazy catch-up after skipped steps."""
    model = tiny_llama(seed=seed % 5, vocab=24)
    rng = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 24, (5,), generator=rng).tolist()
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=16)  # small on purpose: the cache must grow
    for _ in range(steps):
        tree = random_tree(rng, seq[-1], int(torch.randint(1, 9, (1,), generator=rng)), 24)
        skip = bool(torch.randint(0, 3, (1,), generator=rng) == 0)  # a drafter not called this step
        if not skip:
            half = max(1, tree.n_nodes // 2)
            with torch.no_grad():
                first = runner.forward_tree(tree.select(torch.arange(half)))
                rest = runner.forward_tree(tree)
            logits = torch.cat([first, rest])
            leaf = int(torch.randint(0, tree.n_nodes, (1,), generator=rng))
            torch.testing.assert_close(
                logits[leaf],
                plain_logits(model, seq + path_ids(tree, leaf)[1:]),
                rtol=1e-9,
                atol=1e-9,
            )
        leaf = int(torch.randint(0, tree.n_nodes, (1,), generator=rng))
        path = tree.path_to(leaf)
        bonus = int(torch.randint(0, 24, (1,), generator=rng))
        new = [*tree.tokens[path[1:]].tolist(), bonus]
        runner.commit(path, torch.tensor(new))
        seq += new
    assert runner.committed_ids().tolist() == seq
    with torch.no_grad():
        final = runner.forward_tree(DraftTree.from_root(seq[-1]))
    torch.testing.assert_close(final[0], plain_logits(model, seq), rtol=1e-9, atol=1e-9)
    assert runner.n_cached + runner.n_pending == len(seq) - 1


def test_host_and_device_blocks_agree(monkeypatch) -> None:
    """A CPU runner builds its forward blocks (ids, positions, visibility) in numpy; the torch
    version other devices use gives the same tensors, with pending tokens and partly seen trees."""
    block = CausalLMRunner._block
    checked: list[int] = []

    def both(self, tree, start, pending):
        got = block(self, tree, start, pending)
        want = self._block_on_device(tree, start, pending)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w)
        checked.append(pending)
        return got

    monkeypatch.setattr(CausalLMRunner, "_block", both)
    model = tiny_llama(seed=1, vocab=24)
    rng = torch.Generator().manual_seed(3)
    seq = torch.randint(0, 24, (6,), generator=rng).tolist()
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=64)
    for step in range(6):
        tree = random_tree(rng, seq[-1], 3 + step, 24)
        if step != 2:  # step 2 forwards nothing: the next forward carries pending tokens
            with torch.no_grad():
                runner.forward_tree(tree.select(torch.arange(2)))
                runner.forward_tree(tree)
        path = tree.path_to(tree.n_nodes - 1)
        new = [*tree.tokens[path[1:]].tolist(), 5]
        runner.commit(path, torch.tensor(new))
        seq += new
    assert len(checked) == 10 and max(checked) > 1


def test_prefill_is_lazy_and_counts_one_forward() -> None:
    model = tiny_llama(seed=0, vocab=16)
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor([1, 2, 3, 4]), max_len=32)
    assert runner.forwards == 0 and runner.n_cached == 0
    with torch.no_grad():
        runner.forward_tree(DraftTree.from_root(4))
    assert runner.forwards == 1


@pytest.mark.parametrize("forward", ["lean", "fused"])
def test_a_long_prompt_prefills_as_a_causal_chain_without_a_mask(monkeypatch, forward) -> None:
    """The first forward of a prompt of `SPLIT_MIN_ROWS` tokens or more runs the prompt alone
    as a causal chain, with no `[T, T]` visibility built (its cost, quadratic in the prompt,
    and the masked attention that skips nothing made a long prompt's prefill half again as
    slow as `generate`'s), then the tree's other nodes over it: every node's logits are still
    the plain forward's, and the root's are `transformers`' unmasked forward's bit for bit."""
    built: list[tuple[int, int]] = []
    visibility = causal_lm.host_visibility

    def recorded(tree, start, pending, **kwargs):
        mask = visibility(tree, start, pending, **kwargs)
        built.append(mask.shape)
        return mask

    monkeypatch.setattr(causal_lm, "host_visibility", recorded)
    monkeypatch.setattr(causal_lm, "SPLIT_MIN_ROWS", 100)  # the tiny model takes 512 positions
    model = tiny_llama(seed=4, vocab=32, heads=4, kv_heads=2, dtype=torch.float32)
    rng = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 32, (140,), generator=rng)
    runner = CausalLMRunner(model, forward=forward)
    runner.begin(prompt, max_len=256)
    sizes: list[int] = []
    stop = watch_forwards(model, sizes.append)
    tree = random_tree(rng, int(prompt[-1]), 6, 32)
    with torch.no_grad():
        logits = runner.forward_tree(tree)
        plain = model(prompt[None], logits_to_keep=1).logits[0, -1]
    stop()
    assert sizes == [prompt.numel(), 5] and built == [(5, prompt.numel() + 5)]
    if forward == "lean":
        assert torch.equal(logits[0], plain)
    model64 = model.double()
    for i in range(1, 6):  # the nodes after the causal prefill: their plain forwards' logits
        ids = prompt.tolist() + path_ids(tree, i)[1:]
        want = plain_logits(model64, ids).float()
        torch.testing.assert_close(logits[i], want, rtol=1e-4, atol=1e-4)


def test_a_shorter_prompt_prefills_with_its_tree_in_one_forward_or_causally_alone(
    monkeypatch,
) -> None:
    """Below `SPLIT_MIN_ROWS` tokens an extra forward costs more than the causal kernel saves:
    the prompt goes with the tree in one masked block; a tree of its root alone is the prompt
    alone, causal from `CAUSAL_MIN_ROWS` tokens on (no mask built), as plain decoding's is."""
    monkeypatch.setattr(causal_lm, "SPLIT_MIN_ROWS", 100)
    model = tiny_llama(seed=4, vocab=32)
    prompt = torch.arange(98) % 32
    runner = CausalLMRunner(model)
    causal = []
    runner._lean = _Spy(runner._lean, causal)
    with torch.no_grad():
        for n in (4, 1):
            runner.begin(prompt, max_len=256)
            runner.forward_tree(random_tree(torch.Generator(), int(prompt[-1]), n, 32))
    assert runner.forwards == 2 and causal == [False, True]


class _Spy:
    """A lean forward recording whether each call was causal."""

    def __init__(self, lean, causal: list[bool]) -> None:
        self.lean, self.causal = lean, causal

    def __call__(self, *args, causal: bool = False, **kwargs):
        self.causal.append(causal)
        return self.lean(*args, causal=causal, **kwargs)


def test_a_cache_growth_interrupted_leaves_the_runner_usable(monkeypatch) -> None:
    """A KeyboardInterrupt (or an error) right after the cache grew, before the committed ids
    did, left them shorter than the cache: every later generation reusing the cache failed
    with a RuntimeError once past their end. The ids grow first now."""
    from treegraft.core.runner.kv_cache import TreeKVCache

    model = tiny_llama(seed=0, vocab=16)
    runner = CausalLMRunner(model)
    grow = TreeKVCache.grow

    def interrupted(cache: TreeKVCache, capacity: int) -> None:
        grow(cache, capacity)
        raise KeyboardInterrupt

    runner.begin(torch.tensor([1, 2, 3, 4]), max_len=6)  # 6 slots: a forward of 7 grows them
    monkeypatch.setattr(TreeKVCache, "grow", interrupted)
    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        runner.forward_tree(
            DraftTree.from_parents(torch.tensor([4, 5, 6, 7]), torch.tensor([-1, 0, 1, 2]))
        )
    monkeypatch.setattr(TreeKVCache, "grow", grow)
    prompt = [int(t) % 16 for t in range(3, 3 + 40)]  # past the ids' old end, within the cache
    runner.begin(torch.tensor(prompt), max_len=64)
    with torch.no_grad():
        logits = runner.forward_tree(DraftTree.from_root(prompt[-1]))
    torch.testing.assert_close(logits[0], plain_logits(model, prompt))


def test_begin_rejects_bad_prompts() -> None:
    import pytest

    runner = CausalLMRunner(tiny_llama(seed=0, vocab=16))
    with pytest.raises(ValueError, match="non-empty"):
        runner.begin(torch.tensor([], dtype=torch.long), max_len=8)
    with pytest.raises(ValueError, match="does not fit"):
        runner.begin(torch.arange(8), max_len=8)


def test_tree_attention_kernel_path_matches_sdpa():
    """With attn_implementation='treegraft_tree' the runner passes the compact mask to the kernel."""
    from treegraft.kernels.tree_attention.hf import IMPLEMENTATION, register

    register()
    sdpa = tiny_llama(seed=3, vocab=32)
    fused = tiny_llama(seed=3, vocab=32)
    fused.set_attn_implementation(IMPLEMENTATION)
    assert fused.config._attn_implementation == IMPLEMENTATION
    rng = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 32, (9,), generator=rng)
    tree = random_tree(rng, int(prompt[-1]), 10, 32)
    outs = []
    for model in (sdpa, fused):
        runner = CausalLMRunner(model)
        runner.begin(prompt, max_len=40)
        with torch.no_grad():
            first = runner.forward_tree(tree)
            runner.commit(
                tree.path_to(tree.n_nodes - 1),
                torch.tensor([*tree.tokens[tree.path_to(tree.n_nodes - 1)[1:]].tolist(), 5]),
            )
            second = runner.forward_tree(random_tree(rng, 5, 6, 32))
        outs.append(torch.cat([first, second]))
        rng = torch.Generator().manual_seed(0)
        torch.randint(0, 32, (9,), generator=rng)
        random_tree(rng, int(prompt[-1]), 10, 32)
    assert runner._tree_kernel
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-9)


def test_rewind_lets_a_step_be_rebuilt_with_another_tree():
    model = tiny_llama(seed=6, vocab=24)
    rng = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 24, (7,), generator=rng)
    runner = CausalLMRunner(model)
    runner.begin(prompt, max_len=40)
    with torch.no_grad():
        runner.forward_tree(random_tree(rng, int(prompt[-1]), 9, 24))
        runner.rewind()
        other = random_tree(rng, int(prompt[-1]), 5, 24)
        logits = runner.forward_tree(other)
    for i in range(other.n_nodes):
        ids = prompt.tolist() + path_ids(other, i)[1:]
        torch.testing.assert_close(logits[i], plain_logits(model, ids), rtol=1e-9, atol=1e-9)


def test_restrict_output_picks_columns_and_checks_its_rows() -> None:
    model = tiny_llama(seed=3, vocab=32)
    prompt = torch.tensor([4, 9, 1])
    tree = DraftTree.from_parents(torch.tensor([1, 7, 8]), torch.tensor([-1, 0, 1]))
    full = CausalLMRunner(model)
    full.begin(prompt, max_len=16)
    with torch.no_grad():
        expected = full.forward_tree(tree)
    runner = CausalLMRunner(model)
    runner.restrict_output(torch.tensor([30, 2, 5]))
    runner.begin(prompt, max_len=16)
    assert runner.n_outputs == 3
    with torch.no_grad():
        got = runner.forward_tree(tree)
    torch.testing.assert_close(got, expected[:, [30, 2, 5]], rtol=1e-12, atol=1e-12)
    runner.restrict_output(None)
    assert runner.n_outputs == 32 and runner.output_rows is None
    for rows, message in [
        (torch.tensor([0, 32]), r"token ids in \[0, 32\), got 32"),
        (torch.tensor([-1, 3]), r"token ids in \[0, 32\), got -1"),
        (torch.tensor([3, 3]), "distinct"),
        (torch.zeros(0, dtype=torch.long), "non-empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            runner.restrict_output(rows)


@pytest.mark.parametrize(
    ("architecture", "forward"),
    [("llama", "auto"), ("llama", "fused"), ("llama", "transformers"), ("mistral", "auto")],
)
def test_forward_chain_is_the_plain_forward_of_the_chain(architecture: str, forward: str) -> None:
    """`forward_chain` grows a chain from the root one token at a time (the lean forwards with
    no mask): each token's logits are the plain forward's of the prompt and the chain so far,
    with tokens pending from a step the runner skipped, across commits that keep part of the
    chain, and past a sliding window (the mask path with the model's rule)."""
    from treegraft.conformance.tiny import tiny_model

    if architecture == "mistral":
        model = tiny_model("mistral", seed=3, sliding_window=5)
    else:
        model = tiny_llama(seed=3, vocab=32)
    vocab = model.config.vocab_size
    # the fused forward's RoPE table is float32 (a drafter's): equal to about 1e-7
    tol = 1e-6 if forward == "fused" else 1e-9
    rng = torch.Generator().manual_seed(4)
    seq = torch.randint(0, vocab, (6,), generator=rng).tolist()
    runner = CausalLMRunner(model, forward=forward)
    runner.begin(torch.tensor(seq), max_len=8)  # small on purpose: the cache must grow
    with pytest.raises(ValueError, match="forward_chain: the step's root is not forwarded"):
        runner.forward_chain(torch.tensor(1))
    for step in range(4):
        if step == 1:  # a step the drafter sat out: its tokens wait as pending ones
            runner.commit(torch.tensor([0]), torch.tensor([seq[-1] + 1]))
            seq.append(seq[-1] + 1)
        chain = [seq[-1]]
        with torch.no_grad():
            logits = runner.forward_tree(DraftTree.from_root(seq[-1]))[0]
            for _ in range(5):
                torch.testing.assert_close(
                    logits, plain_logits(model, seq + chain[1:]), rtol=tol, atol=tol
                )
                chain.append(int(torch.randint(0, vocab, (1,), generator=rng)))
                logits = runner.forward_chain(torch.tensor(chain[-1]))[0]
        kept = 1 + step % 3  # the root and the first drafts accepted, then a bonus token
        bonus = int(torch.randint(0, vocab, (1,), generator=rng))
        new = [*chain[1:kept], bonus]
        runner.commit(torch.arange(kept), torch.tensor(new))
        seq += new
    with torch.no_grad():
        final = runner.forward_tree(DraftTree.from_root(seq[-1]))[0]
    torch.testing.assert_close(final, plain_logits(model, seq), rtol=tol, atol=tol)


#: Gemma 4 with global layers of other head sizes and counts whose last layers reuse the keys of
#: earlier ones, and MiMo-V2-Flash, whose sliding layers have twice the key/value heads
OTHER_SHAPES = {
    "gemma4_text": {
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "num_kv_shared_layers": 2,
        "sliding_window": 5,
    },
    "mimo_v2_flash": {"sliding_window": 5},
}


@pytest.mark.parametrize("model_type", sorted(OTHER_SHAPES))
def test_layers_of_other_shapes_keep_slots_of_their_own(model_type: str) -> None:
    """Layers whose keys and values differ in heads or width from the first layer's failed
    every tree forward (Gemma 4 reading its per-layer `head_dim` globally, MiMo-V2-Flash with
    'layers of different shapes are not supported'): each shape now has a tensor of its own
    and layers reusing another's keys none. Trees, commits and growth past the window give
    the plain forward's logits."""
    from treegraft.conformance.tiny import tiny_model

    model = tiny_model(model_type, seed=2, **OTHER_SHAPES[model_type])
    vocab = model.config.get_text_config().vocab_size
    rng = torch.Generator().manual_seed(5)
    seq = torch.randint(0, vocab, (4,), generator=rng).tolist()
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=8)  # small on purpose: the cache must grow
    bonus = lambda: int(torch.randint(0, vocab, (1,)))  # noqa: E731
    # MiMo-V2-Flash routes its experts in float32: its float64 logits round to ~1e-8
    check_trees_and_commits(
        model, runner, seq, rng, steps=4, nodes=5, vocab=vocab, bonus=bonus, tol=1e-7
    )
    shapes = runner.cache.group_shapes
    assert len(shapes) == 2 and runner.cache.kv is None  # two shapes: no single tensor
    if model_type == "gemma4_text":  # the two layers reusing others' keys have no slots
        assert sorted(runner.cache.rows) == [0, 1, 2, 3]


def test_kv_cache_keeps_layers_of_each_shape_together() -> None:
    """`shapes` (what each layer hands over) gives each shape one tensor, a layer handing
    nothing no slots, and one that hands something after all slots of its own."""
    from treegraft.core.runner.kv_cache import TreeKVCache

    wide, narrow = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 4)
    cache = TreeKVCache(
        4,
        8,
        dtype=torch.float32,
        device=torch.device("cpu"),
        shapes=[(2, 8, 8), (1, 4, 4), (2, 8, 8), None],
    )
    for layer, block in enumerate((wide, narrow, wide * 2)):
        keys, values = cache.update(block, -block, layer)
        assert torch.equal(keys, block) and torch.equal(values, -block)
    assert [tuple(g.shape) for g in cache.groups] == [(2, 2, 2, 8, 8), (1, 2, 1, 8, 4)]
    assert cache.rows == {0: (0, 0), 1: (1, 0), 2: (0, 1)}
    cache.update(narrow, narrow, 3)
    assert cache.rows[3] == (2, 0)
    cache.compact(torch.tensor([2]), 0)  # every tensor moves: slot 2 to slot 0
    assert torch.equal(cache.groups[0][1, 0, :, 0], wide[0, :, 2] * 2)
    assert torch.equal(cache.groups[2][0, 1, :, 0], narrow[0, :, 2])
    with pytest.raises(
        ValueError, match=r"layer 1 hands the cache 2 key/value heads of widths 8/8"
    ):
        cache.update(wide, wide, 1)


def test_kv_cache_update_rejects_what_it_would_write_wrongly() -> None:
    """A batch of two used to be cut to its first row silently; a block past the capacity or an
    unknown layer raised torch's shape errors."""
    from treegraft.core.errors import ArgumentError
    from treegraft.core.runner.kv_cache import TreeKVCache

    cache = TreeKVCache(2, 8, dtype=torch.float64, device=torch.device("cpu"))
    block = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    cache.update(block, block, 0)
    for states, start, layer in ((block.repeat(2, 1, 1, 1), 0, 1), (block, 6, 1), (block, 0, 2)):
        cache.write_start = start
        with pytest.raises(ArgumentError, match=r"^TreeKVCache\.update: layer"):
            cache.update(states, states, layer)
    cache.grow(2)  # shrinking keeps the first slots (it used to raise torch's shape error)
    assert torch.equal(cache.kv[0, 0, :, :2], block[0, :, :2])


def test_a_model_with_per_layer_key_value_heads_matches_its_plain_forward() -> None:
    from treegraft.conformance.tiny import tiny_model

    model = tiny_model("mimo_v2_flash", seed=1)
    rng = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 96, (40,), generator=rng)
    runner = CausalLMRunner(model)
    runner.begin(prompt, max_len=64)
    tree = random_tree(rng, int(prompt[-1]), 7, 96)
    with torch.no_grad():
        logits = runner.forward_tree(tree)
    for i in range(tree.n_nodes):
        ids = prompt.tolist() + path_ids(tree, i)[1:]
        torch.testing.assert_close(logits[i], plain_logits(model, ids), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("accepted", "tokens", "message"),
    [
        (torch.tensor([0, -1]), torch.tensor([4, 5]), r"accepted\[1\] = -1 after 0"),
        (torch.tensor([0, 2, 2]), torch.tensor([4, 5, 6]), r"accepted\[2\] = 2 after 2"),
        (torch.tensor([0, 2, 1]), torch.tensor([4, 5, 6]), r"accepted\[2\] = 1 after 2"),
        (torch.tensor([1, 2]), torch.tensor([4, 5]), r"the root \(node 0\) first, got \[1, 2\]"),
        (torch.tensor([], dtype=torch.long), torch.tensor([4]), "0 accepted nodes but 1 tokens"),
        (torch.tensor([0.0, 1.0]), torch.tensor([4, 5]), "accepted: expected a 1-D integer"),
        (torch.tensor([[0, 1]]), torch.tensor([4, 5]), r"accepted: .*shape \(1, 2\)"),
        ([0, 1], torch.tensor([4, 5]), "accepted: expected a 1-D integer tensor, got list"),
        (torch.tensor([0, 1, 2]), torch.tensor([4]), "3 accepted nodes but 1 tokens"),
        (torch.tensor([0]), torch.tensor(4), r"tokens: .*shape \(\)"),
    ],
)
def test_commit_rejects_slots_that_would_compact_the_cache_wrongly(accepted, tokens, message):
    """A negative, repeated or unordered accepted node, a path without its root or one of a
    float dtype reached the cache compaction: a device copy moved wrong keys and values into
    the committed prefix without a word (or the CPU kernel's message named no argument of the
    call). `commit` names the entry now, before anything changed."""
    from treegraft.core.errors import ArgumentError

    runner = CausalLMRunner(tiny_llama(seed=0, vocab=16))
    runner.begin(torch.tensor([1, 2, 3]), max_len=32)
    with torch.no_grad():
        runner.forward_tree(
            DraftTree.from_parents(torch.tensor([3, 5, 6, 7]), torch.tensor([-1, 0, 1, 2]))
        )
    state = (runner.n_committed, runner.n_cached, runner.n_seen)
    with pytest.raises(ArgumentError, match=r"^CausalLMRunner\.commit: .*" + message):
        runner.commit(accepted, tokens)
    assert (runner.n_committed, runner.n_cached, runner.n_seen) == state
