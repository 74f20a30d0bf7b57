"""Lossless greedy decoding: every pipeline equals plain greedy decoding of the target."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_tree import trees
from treegraft.core.decoder import accepted_tokens, accepted_tokens_on_device
from treegraft.core.interfaces import BuildResult
from treegraft.core.pipeline import load_pipeline
from treegraft.core.tree import DraftTree
from treegraft.plugins.verifiers.greedy import GreedyVerifier

VOCAB = 48


def pipeline(
    resources,
    drafters,
    *,
    depth=3,
    top_k=2,
    budget=8,
    scheduler="never",
    max_new=24,
    adaptive=None,
    silent_chain=0,
    silent_drafter=-1,
    **decoding,
):
    builder = {"name": "layered", "depth": depth, "top_k": top_k, "budget": budget}
    if silent_chain:
        builder |= {"silent_chain": silent_chain, "silent_drafter": silent_drafter}
    if adaptive is not None:
        builder["adaptive"] = adaptive
    spec = {
        "target": "mem:target",
        "drafters": drafters,
        "builder": builder,
        "scheduler": scheduler,
        "decoding": {"max_new_tokens": max_new, "dtype": "float64", **decoding},
    }
    return load_pipeline(spec, resources=resources)


SELF_DRAFT = {"s": {"name": "hf_lm", "model": "mem:target"}}


def self_draft(target, **kw):
    """A pipeline whose LM drafter is the target itself."""
    return pipeline(memory_resources(target=target), SELF_DRAFT, **kw)


def repetitive_prompt(seed: int, length: int) -> torch.Tensor:
    """A prompt with repeated spans so the n-gram drafter finds matches."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, VOCAB, (max(2, length // 2),), generator=g)
    return torch.cat([base, base[: length - base.numel()]])[:length]


DRAFTER_SETS = {
    "ngram": {"w": {"name": "ngram", "max_ngram": 3, "chain_len": 2}},
    "lm": {"s": {"name": "hf_lm", "model": "mem:draft"}},
    "ngram+lm": {"w": {"name": "ngram"}, "s": {"name": "hf_lm", "model": "mem:draft"}},
    "cascade": {
        "w": {"name": "ngram"},
        "m": {"name": "hf_lm", "model": "mem:draft"},
        "s": {"name": "hf_lm", "model": "mem:target"},
    },
}


