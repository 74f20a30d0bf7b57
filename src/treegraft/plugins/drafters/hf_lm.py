"""Language-model drafter: any Hugging Face causal LM sharing the target's vocabulary.

It keeps its own preallocated KV cache (a `CausalLMRunner`), catches up lazily on committed tokens
it has not seen, and forwards only the tree nodes it has not seen yet in this step. Both verbs,
`expand` (top-k children of frontier nodes) and `score_tree` (next-token log-probs after every
node, for rescoring and grafting), reuse the same per-node distributions.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from treegraft.core.config import between, field
from treegraft.core.interfaces import Drafter
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree, Proposal


@attrs.frozen
class HFLMConfig:
    """Hyper-parameters of the language-model drafter."""

    model: str = field(doc="model reference: 'zoo:NAME' or a Hugging Face model directory")
    temperature: float = field(
        1.0, check=between(0.0, 100.0, open_low=True), doc="softmax temperature of the draft scores"
    )


@attrs.define
class HFLMDrafter(Drafter):
    """Drafts with a (small) Hugging Face causal LM; can score whole trees in one forward."""

    Config = HFLMConfig
    can_score = True

    config: HFLMConfig
    runner: CausalLMRunner
    node_logp: Tensor | None = None  # [n_seen, V] next-token log-probs after each seen node

    @classmethod
    def from_config(cls, config: HFLMConfig, resources: Resources) -> HFLMDrafter:
        return cls(config, resources.runner(config.model))

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.runner.begin(prompt, max_len=max_len)
        self.node_logp = None

    def _score(self, tree: DraftTree) -> Tensor:
        """`[n, V]` log-probs for every node of `tree`, forwarding only the unseen ones."""
        if tree.n_nodes > self.runner.n_seen:
            logits = self.runner.forward_tree(tree)  # [n_new, V]
            logits = logits.float()
            if self.config.temperature != 1.0:  # dividing by 1 changes nothing but costs a pass
                logits = logits / self.config.temperature
            logp = torch.log_softmax(logits, dim=-1)
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
