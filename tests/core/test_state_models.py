"""State models (recurrent, linear-attention and convolution layers): which take the chain path,
why some are refused, and chains verified through their own cache against greedy `generate`."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from transformers import (
    Lfm2Config,
    LlamaConfig,
    Qwen3_5Config,
    Qwen3NextConfig,
    RwkvConfig,
    xLSTMConfig,
)

from treegraft.conformance.matrix import reference
from treegraft.conformance.tiny import VOCAB, tiny_model
from treegraft.core.errors import ArgumentError
from treegraft.core.runner import state_runner
from treegraft.core.runner.state_models import (
    has_state_layers,
    new_state_cache,
    rollback_by_snapshot,
    state_refusal,
)
from treegraft.core.runner.state_runner import StateRunner
from treegraft.core.runner.state_snapshot import state_tensors, take_snapshot
from treegraft.core.tree import DraftTree

#: state models a chain verifies exactly (the tiny LFM2 and Zamba2 take their layer patterns
#: from `tiny.MODEL_FIELDS`), rolled back by crop or by snapshot (`SNAPSHOT`)
WORKING = (
    "bailing_hybrid",
    "bamba",
    "falcon_h1",
    "falcon_mamba",
    "granitemoehybrid",
    "inkling_text",
    "inkling2_loop_text",
    "inkling2_text",
    "jamba",
    "kimi_linear",
    "lara_mini",
    "lfm2",
    "lfm2_moe",
    "lfm3",
    "mamba",
    "mamba2",
    "minimax",
    "nemotron_h",
    "olmo_hybrid",
    "qwen3_5_moe_text",
    "qwen3_5_text",
    "qwen3_next",
    "qwen4_exp_text",
    "rwkv",
    "xlstm",
    "zamba2",
    "zaya",
)
#: those whose caches cannot crop their state (a forward's last state only, or a cache of the
#: model's own): rolled back by snapshot
SNAPSHOT = frozenset({"minimax", "rwkv", "xlstm", "zaya"})

#: refused state models and a phrase their reason holds
REFUSED = {
    "recurrent_gemma": "take every forward of more than one token for a prompt",
    "zamba": "scan every forward of more than one token from a zero state",
}

MAX_CHAIN = 5
NEW = 16


@functools.lru_cache(maxsize=1)
def _model(model_type: str) -> torch.nn.Module:
    # Inkling 2's routers compute in float32 whatever the model's dtype: float32 for those
    dtype = torch.float32 if model_type.startswith("inkling2") else torch.float64
    return tiny_model(model_type, dtype=dtype)


def _prompt(length: int) -> torch.Tensor:
    rng = torch.Generator().manual_seed(length)
    motif = torch.randint(0, VOCAB, (7,), generator=rng)
    return torch.cat([motif.repeat(length // 7), torch.randint(0, VOCAB, (7,), generator=rng)])[
        :length
    ]


def _drafts(step: int, ahead: list[int], rng: torch.Generator) -> list[int]:
    """Every third chain is `MAX_CHAIN` drafts all rejected (its first is wrong), the next
    follows the reference with one wrong draft, the next is right but shorter."""
    if step % 3 == 0:
        junk = torch.randint(0, VOCAB, (MAX_CHAIN,), generator=rng).tolist()
        return [(ahead[0] + 1) % VOCAB, *junk[1:]]
    if step % 3 == 1:
        drafts = list(ahead[:MAX_CHAIN])
        wrong = int(torch.randint(0, MAX_CHAIN, (1,), generator=rng))
        drafts[wrong] = (drafts[wrong] + 1) % VOCAB
        return drafts
    return list(ahead[: int(torch.randint(1, MAX_CHAIN, (1,), generator=rng))])


def _chain_decode(model: torch.nn.Module, prompt: torch.Tensor, ahead: list[int]) -> list[int]:
    """Greedy tokens after `prompt`, verified by a `StateRunner` a chain of drafts at a time
    (drafts read from `ahead`, the reference continuation, and spoiled as `_drafts` says)."""
    runner = StateRunner(model)
    runner.begin(prompt, max_len=prompt.numel() + 4 * NEW)
    rng = torch.Generator().manual_seed(1)
    got: list[int] = []
    for step in range(3 * NEW):
        if len(got) >= NEW:
            break
        drafts = _drafts(step, ahead[len(got) :], rng)
        root = int(runner.committed_ids()[-1])
        chain = DraftTree.from_parents(torch.tensor([root, *drafts]), torch.arange(-1, len(drafts)))
        best = runner.forward_tree(chain).argmax(-1).tolist()  # [n + 1]
        m = 0
        while m < len(drafts) and drafts[m] == best[m]:
            m += 1
        tokens = [*drafts[:m], best[m]]
        runner.commit(torch.arange(m + 1), torch.tensor(tokens))
        got += tokens
    return got[:NEW]


@pytest.mark.parametrize("length", [9, 70])
@pytest.mark.parametrize("model_type", WORKING)
def test_chain_with_roll_back_equals_generate(model_type: str, length: int) -> None:
    model = _model(model_type)
    assert has_state_layers(model.config)
    assert state_refusal(model) is None
    assert rollback_by_snapshot(model) == (model_type in SNAPSHOT)
    prompt = _prompt(length)
    ahead = reference(model, prompt, max_new_tokens=NEW + MAX_CHAIN)
    with torch.inference_mode():
        assert _chain_decode(model, prompt, ahead) == ahead[:NEW]


def _greedy_after(model, prompt: torch.Tensor, chain: torch.Tensor, state=None) -> torch.Tensor:
    """`[n]` greedy tokens after each node of `chain` (its root `prompt`'s last token), forwarded
    by a `StateRunner` after `prompt`; with `state`, the state tensors the cache holds after the
    prompt replaced by those (`take_snapshot` of another cache), its attention keys kept."""
    runner = StateRunner(model)
    runner.begin(prompt, max_len=prompt.numel() + 16)
    runner.skip_prefill()
    for tensor, saved in zip(state_tensors(runner.cache), state or (), strict=bool(state)):
        tensor.set_(saved.clone())  # in place of it, whatever views it (a copy_ may refuse)
    tree = DraftTree.from_parents(chain, torch.arange(-1, chain.numel() - 1))
    return runner.forward_tree(tree).argmax(-1)


@pytest.mark.parametrize("length", [9, 70])
@pytest.mark.parametrize("model_type", WORKING)
def test_the_tiny_model_decodes_other_tokens_from_another_state(model_type, length) -> None:
    """The rollback tests can fail only where a state left wrong changes the tokens decoded:
    the state after another prompt (of the same length and last token; the attention keys
    stay this prompt's) changes the greedy token after some node of the chain `generate`
    decodes (a tiny model whose head is tied to its embeddings, or whose weights are too
    small, repeats tokens whatever its state: `tiny.STATE_FIELDS`)."""
    model = _model(model_type)
    prompt = _prompt(length)
    other = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(5))
    other[-1] = prompt[-1]
    chain = torch.tensor([int(prompt[-1]), *reference(model, prompt, max_new_tokens=8)])
    with torch.inference_mode():
        donor = StateRunner(model)
        donor.begin(other, max_len=length + 16)
        donor.skip_prefill()
        state = take_snapshot(donor.cache)
        own = _greedy_after(model, prompt, chain)
        swapped = _greedy_after(model, prompt, chain, state)
    assert own[:-1].tolist() == chain[1:].tolist()  # the chain's own greedy tokens
    assert (swapped != own).any(), f"{model_type}: the same tokens from another prompt's state"


@pytest.mark.parametrize("model_type", WORKING)
def test_a_rollback_that_keeps_rejected_states_decodes_other_tokens(model_type, monkeypatch):
    """A rollback missed (crop or snapshot restore skipped: the states of rejected drafts
    stay) makes the chain decoding differ from `generate`: what the rollback tests assert."""
    model = _model(model_type)
    prompt = _prompt(70)
    ahead = reference(model, prompt, max_new_tokens=NEW + MAX_CHAIN)
    monkeypatch.setattr(StateRunner, "_crop", lambda self, tokens: None)
    monkeypatch.setattr(state_runner, "restore_snapshot", lambda cache, snapshot: None)
    with torch.inference_mode():
        assert _chain_decode(model, prompt, ahead) != ahead[:NEW]


@pytest.mark.parametrize("model_type", sorted(SNAPSHOT))
def test_a_rollback_by_snapshot_of_the_first_chain_starts_the_cache_afresh(model_type) -> None:
    """After a one-token prompt the first chain is the cache's first forward: rolled back, the
    cache starts afresh (MiniMax, RWKV and xLSTM build theirs again at the next forward)."""
    model = _model(model_type)
    prompt = _prompt(1)
    ahead = reference(model, prompt, max_new_tokens=NEW + MAX_CHAIN)
    with torch.inference_mode():
        assert _chain_decode(model, prompt, ahead) == ahead[:NEW]


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_state_refusal_names_the_cause(model_type: str) -> None:
    model = tiny_model(model_type)
    assert has_state_layers(model.config)
    assert REFUSED[model_type] in (state_refusal(model) or "")


def test_recurrent_gemma_forwards_a_chain_after_cached_tokens_as_a_prompt() -> None:
    """The cause of its refusal: after a cached prompt, a forward of four tokens gives other
    logits than its forward of the whole sequence, four forwards of one token (its `generate`'s)
    the same."""
    from transformers import DynamicCache

    model = tiny_model("recurrent_gemma")
    ids = _prompt(24)[None]

    def run(cache: DynamicCache, a: int, b: int) -> torch.Tensor:  # positions as `generate`'s
        positions = torch.arange(a, b)[None]
        return model(ids[:, a:b], position_ids=positions, cache=cache, use_cache=True).logits[0]

    with torch.inference_mode():
        whole = model(ids).logits[0, 20:]
        chains = []
        for sizes in ((4,), (1, 1, 1, 1)):
            cache = DynamicCache(config=model.config)
            run(cache, 0, 20)
            bounds = torch.tensor([20, *sizes]).cumsum(0).tolist()
            chains.append(torch.cat([run(cache, a, b) for a, b in itertools.pairwise(bounds)]))
    assert (chains[0] - whole).abs().max() > 1e-3
    torch.testing.assert_close(chains[1], whole, rtol=1e-6, atol=1e-6)


def test_has_state_layers_reads_layer_types_and_recurrent_types() -> None:
    assert has_state_layers(Qwen3NextConfig())
    assert has_state_layers(Qwen3_5Config())  # a composite model's text config
    assert has_state_layers(Lfm2Config(full_attn_idxs=[1]))  # its other layers are `conv`
    assert has_state_layers(RwkvConfig()) and has_state_layers(xLSTMConfig())
    assert not has_state_layers(LlamaConfig()) and not has_state_layers(Lfm2Config())


def test_attention_model_is_not_refused() -> None:
    assert state_refusal(tiny_model("llama")) is None


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: new_state_cache(_model("mamba"), max_chain=0), "max_chain"),
        (lambda: new_state_cache(_model("mamba"), max_chain=True), "max_chain"),
        (lambda: new_state_cache(_model("mamba"), max_chain=2.0), "max_chain"),
    ],
)
def test_bad_arguments_name_the_argument(call, name: str) -> None:
    with pytest.raises(ArgumentError, match=name):
        call()
