"""Language-model drafter: any Hugging Face causal LM sharing the target's vocabulary.

It keeps its own preallocated KV cache (a `CausalLMRunner`), catches up lazily on committed tokens
it has not seen, and forwards only the tree nodes it has not seen yet in this step. Both verbs,
`expand` (top-k children of frontier nodes) and `score_tree` (next-token log-probs after every
node, for rescoring and grafting), reuse the same per-node distributions.

With `head: K` it scores only the `K` most frequent tokens of a corpus (`token_counts`) plus the
prompt's own tokens: the output projection, most of a small drafter's weights, shrinks to those
rows (frequency-ranked drafting). Its distributions are then normalised over those tokens, and
every other token gets log-prob -inf: the drafter never proposes it, and rescorers keep the
current score of a node carrying it (the drafter abstains there). Drafts only steer what the
target verifies, so the output stays exactly the target's.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from treegraft.core.config import Check, between, field, one_of
from treegraft.core.interfaces import Drafter
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree, Proposal
from treegraft.zoo import PREFIX as ZOO_PREFIX
from treegraft.zoo.token_counts import ZOO_REF as ZOO_COUNTS
from treegraft.zoo.token_counts import load_counts, most_frequent


@attrs.frozen
class HFLMConfig:
    """Hyper-parameters of the language-model drafter."""

    model: str = field(doc="model reference: 'zoo:NAME' or a Hugging Face model directory")
    temperature: float = field(
        1.0, check=between(0.0, 100.0, open_low=True), doc="softmax temperature of the draft scores"
    )
    head: int | None = field(
        None,
        check=Check(">= 1 or null", lambda v: v is None or (isinstance(v, int) and v >= 1)),
        doc="score only this many of the most frequent tokens (by `token_counts`) plus the "
        "prompt's tokens; null: the whole vocabulary",
    )
    forward: str = field(
        "fused",
        check=one_of("fused", "pipeline"),
        doc="'fused': the fused lean forward (faster, logits equal up to rounding; "
        "drafts only steer what the target verifies) unless `decoding.forward` is "
        "'transformers'; 'pipeline': exactly as `decoding.forward` says",
    )
    token_counts: str = field(
        ZOO_COUNTS,
        doc="per-token counts ranking the vocabulary for `head`: 'zoo:token-counts' (the zoo "
        "tokenizer's) or a JSON file written by `treegraft zoo token-counts`",
    )


@attrs.define
class HFLMDrafter(Drafter):
    """Drafts with a (small) Hugging Face causal LM; can score whole trees in one forward."""

    Config = HFLMConfig
    can_score = True

    config: HFLMConfig
    runner: CausalLMRunner
    node_logp: Tensor | None = None  # [n_seen, V] next-token log-probs after each seen node
    #: `[head]` int64 the most frequent token ids (None: the whole vocabulary is scored)
    frequent: Tensor | None = None

    @classmethod
    def from_config(cls, config: HFLMConfig, resources: Resources) -> HFLMDrafter:
        runner = resources.runner(config.model, forward=drafter_forward(config, resources.forward))
        return cls(config, runner, frequent=frequent_tokens(config, runner.vocab_size))

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.runner.begin(prompt, max_len=max_len)
        if self.frequent is not None:  # this prompt's tokens join the scored ones
            self.runner.restrict_output(torch.unique(torch.cat([self.frequent, prompt.cpu()])))
        self.node_logp = None

    def _score(self, tree: DraftTree) -> Tensor:
        """`[n, V]` log-probs for every node of `tree`, forwarding only the unseen ones."""
        if tree.n_nodes > self.runner.n_seen:
            logits = self.runner.forward_tree(tree)  # [n_new, V] ([n_new, K] with a head)
            logits = logits.float()
            if self.config.temperature != 1.0:  # dividing by 1 changes nothing but costs a pass
                logits = logits / self.config.temperature
            logp = torch.log_softmax(logits, dim=-1)
            rows = self.runner.output_rows
            if rows is not None:  # unscored tokens: -inf
                full = logp.new_full((logp.shape[0], self.runner.vocab_size), float("-inf"))
                full[:, rows] = logp
                logp = full
            self.node_logp = logp if self.node_logp is None else torch.cat([self.node_logp, logp])
        return self.node_logp[: tree.n_nodes]

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        logp = self._score(tree)[nodes]  # [f, V]
        top = logp.topk(min(k, logp.shape[-1]), dim=-1)
        return Proposal(
            parents=nodes.repeat_interleave(top.indices.shape[1]),
            tokens=top.indices.reshape(-1, 1),
            logp=top.values.reshape(-1, 1),
        )

    def score_tree(self, tree: DraftTree) -> Tensor:
        return self._score(tree)

    def rewind(self) -> None:
        self.runner.rewind()
        self.node_logp = None

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        self.runner.commit(accepted, tokens)
        self.node_logp = None


def drafter_forward(config: HFLMConfig, pipeline_forward: str) -> str:
    """The runner forward of an `hf_lm` drafter: `fused` where the pipeline's `decoding.forward`
    allows the lean forward (`auto`, `lean`) and the drafter asks for it, else the pipeline's."""
    if config.forward == "fused" and pipeline_forward in ("auto", "lean"):
        return "fused"
    return pipeline_forward


def frequent_tokens(config: HFLMConfig, vocab_size: int) -> Tensor | None:
    """The `config.head` most frequent token ids by `config.token_counts` (None without a head);
    errors name the field when the counts do not fit the model's vocabulary."""
    if config.head is None:
        return None
    try:
        counts = load_counts(config.token_counts)
    except (OSError, ValueError) as err:
        raise ValueError(f"token_counts: {err}") from err
    if counts.shape[0] != vocab_size:
        raise ValueError(
            f"token_counts: {config.token_counts!r} counts {counts.shape[0]} token ids, but the "
            f"model {config.model!r} has a vocabulary of {vocab_size}"
        )
    if config.head > vocab_size:
        raise ValueError(
            f"head: expected at most the vocabulary size {vocab_size}, got {config.head}"
        )
    return torch.from_numpy(most_frequent(counts, config.head).copy())


def swap_model(spec: dict, model: str) -> None:
    """Put `model` into an `hf_lm` drafter's config mapping (the benchmark's pairs, the
    scheduler tools' `--strong`). The zoo's token counts rank only the zoo vocabulary, so a
    `head` ranked by them (the shipped pipelines') is dropped when a model outside the embedded
    zoo comes in (a directory, `mem:NAME`, or a fetched model such as `zoo:smollm2-draft-l`):
    that drafter scores its whole vocabulary. A `head` with counts of its own stays."""
    spec["model"] = model
    zoo_counts = spec.get("token_counts") in (None, ZOO_COUNTS)
    if zoo_counts and spec.get("head") is not None and not _embedded_zoo_model(str(model)):
        spec.pop("head")


def _embedded_zoo_model(ref: str) -> bool:
    """Whether `ref` names a model of the embedded zoo (its tokenizer), not a fetched one."""
    from treegraft import zoo

    return ref.startswith(ZOO_PREFIX) and ref.removeprefix(ZOO_PREFIX) in zoo.available()