@settings(max_examples=max(4, settings().max_examples // 2))
@given(
    seed=st.integers(0, 1000),
    prompt_len=st.integers(2, 24),
    drafters=st.sampled_from(sorted(DRAFTER_SETS)),
    scheduler=st.sampled_from(["never", "always", {"name": "layers", "layers": [1]}]),
    depth=st.integers(1, 5),
    top_k=st.integers(1, 4),
    budget=st.integers(1, 20),
    kv_heads=st.sampled_from([1, 2, 4]),
    # silent steps' chains (4 tokens) by the strongest drafter or the second cheapest
    silent=st.sampled_from([(0, -1), (0, -1), (4, -1), (4, 1)]),
)
def test_every_pipeline_equals_plain_greedy(
    seed, prompt_len, drafters, scheduler, depth, top_k, budget, kv_heads, silent
):
    target = tiny_llama(seed=seed, vocab=VOCAB, kv_heads=kv_heads)
    draft = tiny_llama(seed=seed + 1, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1)
    res = memory_resources(target=target, draft=draft)
    prompt = repetitive_prompt(seed, prompt_len)
    if isinstance(scheduler, dict) and depth == 1:  # layer 1 is past the depth: refused at build
        scheduler = "never"  # what `layers: [1]` did at depth 1 before it was refused
    pipe = pipeline(
        res,
        DRAFTER_SETS[drafters],
        depth=depth,
        top_k=top_k,
        budget=budget,
        scheduler=scheduler,
        max_new=16,
        silent_chain=silent[0],
        silent_drafter=silent[1],
    )
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 16)
    assert out.finish_reason == "length"


def test_equals_hugging_face_generate(tiny_target, tiny_drafter):
    res = memory_resources(target=tiny_target, draft=tiny_drafter)
    prompt = repetitive_prompt(3, 16)
    hf = tiny_target.generate(
        prompt[None],
        attention_mask=torch.ones_like(prompt)[None],
        max_new_tokens=30,
        do_sample=False,
        pad_token_id=0,
    )
    for drafters in DRAFTER_SETS.values():
        out = pipeline(res, drafters, max_new=30, scheduler="always").generate(prompt)
        assert list(out.token_ids) == hf[0, prompt.numel() :].tolist()


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_self_draft_chain_commits_full_path_plus_bonus(tiny_target, depth):
    pipe = self_draft(tiny_target, depth=depth, top_k=1, budget=depth, max_new=40)
    out = pipe.generate(repetitive_prompt(0, 10))
    assert [e.accepted for e in out.events[:-1]] == [depth] * (len(out.events) - 1)
    assert out.summary.tau > depth  # the last step may be cut short


def test_self_draft_tree_always_accepts_down_to_a_leaf(tiny_target):
    """With the target as drafter and nothing pruned, every step accepts a full root-to-leaf path.

    A node that was expanded got the target's own top-k children, its argmax among them, so the
    accepted path only ends where the tree ends.
    """
    pipe = self_draft(tiny_target, depth=3, top_k=3, budget=39, max_new=40)
    out = pipe.generate(repetitive_prompt(1, 10))
    for e in out.events[:-1]:
        last = int(e.verdict.path[int(e.verdict.length) - 1])
        assert bool(e.build.tree.is_leaf()[last])
        assert e.build.tree.n_nodes == e.build.unpruned.n_nodes  # the budget kept everything
    assert out.summary.tau > 2.5


def test_random_drafter_is_still_exact_with_tau_near_one(tiny_target):
    noise = tiny_llama(seed=99, vocab=64)
    res = memory_resources(target=tiny_target, noise=noise)
    pipe = pipeline(
        res, {"s": {"name": "hf_lm", "model": "mem:noise"}}, depth=3, top_k=2, budget=8, max_new=40
    )
    prompt = repetitive_prompt(5, 12)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(tiny_target, prompt, 40)
    assert 1.0 <= out.summary.tau < 1.5


def eos_case(position: int):
    """A target whose EOS token first appears at `position` of its greedy continuation."""
    base = tiny_llama(seed=1)
    prompt = repetitive_prompt(2, 10)
    ref = greedy_reference(base, prompt, 40)
    eos = ref[position]
    first = ref.index(eos)
    target = tiny_llama(seed=1, eos=eos)
    return target, prompt, ref[: first + 1]


@pytest.mark.parametrize("position", [0, 5, 13])
def test_eos_inside_an_accepted_block(position):
    target, prompt, expected = eos_case(position)
    pipe = self_draft(target, depth=4, top_k=1, budget=4, max_new=40)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == expected
    assert out.finish_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 3, 7, 10])
def test_max_new_tokens_inside_an_accepted_block(tiny_target, max_new):
    pipe = self_draft(tiny_target, depth=4, top_k=1, budget=4, max_new=max_new)
    prompt = repetitive_prompt(4, 10)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(tiny_target, prompt, max_new)
    assert out.finish_reason == "length"


