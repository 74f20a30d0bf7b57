"""treegraft: lossless tree-based speculative decoding with several drafters sharing one draft tree.

The public API:

- `load_pipeline(path_or_name_or_mapping)` -> `Pipeline` with `generate`, `stream` and `steps`;
- `hookimpl`, the marker for plugin hook implementations (see `treegraft.core.hookspecs`);
- the interfaces a plugin implements and the value objects they exchange.
"""

from treegraft.core.hookspecs import hookimpl
from treegraft.core.interfaces import (
    BuildResult,
    Drafter,
    Graft,
    Grafter,
    LayerState,
    Rescorer,
    Rescoring,
    Scheduler,
    StepOutcome,
    TreeBuilder,
    Verdict,
    Verifier,
)
from treegraft.core.metrics import AcceptHistory
from treegraft.core.pipeline import Generation, Pipeline, load_pipeline
from treegraft.core.tree import DraftTree, Proposal

__version__ = "0.1.0"

__all__ = [
    "AcceptHistory",
    "BuildResult",
    "DraftTree",
    "Drafter",
    "Generation",
    "Graft",
    "Grafter",
    "LayerState",
    "Pipeline",
    "Proposal",
    "Rescorer",
    "Rescoring",
    "Scheduler",
    "StepOutcome",
    "TreeBuilder",
    "Verdict",
    "Verifier",
    "hookimpl",
    "load_pipeline",
]
