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

import math
from typing import ClassVar

import attrs
import torch
from torch import Tensor

from treegraft.core.config import Check, between, field
from treegraft.core.interfaces import Drafter
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree, Proposal


@attrs.frozen
class HFLMConfig:
    """Hyper-parameters of the language-model drafter. How its forwards run follows the
    pipeline's `decoding.forward` (the fused lean forward where that is lean)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "forward": "the LM drafter's forward follows decoding.forward (the fused lean forward "
        "where it is 'lean' or 'auto' on a CPU); docs/pipelines.md#how-a-forward-runs"
    }

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
    token_counts: str = field(
        "zoo:token-counts",
        doc="per-token counts ranking the vocabulary for `head`: 'zoo:token-counts' (the zoo "
        "tokenizer's), 'zoo:smollm2-token-counts' (SmolLM2's) or a JSON file written by "
        "`treegraft zoo token-counts`",
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
    #: columns of the log-probs handed out: the target's vocabulary size (0: the drafter's own)
    vocab: int = 0
    #: token ids the drafter may propose (below both vocabularies and the tokenizer's real
    #: tokens: embedding padding rows never are); 0: all of its vocabulary
    usable: int = 0
    #: the prompt of a generation whose output rows are not restricted yet (`_restrict`)
    _prompt: Tensor | None = attrs.field(default=None, init=False)
    #: `[c, K]` a `chain`'s scored columns after its nodes past the root, spread into
    #: `node_logp` only when read (a silent step's chain is seldom scored again)
    _chain_rows: Tensor | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.vocab = self.vocab or self.runner.vocab_size
        self.usable = self.usable or self.runner.vocab_size

    @classmethod
    def from_config(cls, config: HFLMConfig, resources: Resources) -> HFLMDrafter:
        runner = resources.runner(config.model, forward=resources.plan_for(config.model).drafter)
        vocab, usable = shared_vocabulary(config.model, runner.vocab_size, resources)
        return cls(
            config,
            runner,
            frequent=frequent_tokens(config, runner.vocab_size, resources),
            vocab=vocab,
            usable=usable,
        )

    @classmethod
    def check_config(cls, config: HFLMConfig, resources: Resources) -> None:
        """The token counts ranking a restricted `head` load and fit the model's vocabulary
        (read from its config; no weights load)."""
        frequent_tokens(config, resources.vocab_size(config.model), resources)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        prompt = self._embeddable(prompt)
        self.runner.begin(prompt, max_len=max_len)
        self._prompt = prompt
        self.node_logp = self._chain_rows = None

    def _restrict(self, prompt: Tensor) -> None:
        """Restrict the runner's output to the tokens this generation may propose. Done at the
        generation's first forward, not in `begin`: gathering the head's rows costs about a
        drafter forward, and a generation that never calls the drafter (decoded plainly, or
        with a scheduler that keeps it idle) should not pay it."""
        rows = None
        if self.frequent is not None:  # this prompt's tokens join the scored ones
            rows = scored_rows(self.frequent, prompt)
        elif self.usable < self.runner.vocab_size or self.vocab != self.runner.vocab_size:
            rows = torch.arange(self.usable)  # log-probs come out in the target's width
        if rows is not None and self.usable < self.runner.vocab_size:
            rows = rows[rows < self.usable]
        if rows is not None:
            self.runner.restrict_output(rows)

    def _score(self, tree: DraftTree) -> Tensor:
        """`[n, V]` log-probs for every node of `tree`, forwarding only the unseen ones."""
        if self._chain_rows is not None:  # a chain's nodes, in the full width now
            self.node_logp = torch.cat([self.node_logp, self._full(self._chain_rows)])
            self._chain_rows = None
        if tree.n_nodes > self.runner.n_seen:
            if self.runner.vocab_size < self.vocab:
                tree = attrs.evolve(tree, tokens=self._embeddable(tree.tokens))
            if self._prompt is not None:  # the generation's first forward
                self._restrict(self._prompt)
                self._prompt = None
            logp = self._logp(self.runner.forward_tree(tree))
            self.node_logp = logp if self.node_logp is None else torch.cat([self.node_logp, logp])
        return self.node_logp[: tree.n_nodes]

    def _logp(self, logits: Tensor, *, full: bool = True) -> Tensor:
        """`[n, V]` log-probs of the runner's logits `[n, V]` (`[n, K]` with a head: the
        unscored tokens get -inf; `full` False: the `[n, K]` scored columns alone)."""
        logits = logits.float()
        if self.config.temperature != 1.0:  # dividing by 1 changes nothing but costs a pass
            logits = logits / self.config.temperature
        logp = torch.log_softmax(logits, dim=-1)
        return self._full(logp) if full else logp

    def _full(self, logp: Tensor) -> Tensor:
        """`[n, V]` log-probs from those of the runner's output columns (-inf elsewhere)."""
        rows = self.runner.output_rows
        if rows is None:
            return logp
        full = logp.new_full((logp.shape[0], self.vocab), float("-inf"))
        full[:, rows] = logp
        return full

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        logp = self._score(tree)[nodes]  # [f, V]
        top = logp.topk(min(k, logp.shape[-1]), dim=-1)
        return Proposal(
            parents=nodes.repeat_interleave(top.indices.shape[1]),
            tokens=top.indices.reshape(-1, 1),
            logp=top.values.reshape(-1, 1),
        )

    def chain(self, tree: DraftTree, length: int, stop: float) -> Proposal | None:
        """The greedy chain from the root, one `CausalLMRunner.forward_chain` per token: no tree
        is built, no mask on the lean forward, and the chain's tokens are chosen among the
        scored columns (a head's). The seen nodes' log-probs are kept as `expand` keeps them (a
        later `score_tree` of the chain's tree reads them, spread to the full width then)."""
        if tree.n_nodes != 1 or length < 1:
            return None
        low = math.log(stop)
        root = self._score(tree)[0]  # pending tokens and the root: one forward
        value, token = root.max(dim=-1)
        tokens, logps, seen = [int(token)], [float(value)], []
        columns = self.runner.output_rows  # restricted log-probs' column -> token id
        while len(tokens) < length and logps[-1] >= low:
            logp = self._logp(self.runner.forward_chain(token), full=False)[0]
            seen.append(logp)
            value, token = logp.max(dim=-1)
            if columns is not None:
                token = columns[token]
            tokens.append(int(token))
            logps.append(float(value))
        if seen:  # after the root's row, which `_score` kept
            self._chain_rows = torch.stack(seen)
        device = tree.device
        return Proposal(
            parents=torch.zeros(1, dtype=torch.long, device=device),
            tokens=torch.tensor([tokens], dtype=torch.long, device=device),
            logp=torch.tensor([logps], dtype=torch.float32, device=device),
        )

    def score_tree(self, tree: DraftTree) -> Tensor:
        return self._score(tree)

    def rewind(self) -> None:
        self.runner.rewind()
        self.node_logp = self._chain_rows = None

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        self.runner.commit(accepted, self._embeddable(tokens))
        self.node_logp = self._chain_rows = None

    def _embeddable(self, tokens: Tensor) -> Tensor:
        """`tokens` with the ids past this model's rows (padding rows of a wider target, which
        sampling may commit) read as its last row: drafts only steer, so any row will do."""
        if self.runner.vocab_size >= self.vocab:
            return tokens
        return tokens.clamp(max=self.runner.vocab_size - 1)