class LetterTokenizer:
    """Token i decodes to letter chr(97 + i % 26): enough to test stop strings."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_stop_string_inside_an_accepted_block(tiny_target):
    prompt = repetitive_prompt(6, 10)
    ref = greedy_reference(tiny_target, prompt, 30)
    text = LetterTokenizer().decode(ref)
    stop = text[9:11]  # a two-letter string completed at token 10 (or earlier)
    end = text.index(stop) + len(stop)
    pipe = self_draft(tiny_target, depth=4, top_k=1, budget=4, max_new=30, stop=[stop])
    pipe.tokenizer = LetterTokenizer()
    out = pipe.generate(prompt)
    assert list(out.token_ids) == ref[:end]
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]
    assert "".join(pipe.stream(prompt)) == out.text


class SpecialTokenizer(LetterTokenizer):
    """A `LetterTokenizer` whose token `special` is a special token, written `<|s|>` (left out
    of the text as `decode(..., skip_special_tokens=True)` leaves it out)."""

    def __init__(self, special: int) -> None:
        self.special = special

    def decode(self, ids, skip_special_tokens=True):
        letters = LetterTokenizer.decode(self, [i for i in ids if i != self.special])
        if skip_special_tokens:
            return letters
        return "".join("<|s|>" if i == self.special else chr(97 + i % 26) for i in ids)


def special_case(tiny_target):
    """A prompt, its greedy continuation, and a token first generated at index >= 3."""
    prompt = repetitive_prompt(6, 10)
    ref = greedy_reference(tiny_target, prompt, 30)
    first = next(i for i in range(3, 20) if ref[i] not in ref[:i])
    return prompt, ref, first


@pytest.mark.parametrize("before, after", [("", ""), ("", "x"), ("x", "")])
def test_a_stop_string_with_a_special_tokens_text_ends_at_that_token(tiny_target, before, after):
    """`generate(stop_strings=...)` matches stop strings in the text with special tokens kept
    (`<|im_end|>`): the generation ends at the token that completes it, and the text, special
    tokens left out, ends before it (streamed too)."""
    prompt, ref, first = special_case(tiny_target)
    letters = LetterTokenizer().decode(ref)
    stop = before and letters[first - 1]
    stop += "<|s|>" + (after and letters[first + 1])
    end = first + 1 + len(after)
    pipe = self_draft(tiny_target, depth=4, top_k=1, budget=4, max_new=30, stop=[stop])
    pipe.tokenizer = SpecialTokenizer(ref[first])
    out = pipe.generate(prompt)
    assert (list(out.token_ids), out.finish_reason) == (ref[:end], "stop")
    assert out.text == letters[: first - len(before)]
    assert "".join(pipe.stream(prompt)) == out.text


def test_a_stop_string_the_eos_token_completes_ends_at_eos():
    target, prompt, expected = eos_case(13)
    pipe = self_draft(target, depth=4, top_k=1, budget=4, max_new=40, stop=["<|s|>"])
    pipe.tokenizer = SpecialTokenizer(expected[-1])
    out = pipe.generate(prompt)
    assert (list(out.token_ids), out.finish_reason) == (expected, "eos")
    assert out.text == LetterTokenizer().decode(expected[:-1])


def test_the_text_ends_before_the_stop_string_that_starts_first(tiny_target):
    """Stop strings that overlap: the text ends where the earliest one starts, whatever their
    order in the list."""
    res = memory_resources(target=tiny_target)
    pipe = pipeline(res, {"w": {"name": "ngram"}}, max_new=30)
    pipe.tokenizer = LetterTokenizer()
    prompt = repetitive_prompt(7, 12)
    text = pipe.generate(prompt).text
    # `early` (3 letters) starts first, `late` (its last letter, new in the text) ends with it
    i = next(i for i in range(len(text) - 3) if text[i + 2] not in text[: i + 2])
    early, late = text[i : i + 3], text[i + 2]
    for stops in ([late, early], [early, late]):
        assert pipe.generate(prompt, stop=stops).text == text[:i], stops


def test_streaming_yields_the_generated_text(tiny_target):
    res = memory_resources(target=tiny_target)
    pipe = pipeline(res, {"w": {"name": "ngram"}}, max_new=20)
    pipe.tokenizer = LetterTokenizer()
    prompt = repetitive_prompt(7, 12)
    assert "".join(pipe.stream(prompt)) == pipe.generate(prompt).text


def test_a_stop_string_across_steps_is_neither_streamed_nor_kept(tiny_target):
    """A stop string begun in one step and completed in a later one: streaming holds its first
    letters back, and the text of `generate(stop=...)` ends before it, as with `decoding.stop`."""
    res = memory_resources(target=tiny_target)
    pipe = pipeline(res, {"w": {"name": "ngram"}}, max_new=30)
    pipe.tokenizer = LetterTokenizer()
    prompt = repetitive_prompt(7, 12)
    events = pipe.generate(prompt).events
    text = LetterTokenizer().decode([t for e in events for t in e.tokens])
    cuts = [sum(len(e.tokens) for e in events[: i + 1]) for i in range(len(events) - 1)]
    spans = [c for c in cuts if 2 <= c <= 26]  # letters c-2 .. c: one step, then the next
    assert spans
    for b in spans:
        stop = text[b - 2 : b + 1]
        want = text[: text.index(stop)]
        assert pipe.generate(prompt, stop=[stop]).text == want
        pieces = list(pipe.stream(prompt, stop=[stop]))
        assert "".join(pieces) == want, (stop, pieces)
        assert all(pieces)  # no empty piece


def test_step_events_report_stage_times_and_sizes(tiny_target, tiny_drafter):
    res = memory_resources(target=tiny_target, draft=tiny_drafter)
    pipe = pipeline(
        res, DRAFTER_SETS["ngram+lm"], scheduler={"name": "layers", "layers": [0]}, max_new=12
    )
    events = list(pipe.steps(repetitive_prompt(8, 12)))
    for e in events:
        assert {"build", "target", "verify"} <= set(e.times)
        assert e.calls[0] == 1 and all(c == 0 for c in e.calls[1:])
        assert 1 <= e.tree_size + 1 == e.build.tree.n_nodes
    assert sum(len(e.tokens) for e in events) == 12


@given(st.data())
def test_accepted_tokens_on_the_host_and_on_the_device_agree(data):
    """The committed tokens and the strong-drafter count of an accepted path, read as lists
    (CPU) or with torch ops (other devices), from a random tree's greedy verdict."""
    tree = data.draw(trees())
    n = tree.n_nodes
    proposer = torch.tensor(
        [-1, *data.draw(st.lists(st.integers(0, 2), min_size=n - 1, max_size=n - 1))]
    )
    tree = attrs.evolve(tree, proposer=proposer)
    logits = torch.randn(
        n, 6, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    )
    logits[torch.arange(n), data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))] += 10
    verdict = GreedyVerifier(None).verify(tree, logits)
    kept = torch.tensor(sorted(data.draw(st.sets(st.integers(1, 3 * n), min_size=n, max_size=n))))
    kept[0] = 0
    built = BuildResult(tree=tree, kept=kept, calls=(0,), unpruned=tree)
    host, device = accepted_tokens(built, verdict), accepted_tokens_on_device(built, verdict)
    assert torch.equal(host.path, device.path) and torch.equal(host.unpruned, device.unpruned)
    assert (host.tokens, host.strong) == (device.tokens, device.strong)
    drafted = host.path.tolist()[1:]
    assert host.tokens == [int(tree.tokens[i]) for i in drafted] + [int(verdict.bonus)]
    assert host.strong == sum(int(proposer[i]) > 0 for i in drafted)
    assert host.unpruned.tolist() == [int(kept[i]) for i in host.path.tolist()]
    assert device.path.device.type == device.unpruned.device.type == "cpu"  # host tensors


