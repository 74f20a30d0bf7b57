"""The built-in components, registered through the same hooks as third-party plugins."""

from __future__ import annotations

from treegraft.core.hookspecs import Register, hookimpl
from treegraft.plugins.builders.layered import LayeredBuilder
from treegraft.plugins.drafters.eagle import EagleDrafter
from treegraft.plugins.drafters.hf_lm import HFLMDrafter
from treegraft.plugins.drafters.ngram import NgramDrafter
from treegraft.plugins.grafters.reselect import ReplaceGrafter, ReselectGrafter
from treegraft.plugins.rescorers.basic import InterpolateRescorer, OverwriteRescorer
from treegraft.plugins.schedulers.basic import AlwaysScheduler, LayersScheduler, NeverScheduler
from treegraft.plugins.schedulers.distilled import DistilledScheduler
from treegraft.plugins.schedulers.heuristic import (
    BudgetedScheduler,
    EveryKScheduler,
    PlanScheduler,
    ThresholdScheduler,
)
from treegraft.plugins.schedulers.oracle import OracleScheduler
from treegraft.plugins.verifiers.greedy import GreedyVerifier
from treegraft.plugins.verifiers.pointmass import PointMassVerifier


@hookimpl
def treegraft_register_drafters(register: Register) -> None:
    register("ngram", NgramDrafter)
    register("hf_lm", HFLMDrafter)
    register("eagle", EagleDrafter)


@hookimpl
def treegraft_register_builders(register: Register) -> None:
    register("layered", LayeredBuilder)


@hookimpl
def treegraft_register_rescorers(register: Register) -> None:
    register("overwrite", OverwriteRescorer)
    register("interpolate", InterpolateRescorer)


@hookimpl
def treegraft_register_grafters(register: Register) -> None:
    register("reselect", ReselectGrafter)
    register("replace", ReplaceGrafter)


@hookimpl
def treegraft_register_schedulers(register: Register) -> None:
    register("never", NeverScheduler)
    register("always", AlwaysScheduler)
    register("layers", LayersScheduler)
    register("every_k", EveryKScheduler)
    register("threshold", ThresholdScheduler)
    register("budgeted", BudgetedScheduler)
    register("plan", PlanScheduler)
    register("distilled", DistilledScheduler)
    register("oracle", OracleScheduler)


@hookimpl
def treegraft_register_verifiers(register: Register) -> None:
    register("greedy", GreedyVerifier)
    register("pointmass", PointMassVerifier)
