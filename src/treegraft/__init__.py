"""treegraft: lossless tree-based speculative decoding with several drafters sharing one draft tree.

The public API:

- `load_pipeline(path_or_name_or_mapping)` -> `Pipeline` with `generate`, `stream` and `steps`;
- `hookimpl`, the marker for plugin hook implementations (see `treegraft.core.hookspecs`);
- the interfaces a plugin implements and the value objects they exchange.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: where each public name lives; imported on first use, so that `import treegraft.cli` (the
#: `treegraft` script) answers Ctrl-C and `--help` before torch and transformers load
_EXPORTS = {
    "hookimpl": "treegraft.core.hookspecs",
    **dict.fromkeys(
        (
            "BuildResult",
            "Drafter",
            "Graft",
            "Grafter",
            "LayerState",
            "Rescorer",
            "Rescoring",
            "Scheduler",
            "StepOutcome",
            "TreeBuilder",
            "Verdict",
            "Verifier",
        ),
        "treegraft.core.interfaces",
    ),
    "AcceptHistory": "treegraft.core.metrics",
    "Generation": "treegraft.core.pipeline",
    "Pipeline": "treegraft.core.pipeline",
    "load_pipeline": "treegraft.core.pipeline",
    "DraftTree": "treegraft.core.tree",
    "Proposal": "treegraft.core.tree",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'treegraft' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