def shared_vocabulary(model: str, own: int, resources: Resources) -> tuple[int, int]:
    """(columns of the target's vocabulary, token ids this drafter may propose) for a drafter of
    `own` embedding rows: the pipeline checked that both share one tokenizer
    (`check_vocabularies`), so rows past the smaller embedding or the tokenizer's real tokens
    are padding."""
    target = resources.target_ref
    if not target or target == model:
        return own, own
    vocab = resources.vocab_size(target)
    usable = min(own, vocab)
    if own != vocab:
        real = resources.real_vocab(target)
        usable = usable if real is None else min(usable, real)
    return vocab, usable


def frequent_tokens(config: HFLMConfig, vocab_size: int, resources: Resources) -> Tensor | None:
    """The `config.head` most frequent token ids by `config.token_counts` (None without a head),
    ties to the lower id; errors name the field when the counts do not fit the model's
    vocabulary."""
    if config.head is None:
        return None
    return most_frequent_ids(
        resources,
        config.token_counts,
        config.head,
        vocab_size,
        f"the model {config.model!r}",
        "head",
    )


def most_frequent_ids(
    resources: Resources, counts_ref: str, k: int, vocab_size: int, owner: str, k_field: str
) -> Tensor:
    """`[k]` int64 the most frequent token ids by the counts `counts_ref` (ties to the lower id);
    errors name `token_counts` or `k_field` when they do not fit `owner`'s vocabulary."""
    try:
        counts = resources.token_counts(counts_ref)
    except (OSError, ValueError) as err:
        raise ValueError(f"token_counts: {err}") from err
    if counts.shape[0] != vocab_size:
        raise ValueError(
            f"token_counts: {counts_ref!r} counts {counts.shape[0]} token ids, but {owner} has "
            f"a vocabulary of {vocab_size}"
        )
    if k > vocab_size:
        raise ValueError(f"{k_field}: expected at most the vocabulary size {vocab_size}, got {k}")
    return torch.from_numpy(counts).neg().argsort(stable=True)[:k]


def scored_rows(frequent: Tensor, prompt: Tensor) -> Tensor:
    """`[K]` int64 the token ids a restricted head scores in a generation: the most frequent
    ones and the prompt's own, sorted and distinct (on the host)."""
    return torch.unique(torch.cat([frequent, prompt.cpu()]))
