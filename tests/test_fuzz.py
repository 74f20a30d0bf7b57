"""Fuzzing: mutated shipped pipelines and garbage-returning plugins either raise the project's own
error type (`TreegraftError`) naming the field or component, or decode exactly what plain greedy
decoding produces. Never another exception type, never a different output.

Examples are bounded (`FUZZ_EXAMPLES`) so the suite stays fast in CI.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import faulty
from tests.conftest import greedy_reference, memory_resources, tiny_llama
from treegraft.core.config import ConfigError, parse_yaml
from treegraft.core.errors import TreegraftError
from treegraft.core.pipeline import PIPELINES_DIR, builtin_pipelines, load_pipeline
from treegraft.core.registry import PluginError, Registry

VOCAB = 8192  # the zoo's: shipped `head` settings and token counts apply as they are
PROMPT = torch.tensor([5, 9, 5, 9, 13, 5, 9, 5, 9, 13])
MAX_NEW = 8
FUZZ_EXAMPLES = 30
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: a value naming where an error is: a YAML path (`pipeline.builder.budget`), a duplicate key,
#: a component (`drafter 'faulty' (distribution ...)`), or an argument
NAMES_WHERE = re.compile(
    r"pipeline(\.[A-Za-z_]\w*|\[\d+\])+|duplicate key '|(drafter|builder|grafter|rescorer|"
    r"scheduler|verifier) '[^']+' \(distribution|^max_new_tokens|^stop"
)

TARGET = tiny_llama(seed=11, vocab=VOCAB)
DRAFT = tiny_llama(seed=12, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1)
REFERENCE = greedy_reference(TARGET, PROMPT, MAX_NEW)
MODELS = {"zoo:target": "mem:target"}


def shipped(name: str) -> dict:
    """A shipped pipeline with its zoo models replaced by tiny in-memory ones."""
    data = yaml.safe_load((PIPELINES_DIR / f"{name}.yaml").read_text())
    return swap_models(data)


def swap_models(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: swap_models(v) for k, v in value.items()}
    if isinstance(value, list):
        return [swap_models(v) for v in value]
    if isinstance(value, str) and value.startswith("zoo:") and value != "zoo:scheduler":
        return MODELS.get(value, "mem:draft")
    return value


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested mappings (lists are leaves)."""
    if not isinstance(value, dict):
        return []
    out = []
    for key, child in value.items():
        out.append((*prefix, key))
        out += paths(child, (*prefix, key))
    return out


def parent_of(data: dict, path: tuple) -> dict:
    for key in path[:-1]:
        data = data[key]
    return data


GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from([0, -1, 1, 2, 10**6, 2**63, float("nan"), float("inf"), -0.5, 1e20]),
    st.text(max_size=6),
    st.lists(st.integers(-3, 60), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@st.composite
def mutated(draw) -> dict:
    """A shipped pipeline with one to three keys deleted, retyped, renamed, or (integers) moved
    to small values in or just out of range."""
    data = shipped(draw(st.sampled_from(builtin_pipelines())))
    for _ in range(draw(st.integers(1, 3))):
        keys = paths(data)
        if not keys:
            break
        path = draw(st.sampled_from(keys))
        parent = parent_of(data, path)
        op = draw(st.sampled_from(["delete", "retype", "rename", "nudge"]))
        value = parent[path[-1]]
        if op == "nudge" and isinstance(value, int) and not isinstance(value, bool):
            parent[path[-1]] = draw(st.integers(-1, 6))  # in range or just out of it
        elif op == "delete":
            del parent[path[-1]]
        elif op == "retype":
            parent[path[-1]] = draw(GARBAGE)
        else:
            value = parent.pop(path[-1])
            name = str(path[-1])
            typo = draw(st.sampled_from([name + "s", name[:-1], name.upper(), "_" + name]))
            parent[typo] = value
    return data


def resources():
    return memory_resources(target=TARGET, draft=DRAFT)


def assert_own_error_naming_where(exc: BaseException) -> None:
    assert isinstance(exc, TreegraftError), f"{type(exc).__name__}: {exc}"
    assert NAMES_WHERE.search(str(exc)), str(exc)


def decode_or_error(data: dict, registry: Registry | None = None) -> list[int] | None:
    """The decoded tokens, or None after checking the error is ours and names where."""
    try:
        pipe = load_pipeline(data, resources=resources(), registry=registry)
        return list(pipe.generate(PROMPT, max_new_tokens=MAX_NEW).token_ids), pipe
    except Exception as exc:  # the property is about the exception type
        assert_own_error_naming_where(exc)
        return None, None


@FUZZ
@given(data=mutated())
def test_mutated_shipped_pipelines_fail_cleanly_or_decode_exactly(data: dict) -> None:
    tokens, pipe = decode_or_error(copy.deepcopy(data))
    if tokens is not None and pipe.spec.verifier.name == "greedy":
        assert tokens == REFERENCE


@FUZZ
@given(
    name=st.sampled_from(builtin_pipelines()),
    line=st.integers(0, 20),
)
def test_a_duplicated_line_is_a_duplicate_key_error_or_harmless(name: str, line: int) -> None:
    lines = (PIPELINES_DIR / f"{name}.yaml").read_text().splitlines()
    keyed = [i for i, text in enumerate(lines) if re.match(r"^\w+:", text)]
    i = keyed[line % len(keyed)]
    text = "\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
    with pytest.raises(ConfigError, match=r"duplicate key '\w+' at line \d+ \(first at line \d+\)"):
        parse_yaml(text, f"{name}.yaml")


FAULTY = Registry.create(autoload=False, plugins=[faulty.plugin()])
FAULTS = {
    "drafter": sorted(set(faulty.PROPOSAL_FAULTS) - {"slow"}),
    "strong": sorted(faulty.SCORE_FAULTS),
    "builder": sorted(faulty.TREE_FAULTS),
    "grafter": sorted(faulty.TREE_FAULTS),
}


@st.composite
def garbage_pipelines(draw) -> dict:
    """A pipeline with one faulty component returning a drawn fault at a drawn call."""
    kind = draw(st.sampled_from(sorted(FAULTS)))
    bad = {
        "name": "faulty",
        "fault": draw(st.sampled_from(FAULTS[kind])),
        "at_call": draw(st.integers(-1, 6)),
        "seed": draw(st.integers(0, 100)),
    }
    data = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "faulty", "seed": 3}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"dtype": "float64", "device": "cpu"},
    }
    if kind == "drafter":
        data["drafters"] = {"weak": bad}
    elif kind == "builder":
        data["builder"] = bad
    else:
        strong = bad if kind == "strong" else {"name": "faulty"}
        data["drafters"] = {"weak": {"name": "ngram"}, "strong": strong}
        data["grafter"] = bad if kind == "grafter" else {"name": "reselect"}
        data["scheduler"] = draw(st.sampled_from(["always", {"name": "every_k", "k": 2}]))
    return data


@FUZZ
@given(data=garbage_pipelines())
def test_garbage_from_a_plugin_is_its_error_or_changes_nothing(data: dict) -> None:
    tokens, _ = decode_or_error(data, FAULTY)
    if tokens is not None:
        assert tokens == REFERENCE


def test_the_fuzzers_see_every_shipped_pipeline() -> None:
    assert {p.stem for p in Path(PIPELINES_DIR).glob("*.yaml")} == set(builtin_pipelines())
    with pytest.raises(PluginError):
        load_pipeline(
            {**shipped("ngram-only"), "drafters": {"w": {"name": "faulty", "fault": "None"}}},
            resources=resources(),
            registry=FAULTY,
        ).generate(PROMPT, max_new_tokens=2)