def count_host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a tensor's values on the host from here on (`tolist`, `item`, `int()`...)."""
    reads: list[str] = []
    for name in ("tolist", "item", "__int__", "__index__", "__bool__", "__float__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return reads


def test_the_device_accept_decision_is_one_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the accept decision is the step's one wait for the device: the path, its tokens,
    its unpruned indices, the bonus and the strong count come back in a single read."""
    tree = DraftTree.from_parents(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, 0, 1, 0, 3]))
    logits = torch.full((5, 12), -1.0)
    logits[torch.arange(5), torch.tensor([6, 7, 3, 9, 2])] = 1.0  # path 0 -> 1 -> 2, bonus 3
    verdict = GreedyVerifier(None).verify(tree, logits)
    built = BuildResult(tree=tree, kept=torch.tensor([0, 2, 4, 5, 7]), calls=(0,), unpruned=tree)
    reads = count_host_reads(monkeypatch)
    accepted = accepted_tokens_on_device(built, verdict)
    assert reads == ["tolist"]
    assert accepted.tokens == [6, 7, 3] and accepted.unpruned.tolist() == [0, 2, 4]


def calling_pipeline(target, drafter, *, max_new: int):
    """The n-gram + LM drafters with a strong call at every layer."""
    resources = memory_resources(target=target, draft=drafter)
    return pipeline(resources, DRAFTER_SETS["ngram+lm"], scheduler="always", max_new=max_new)


def test_a_learning_scheduler_observes_every_step(tiny_target, tiny_drafter):
    """A scheduler gets one outcome per step, in order, matching the step's event."""
    from treegraft.plugins.schedulers.basic import AlwaysScheduler

    seen = []

    class Learning(AlwaysScheduler):
        def observe(self, outcome):
            seen.append(outcome)

    pipe = calling_pipeline(tiny_target, tiny_drafter, max_new=20)
    pipe.decoder.scheduler = Learning(pipe.decoder.scheduler.config)
    out = pipe.generate(repetitive_prompt(2, 12))
    assert [o.step for o in seen] == list(range(len(out.events)))
    for outcome, event in zip(seen, out.events, strict=True):
        assert outcome.calls == event.calls and outcome.accepted == event.accepted
        assert outcome.n_nodes == event.tree_size + 1
        assert outcome.target_time > 0 and len(outcome.drafter_times) == 2
        stages = ("build", "target", "verify", "commit")  # the drafters run inside `build`
        assert outcome.seconds == sum(event.times.get(s, 0.0) for s in stages)
        assert outcome.seconds > event.times["target"] > 0
        path = event.verdict.path[1 : int(event.verdict.length)].tolist()
        proposer = event.build.tree.proposer.tolist()
        assert outcome.strong_accepted == sum(proposer[i] > 0 for i in path)
    assert any(o.strong_accepted > 0 for o in seen)
    assert any(c > 0 for o in seen for c in o.calls)


def test_a_scheduler_begins_every_generation_before_its_first_decision(tiny_target, tiny_drafter):
    """The life cycle of docs/plugins.md: `begin`, then decisions and one outcome per step."""
    from treegraft.plugins.schedulers.basic import AlwaysScheduler

    calls: list[str] = []

    class Recording(AlwaysScheduler):
        def begin(self):
            calls.append("begin")

        def decide(self, state):
            calls.append("decide")
            return super().decide(state)

        def observe(self, outcome):
            calls.append("observe")

    pipe = calling_pipeline(tiny_target, tiny_drafter, max_new=6)
    pipe.decoder.scheduler = Recording(pipe.decoder.scheduler.config)
    first = pipe.generate(repetitive_prompt(2, 12))
    second = pipe.generate(repetitive_prompt(3, 12))
    assert calls.count("begin") == 2 and calls[0] == "begin"
    assert calls.count("observe") == len(first.events) + len(second.events)
    at = calls.index("begin", 1)
    assert "decide" in calls[1:at] and calls[at - 1] == "observe" and calls[at + 1] == "decide"


def test_the_callers_grad_mode_is_kept_between_steps(tiny_target, tiny_drafter):
    """The loop ran inside one `with torch.inference_mode()` around its `yield`s: a loop over
    `steps()` ran its own code in inference mode (its autograd failed), and two iterators of two
    pipelines advanced in turn restored each other's modes out of order (the second then wrote
    its inference-mode cache outside inference mode: a RuntimeError). Now the mode is the
    decoder's only while it runs."""
    res = memory_resources(target=tiny_target, draft=tiny_drafter)
    first = pipeline(res, DRAFTER_SETS["ngram+lm"], scheduler="always", max_new=12)
    second = pipeline(res, DRAFTER_SETS["lm"], scheduler="always", max_new=12)
    prompts = repetitive_prompt(2, 10), repetitive_prompt(5, 9)
    want = [greedy_reference(tiny_target, p, 12) for p in prompts]
    steps = first.steps(prompts[0]), second.steps(prompts[1])
    got: list[list[int]] = [[], []]
    for i in (0, 1, 0, 1):
        got[i].extend(next(steps[i]).tokens)
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        weight = torch.ones(2, requires_grad=True)
        (weight * 2).sum().backward()  # autograd works in the caller's loop
        assert weight.grad.tolist() == [2.0, 2.0]
    for i in (0, 1):  # the first finishes before the second
        got[i].extend(t for e in steps[i] for t in e.tokens)
    assert got == want
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_replaced_drafters_are_the_ones_the_loop_calls(tiny_target):
    """`Decoder.parts` rebuilt its proxies when a component's id() changed: a replaced tuple of
    drafters, once freed, could leave its id to the next one, and the loop went on calling the
    old drafters. Components are compared by identity now."""
    res = memory_resources(target=tiny_target)
    pipe = pipeline(res, {"w": {"name": "ngram"}}, max_new=8)
    others = [pipeline(res, {"w": {"name": "ngram", "max_ngram": 2}}) for _ in range(2)]
    decoder = pipe.decoder
    for i in range(20):
        decoder.parts()
        decoder.drafters = others[i % 2].decoder.drafters[:1]  # the tuple `parts` saw is freed
        decoder.drafters = (others[(i + 1) % 2].decoder.drafters[0],)  # may take its id
        assert decoder.parts().drafters[0] is decoder.drafters[0]
    prompt = repetitive_prompt(4, 12)
    assert list(pipe.generate(prompt).token_ids) == greedy_reference(tiny_target, prompt, 8)


def test_streaming_never_shows_text_twice_when_byte_tokens_rewrite_it(tiny_target, monkeypatch):
    """A byte-fallback `\\n` then the first byte of `€` decode to two replacement characters
    until `€` is complete: the stream showed `\\n`, then (its text shorter) nothing, then
    `\\n€` again. Now a text that does not begin with what was shown adds nothing until it
    does."""
    from tests.core.test_stop_text import sentencepiece_tokenizer
    from treegraft.core.pipeline import Pipeline

    tok = sentencepiece_tokenizer()
    byte = {b: tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in b"\n\xe2\x82\xac"}
    steps = [[byte[10]], [byte[0xE2]], [byte[0x82], byte[0xAC]], [byte[10]]]
    events = [SimpleNamespace(tokens=s, finished=i == len(steps) - 1) for i, s in enumerate(steps)]
    monkeypatch.setattr(Pipeline, "steps", lambda self, prompt, **kw: iter(events))
    pipe = pipeline(memory_resources(target=tiny_llama(vocab=len(tok))), {"w": {"name": "ngram"}})
    pipe.tokenizer = tok
    pieces = list(pipe.stream([1, 2]))
    assert "".join(pieces) == pipe.text_of([t for s in steps for t in s]) == "\n€\n"
    assert all(pieces)
