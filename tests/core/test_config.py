"""Pipeline files -> validated specs: every malformed input is reported with its path."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np
import pytest
import torch
import yaml

from tests.conftest import tiny_llama
from treegraft.core.config import (
    ConfigError,
    DecodingConfig,
    PipelineSpec,
    load_pipeline_spec,
    override,
    parse_yaml,
    pipeline_spec_from_dict,
)
from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.registry import Registry, default_registry
from treegraft.core.resources import Resources
from treegraft.core.vocabularies import check_vocabularies

BASE: dict[str, Any] = {
    "target": "mem:target",
    "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
    "builder": {"name": "layered", "depth": 4, "top_k": 2, "budget": 16},
}


@pytest.fixture(scope="module")
def registry() -> Registry:
    """Built-ins only, so the lists of known names do not depend on installed plugins."""
    return Registry.create(autoload=False)


def error_of(data: Any, registry: Registry) -> str:
    """The message of the `ConfigError` that validating `data` raises."""
    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(data, registry)
    return str(info.value)


def write(tmp_path: Path, text: str, name: str = "pipeline.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------- malformed files


def test_malformed_yaml_names_line_and_column(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, "target: zoo:target\ndrafters: [ngram\nbuilder: layered\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline_spec(path, registry)
    message = str(info.value)
    assert message.startswith(f"{path}: malformed YAML at line 3, column 8:")


def test_yaml_syntax_error_in_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^p\.yaml: malformed YAML at line 1, column 14: "):
        parse_yaml("builder: name: layered\n", "p.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "budget: 010",
            "010 is an octal number in YAML 1.1 (8), text or another number to other "
            "readers: write 8 or 10 (no leading 0), or quote '010' for text",
        ),
        (
            "budget: 1:30",
            "1:30 is a base-60 number in YAML 1.1 (90), text or another number to "
            "other readers: write 90, or quote '1:30' for text",
        ),
        ("weight: -0:30.5", "-0:30.5 is a base-60 number in YAML 1.1 (-30.5)"),
        (
            "budget: !!int '0_7'",
            "0_7 is an octal number in YAML 1.1 (7), text or another number "
            "to other readers: write 7, or quote",
        ),
    ],
)
def test_yaml_11_numbers_other_readers_read_otherwise_are_refused(text: str, message: str) -> None:
    """PyYAML read `budget: 010` as 8 and `1:30` as 90, silently; now a line-numbered error."""
    with pytest.raises(ConfigError) as info:
        parse_yaml(f"builder:\n  {text}\n", "p.yaml")
    assert str(info.value).startswith(f"p.yaml: malformed YAML at line 2, column 11: {message}")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("-0", 0),
        ("0x10", 16),
        ("0b11", 3),
        ("1_000", 1000),
        ("01.5", 1.5),
        ("'010'", "010"),
    ],
)
def test_yaml_numbers_every_reader_agrees_on_are_read(text: str, value: object) -> None:
    assert parse_yaml(f"a: {text}\n") == {"a": value}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: load_pipeline_spec(5),
            "load_pipeline_spec: path: expected a file path, got int 5",
        ),
        (
            lambda: load_pipeline_spec(None),
            "load_pipeline_spec: path: expected a file path, got NoneType None",
        ),
        (
            lambda: pipeline_spec_from_dict(BASE, "x"),
            "pipeline_spec_from_dict: registry: expected a Registry, got str 'x'",
        ),
        (lambda: parse_yaml(None), "parse_yaml: text: expected YAML text, got NoneType None"),
    ],
    ids=["path-int", "path-none", "registry", "text"],
)
def test_api_arguments_of_another_type_are_named(call: Any, message: str) -> None:
    """Each was a raw TypeError or AttributeError ('str' object has no attribute 'get')."""
    with pytest.raises(ArgumentError) as info:
        call()
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("!!float x", "malformed YAML at line 1, column 4: !!float cannot read 'x'"),
        ("!!bool x", "malformed YAML at line 1, column 4: !!bool cannot read 'x'"),
        ("!!timestamp x", "malformed YAML at line 1, column 4: !!timestamp cannot read 'x'"),
        ("!!int x", "malformed YAML at line 1, column 4: !!int cannot read 'x'"),
        ("[1, !!float y]", "malformed YAML at line 1, column 8: !!float cannot read 'y'"),
        ("!!map [1]", "malformed YAML at line 1, column 4: expected a mapping node, but found"),
        ("{x: 1, x: 2}", "duplicate key 'x' at line 1, column 11 (first at line 1, column 5)"),
    ],
)
def test_a_value_its_tag_cannot_read_names_its_line(text: str, message: str) -> None:
    """`!!float x` was a raw ValueError, `!!bool x` a KeyError, `!!timestamp x` an
    AttributeError, `!!map [1]` a TypeError, `!!int x` 'an int of 1 digits is too long'; two
    keys of one flow mapping read 'at line 1 (first at line 1)'."""
    with pytest.raises(ConfigError) as info:
        parse_yaml(f"a: {text}\n", "p.yaml")
    assert str(info.value).startswith(f"p.yaml: {message}")


def test_a_tab_where_yaml_wants_spaces_says_so() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("builder:\n\tname: layered\n", "p.yaml")
    assert str(info.value) == (
        "p.yaml: malformed YAML at line 2, column 1: found character '\\t' that cannot start any "
        "token (a tab: YAML indents and separates with spaces; write spaces instead)"
    )


def test_missing_file(tmp_path: Path, registry: Registry) -> None:
    with pytest.raises(ConfigError, match="pipeline file not found"):
        load_pipeline_spec(tmp_path / "nope.yaml", registry)


def test_top_level_must_be_a_mapping(registry: Registry) -> None:
    assert error_of([BASE], registry).startswith("pipeline: expected a mapping with keys target")


# ---------------------------------------------------------------------------- path-addressed errors


BAD_INPUTS = {
    "unknown-component": (
        override(BASE, "drafters.weak.name", "ngarm"),
        "pipeline.drafters.weak.name: unknown drafter 'ngarm'; did you mean 'ngram'? "
        "known drafters: ",
    ),
    "wrong-type": (
        override(BASE, "builder.budget", "five"),
        "pipeline.builder.budget: expected int >= 1, got 'five'",
    ),
    "negative-budget": (
        override(BASE, "builder.budget", -3),
        "pipeline.builder.budget: expected int >= 1, got -3",
    ),
    "bool-for-int": (
        override(BASE, "builder.depth", True),
        "pipeline.builder.depth: expected int >= 1, got True",
    ),
    "yes-for-int": (
        override(BASE, "builder.depth", parse_yaml("yes")),
        "pipeline.builder.depth: expected int >= 1, got True (a boolean: YAML reads unquoted "
        "true/false, yes/no and on/off as booleans) (layers",
    ),
    "no-for-str": (
        override(BASE, "decoding", parse_yaml("{device: no}")),
        "pipeline.decoding.device: expected str 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got "
        "False (a boolean: YAML reads",
    ),
    "exponent-text-for-int": (
        override(BASE, "builder.budget", parse_yaml("1e3")),
        "pipeline.builder.budget: expected int >= 1, got '1e3' (text, as YAML reads a quoted "
        "number and PyYAML 1e3 or 1e-3; write 1000) (draft nodes",
    ),
    "exponent-text-for-float": (
        override(BASE, "verifier", parse_yaml("{name: pointmass, temperature: 5e-1}")),
        "pipeline.verifier.temperature: expected float > 0, got '5e-1' (text, as YAML reads a "
        "quoted number and PyYAML 1e3 or 1e-3; write 0.5) (softmax",
    ),
    "quoted-int": (
        override(BASE, "builder.budget", "64"),
        "pipeline.builder.budget: expected int >= 1, got '64' (text, as YAML reads a quoted "
        "number and PyYAML 1e3 or 1e-3; write 64)",
    ),
    "fraction-text-for-int": (
        override(BASE, "builder.budget", "2.5e0"),
        "pipeline.builder.budget: expected int >= 1, got '2.5e0' (draft nodes",
    ),
    "float-for-int": (
        override(BASE, "builder.top_k", 2.5),
        "pipeline.builder.top_k: expected int >= 1, got 2.5",
    ),
    "missing-required-key": (
        override(BASE, "drafters.strong", {"name": "hf_lm"}),
        "pipeline.drafters.strong.model: missing required key (expected str)",
    ),
    "extra-key": (
        override(BASE, "builder.bugdet", 8),
        "pipeline.builder.bugdet: unknown key; did you mean 'budget'? expected keys: depth, ",
    ),
    "extra-key-no-config": (
        override(BASE, "verifier", {"name": "greedy", "temperature": 0.5}),
        "pipeline.verifier.temperature: unknown key",
    ),
    "lookalike-name": (
        override(BASE, "drafters.weak.name", "ngr\u0430m"),  # a Cyrillic a
        "pipeline.drafters.weak.name: unknown drafter 'ngr\u0430m' (holds non-ASCII U+0430); "
        "did you mean 'ngram'?",
    ),
    "lookalike-key": (
        override(BASE, "builder.d\u0435pth", 3),  # a Cyrillic e
        "pipeline.builder.d\u0435pth: unknown key (holds non-ASCII U+0435); did you mean 'depth'?",
    ),
    "unknown-top-level-key": (
        {**BASE, "verifer": {"name": "greedy"}},
        "pipeline.verifer: unknown key; did you mean 'verifier'? expected keys: target, drafters",
    ),
    "missing-top-level-key": (
        {k: v for k, v in BASE.items() if k != "builder"},
        "pipeline.builder: missing required key",
    ),
    "component-without-name": (
        override(BASE, "builder", {"depth": 3}),
        "pipeline.builder.name: missing required key (the registered builder name)",
    ),
    "component-not-a-mapping": (
        override(BASE, "builder", 5),
        "pipeline.builder: expected a mapping with a 'name' key naming a builder, got 5",
    ),
    "target-not-a-string": (
        override(BASE, "target", 3),
        "pipeline.target: expected a model reference string (zoo:NAME or a path), got 3",
    ),
    "drafters-scalar": (
        override(BASE, "drafters", "ngram"),
        "pipeline.drafters: expected a mapping of role -> drafter or a list of drafters "
        "(cheapest first), got 'ngram'",
    ),
    "drafters-empty": (
        override(BASE, "drafters", {}),
        "pipeline.drafters: expected at least one drafter, got none",
    ),
    "drafter-config-check": (
        override(BASE, "drafters.weak.max_ngram", 0),
        "pipeline.drafters.weak.max_ngram: expected int >= 1, got 0",
    ),
    "list-element-check": (
        override(BASE, "scheduler", {"name": "layers", "layers": [0, -1]}),
        "pipeline.scheduler.layers: expected list of int each >= 0, got [0, -1]",
    ),
    "choice": (
        override(BASE, "decoding", {"dtype": "float8"}),
        "pipeline.decoding.dtype: expected one of 'float32', 'float64', 'bfloat16', 'float16', "
        "got 'float8'",
    ),
    "decoding-extra-key": (
        override(BASE, "decoding", {"max_tokens": 5}),
        "pipeline.decoding.max_tokens: unknown key; did you mean 'max_new_tokens'?",
    ),
    "optional-wrong-type": (
        override(BASE, "builder.max_strong_calls", "x"),
        "pipeline.builder.max_strong_calls: expected int >= 0, or null, got 'x'",
    ),
    "optional-out-of-range": (
        override(BASE, "builder.max_strong_calls", -1),
        "pipeline.builder.max_strong_calls: expected int >= 0, or null, got -1",
    ),
}


@pytest.mark.parametrize(("data", "message"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_reported_with_its_path(data: Any, message: str, registry: Registry) -> None:
    assert error_of(data, registry).startswith(message)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        ({"pairs": [{"target": "zoo:target"}], "suites": ["qa"]}, "a benchmark sweep file: run"),
        ({"name": "target", "models": {}, "tokens": 10}, "a zoo training recipe: train with"),
    ],
    ids=["sweep", "recipe"],
)
def test_a_file_of_another_kind_is_named_as_such(data: Any, kind: str, registry: Registry) -> None:
    """A sweep file given as a pipeline was refused for its first key alone."""
    message = error_of(data, registry)
    assert "unknown key" in message and f"; this looks like {kind}" in message
    assert "this looks like" not in error_of({**BASE, "suites": ["qa"]}, registry)  # a pipeline


def test_unknown_component_lists_every_known_name(registry: Registry) -> None:
    message = error_of(override(BASE, "drafters.weak.name", "ngarm"), registry)
    assert message.endswith(f"known drafters: {', '.join(registry.names('drafter'))}")
    assert {"hf_lm", "ngram"} <= set(registry.names("drafter"))


def test_errors_carry_the_field_doc_as_hint(registry: Registry) -> None:
    message = error_of(override(BASE, "builder.budget", -3), registry)
    assert message.endswith("(draft nodes verified per step (root excluded))")


def test_drafters_as_a_list_get_indexed_roles_and_paths(registry: Registry) -> None:
    data = override(BASE, "drafters", [{"name": "ngram"}, {"name": "hf_lm", "model": "mem:d"}])
    spec = pipeline_spec_from_dict(data, registry)
    assert [role for role, _ in spec.drafters] == ["drafter0", "drafter1"]
    bad = override(BASE, "drafters", [{"name": "ngram"}, {"name": "hf_lmm"}])
    assert error_of(bad, registry).startswith(
        "pipeline.drafters[1].name: unknown drafter 'hf_lmm'; did you mean 'hf_lm'?"
    )


def test_string_where_a_list_is_expected_is_rejected(registry: Registry) -> None:
    assert error_of(override(BASE, "decoding", {"stop": "###"}), registry).startswith(
        "pipeline.decoding.stop: expected list of str each non-empty, got '###'"
    )


# ---------------------------------------------------------------------------- vocabularies


@pytest.fixture
def model_dirs(tmp_path: Path) -> dict[str, Path]:
    """Three tiny random models saved in Hugging Face format: vocab 64, 64 and 48."""
    dirs = {}
    for name, vocab in (("target", 64), ("same", 64), ("other", 48)):
        dirs[name] = tmp_path / name
        tiny_llama(vocab=vocab, hidden=16, layers=1, heads=2, kv_heads=1).save_pretrained(
            dirs[name]
        )
    return dirs


def _two_model_pipeline(dirs: dict[str, Path], drafter: str) -> dict[str, Any]:
    data = override(BASE, "target", str(dirs["target"]))
    return override(data, "drafters.strong", {"name": "hf_lm", "model": str(dirs[drafter])})


def test_vocabulary_mismatch_names_the_drafter_path(
    model_dirs: dict[str, Path], registry: Registry
) -> None:
    spec = pipeline_spec_from_dict(_two_model_pipeline(model_dirs, "other"), registry)
    with pytest.raises(ConfigError) as info:
        check_vocabularies(spec, Resources())
    message = str(info.value)
    assert message.startswith("pipeline.drafters.strong.model: vocabulary mismatch:")
    assert "has 48 tokens but the target" in message and "has 64" in message


def test_vocabulary_mismatch_stops_load_pipeline_before_loading_models(
    model_dirs: dict[str, Path], registry: Registry, tmp_path: Path
) -> None:
    path = write(
        tmp_path, yaml.safe_dump(_two_model_pipeline(model_dirs, "other"), sort_keys=False)
    )
    with pytest.raises(ConfigError, match="vocabulary mismatch"):
        load_pipeline(path, registry=registry, resources=Resources())


def test_matching_vocabularies_pass(model_dirs: dict[str, Path], registry: Registry) -> None:
    spec = pipeline_spec_from_dict(_two_model_pipeline(model_dirs, "same"), registry)
    check_vocabularies(spec, Resources())


def test_missing_model_directory_is_a_config_error(tmp_path: Path, registry: Registry) -> None:
    spec = pipeline_spec_from_dict(override(BASE, "target", str(tmp_path / "none")), registry)
    with pytest.raises(ConfigError, match=r"^pipeline\.target: model .* not found"):
        check_vocabularies(spec, Resources())


# ---------------------------------------------------------------------------- valid files


VALID = """\
target: zoo:target
drafters:
  weak:   {name: ngram, max_ngram: 5}
  strong: {name: hf_lm, model: zoo:middle-m, temperature: 0.7}
builder:   {name: layered, depth: 5, top_k: 10, budget: 63}
scheduler: {name: layers, layers: [0, 2]}
verifier:  greedy
decoding:  {max_new_tokens: 64, stop: ["\\n\\n"], dtype: float64, device: cpu}
"""


def test_valid_file_is_structured(tmp_path: Path, registry: Registry) -> None:
    spec = load_pipeline_spec(write(tmp_path, VALID), registry)
    assert spec.target == "zoo:target"
    roles = {role: c for role, c in spec.drafters}
    assert list(roles) == ["weak", "strong"]
    assert roles["weak"].config.max_ngram == 5 and roles["weak"].config.chain_len == 3
    assert roles["strong"].config.temperature == 0.7
    assert roles["strong"].path == "pipeline.drafters.strong"
    assert (spec.builder.config.budget, spec.builder.config.max_strong_calls) == (63, None)
    assert spec.scheduler.config.layers == [0, 2]
    assert spec.verifier.name == "greedy"
    assert spec.rescorer is None and spec.grafter is None
    assert spec.decoding == DecodingConfig(
        max_new_tokens=64, stop=["\n\n"], dtype="float64", device="cpu"
    )


def _to_mapping(spec: PipelineSpec) -> dict[str, Any]:
    """The raw pipeline mapping that describes `spec` (the inverse of validation)."""

    def component(c) -> dict[str, Any]:
        return {"name": c.name, **attrs.asdict(c.config)}

    return {
        "target": spec.target,
        "drafters": {role: component(c) for role, c in spec.drafters},
        "builder": component(spec.builder),
        "scheduler": component(spec.scheduler),
        "verifier": component(spec.verifier),
        "decoding": attrs.asdict(spec.decoding),
    }


def test_valid_file_round_trips(tmp_path: Path, registry: Registry) -> None:
    spec = load_pipeline_spec(write(tmp_path, VALID), registry)
    again_path = write(tmp_path, yaml.safe_dump(_to_mapping(spec), sort_keys=False), "again.yaml")
    again = load_pipeline_spec(again_path, registry)
    assert attrs.evolve(again, source=spec.source) == spec


def test_defaults_fill_scheduler_verifier_and_decoding(registry: Registry) -> None:
    spec = pipeline_spec_from_dict({**BASE, "verifier": None}, registry)
    assert (spec.scheduler.name, spec.verifier.name) == ("never", "greedy")
    assert spec.decoding == DecodingConfig()
    assert spec.source == "<dict>"


# ---------------------------------------------------------------------------- override


def test_override_replaces_a_nested_key_without_mutating(registry: Registry) -> None:
    changed = override(BASE, "builder.budget", 8)
    assert changed["builder"] == {"name": "layered", "depth": 4, "top_k": 2, "budget": 8}
    assert BASE["builder"]["budget"] == 16
    assert pipeline_spec_from_dict(changed, registry).builder.config.budget == 8


def test_override_replaces_a_whole_component() -> None:
    changed = override(BASE, "scheduler", {"name": "always"})
    assert changed["scheduler"] == {"name": "always"}
    assert "scheduler" not in BASE


def test_override_creates_missing_leaf_keys() -> None:
    assert override(BASE, "decoding", {"seed": 3})["decoding"] == {"seed": 3}
    assert override(BASE, "drafters.weak.chain_len", 2)["drafters"]["weak"]["chain_len"] == 2


def test_override_reaches_into_a_component_given_by_name_alone(registry: Registry) -> None:
    """`verifier: pointmass` is short for `{name: pointmass}`: overriding one of its keys was
    'cannot override ...: not a mapping'."""
    data = {**BASE, "verifier": "pointmass", "drafters": {"weak": "ngram"}}
    changed = override(override(data, "verifier.temperature", 0.5), "drafters.weak.chain_len", 2)
    assert changed["verifier"] == {"name": "pointmass", "temperature": 0.5}
    assert changed["drafters"]["weak"] == {"name": "ngram", "chain_len": 2}
    spec = pipeline_spec_from_dict(changed, registry)
    assert spec.verifier.config.temperature == 0.5
    with pytest.raises(ConfigError, match=r"^pipeline\.target: cannot override 'target\.x': not"):
        override(data, "target.x", 1)  # a model reference is no component


def test_override_through_a_non_mapping_fails() -> None:
    with pytest.raises(ConfigError, match=r"^pipeline\.target: cannot override 'target\.x'"):
        override(BASE, "target.x", 1)
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding: cannot override .*: absent$"):
        override(BASE, "decoding.seed", 1)
    deep = "drafters.weak.name.x"
    with pytest.raises(
        ConfigError, match=rf"^pipeline\.drafters\.weak\.name: cannot override '{deep}'"
    ):
        override(BASE, deep, 1)


def test_override_reaches_into_list_form_drafters(registry: Registry) -> None:
    """`drafters: [...]` (roles drafter0, drafter1, ...) could not be reached at all ('cannot
    override ...: not a mapping'); an entry is addressed by its index or its role, like a
    role of the mapping form, and an entry past the end is named."""
    data = {**BASE, "drafters": [{"name": "ngram"}, "ngram"]}
    by_index = override(data, "drafters.1.max_ngram", 2)
    assert by_index == override(data, "drafters.drafter1.max_ngram", 2)
    assert by_index["drafters"] == [{"name": "ngram"}, {"name": "ngram", "max_ngram": 2}]
    assert data["drafters"] == [{"name": "ngram"}, "ngram"]  # not mutated
    assert pipeline_spec_from_dict(by_index, registry).drafters[1][1].config.max_ngram == 2
    assert override(data, "drafters.0", "ngram")["drafters"] == ["ngram", "ngram"]
    assert override({**BASE, "decoding": {"stop": ["a", "b"]}}, "decoding.stop.1", "c")[
        "decoding"
    ] == {"stop": ["a", "c"]}
    for key in ("2", "drafter2", "-1", "weak", "01"):
        with pytest.raises(
            ConfigError,
            match=rf"^pipeline\.drafters: cannot override 'drafters\.{key}\.max_ngram': no entry "
            rf"'{key}' in a list of 2 \(indices 0\.\.1 or roles drafter0\.\.drafter1\)$",
        ):
            override(data, f"drafters.{key}.max_ngram", 2)


def test_drafters_and_lists_given_as_tuples_or_arrays_are_lists(registry: Registry) -> None:
    """A tuple (or a 1-d array) of drafters was refused as 'expected a mapping of role ->
    drafter', and `override` could not reach into a tuple, while other list fields (`stop`)
    take them: both now read them as the list of their items."""
    import numpy as np

    listed = {**BASE, "drafters": [{"name": "ngram"}, "ngram"]}
    want = pipeline_spec_from_dict(listed, registry).drafters
    for given in (({"name": "ngram"}, "ngram"), np.array([{"name": "ngram"}, "ngram"])):
        assert pipeline_spec_from_dict({**BASE, "drafters": given}, registry).drafters == want
    data = {**BASE, "drafters": ({"name": "ngram"}, "ngram"), "decoding": {"stop": ("a", "b")}}
    out = override(override(data, "drafters.drafter1.max_ngram", 2), "decoding.stop.1", "c")
    assert out["drafters"] == [{"name": "ngram"}, {"name": "ngram", "max_ngram": 2}]
    assert out["decoding"]["stop"] == ["a", "c"] and data["drafters"][1] == "ngram"


@pytest.mark.parametrize("key", ["", "builder..budget", "builder.", 3, None])
def test_override_refuses_a_malformed_key(key: object) -> None:
    with pytest.raises(ConfigError, match=r"^override: expected a key or dotted path of keys"):
        override(BASE, key, 1)  # type: ignore[arg-type]


def test_override_refuses_a_non_mapping() -> None:
    with pytest.raises(ArgumentError, match="override: expected a pipeline mapping, got list"):
        override([], "builder.budget", 1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- shared tokenizers


def _save(path: Path, model, tokenizer) -> str:
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return str(path)


def _pipeline(target: str, drafter: str) -> dict[str, Any]:
    return {
        "target": target,
        "drafters": {"weak": {"name": "ngram"}, "strong": {"name": "hf_lm", "model": drafter}},
        "builder": {"name": "layered", "depth": 3, "top_k": 3, "budget": 8},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": 16, "dtype": "float64"},
    }


@pytest.mark.parametrize("drafter_vocab", [72, 64])
def test_a_drafter_with_a_padded_embedding_decodes_exactly_and_never_proposes_padding(
    tmp_path: Path, drafter_vocab: int
) -> None:
    """Same tokenizer (63 words + [UNK]), embeddings of 64 and 72 (or 64) rows."""
    from tests.conftest import greedy_reference, word_tokenizer

    tok = word_tokenizer(64)
    target = tiny_llama(seed=5, vocab=64)
    t_dir = _save(tmp_path / "t", target, tok)
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=drafter_vocab, hidden=16), tok)
    pipe = load_pipeline(_pipeline(t_dir, d_dir), resources=Resources(dtype=torch.float64))
    prompt = torch.tensor([3, 9, 27, 3, 9, 27, 3, 9])
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 16)
    proposed = torch.cat([e.build.unpruned.tokens for e in out.events])
    assert int(proposed.max()) < min(64, drafter_vocab)
    with torch.inference_mode():
        logp = pipe.decoder.drafters[1].score_tree(out.events[-1].build.unpruned)
    assert logp.shape[1] == 64


def test_a_sampled_padding_token_of_a_wider_target_does_not_break_a_narrower_drafter(
    tmp_path: Path,
) -> None:
    """Target of 72 rows, drafter of 64, one 64-token tokenizer: sampling (as plain sampling
    from the target would) may commit a padding id the drafter cannot embed; the drafter reads
    it as one of its own rows instead of failing mid-generation (an IndexError before)."""
    from tests.conftest import word_tokenizer

    tok = word_tokenizer(64)
    t_dir = _save(tmp_path / "t", tiny_llama(seed=5, vocab=72), tok)
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=64, hidden=16), tok)
    spec = _pipeline(t_dir, d_dir) | {"verifier": {"name": "pointmass", "temperature": 50.0}}
    pipe = load_pipeline(spec, resources=Resources(dtype=torch.float64))
    out = pipe.generate(torch.tensor([3, 9, 27, 3, 9, 27, 3, 9]), max_new_tokens=40)
    assert len(out.token_ids) == 40 and max(out.token_ids) >= 64  # padding ids were committed


def test_a_drafter_embedding_fewer_tokens_than_the_target_commits_is_refused(
    tmp_path: Path,
) -> None:
    """A drafter of 60 rows beside a target of 64 sharing one 64-token tokenizer: the target
    may commit a token the drafter cannot embed (an IndexError mid-generation), so the pipeline
    is refused when it is built, and by `validate`."""
    from tests.conftest import word_tokenizer

    tok = word_tokenizer(64)
    t_dir = _save(tmp_path / "t", tiny_llama(seed=5, vocab=64), tok)
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=60, hidden=16), tok)
    spec = pipeline_spec_from_dict(_pipeline(t_dir, d_dir), default_registry())
    with pytest.raises(ConfigError) as info:
        check_vocabularies(spec, Resources())
    assert str(info.value) == (
        f"pipeline.drafters.strong.model: {d_dir!r} embeds 60 tokens, fewer than the 64 the "
        f"target {t_dir!r} may commit (the tokenizer they share); a drafter must embed every "
        "token of the target's vocabulary"
    )


def test_a_target_whose_tokenizer_has_more_tokens_than_it_embeds_is_warned_of(
    tmp_path: Path,
) -> None:
    """A target of 64 rows shipped with an 80-token tokenizer (a token added without resizing
    the embedding, as some fine-tunes ship a `<pad>`): ids 64-79 have no embedding. Its own
    `generate` runs it, so the build does too, warning (and `validate` shows the warning) that
    a prompt holding such an id is refused; it then decodes as its `generate`. A `tokenizer:`
    that fits, or an embedding padded past the tokenizer (Qwen's, SmolLM2's), warns of nothing."""
    from tests.conftest import greedy_reference, word_tokenizer
    from treegraft.core.validation import checked_file
    from treegraft.core.vocabularies import VocabularyWarning

    model = tiny_llama(seed=5, vocab=64)
    t_dir = _save(tmp_path / "t", model, word_tokenizer(80))
    spec = {**_pipeline(t_dir, t_dir), "decoding": {"max_new_tokens": 4, "dtype": "float64"}}
    message = (
        f"pipeline.target: {t_dir!r}: its tokenizer has 80 tokens, but the model embeds 64 "
        "(vocab_size): ids 64 to 79 have no embedding, and a prompt holding one is refused "
        "(name a tokenizer that fits with the pipeline's `tokenizer:` key)"
    )
    with pytest.warns(VocabularyWarning) as caught:
        pipe = load_pipeline(spec, resources=Resources(dtype=torch.float64))
    assert [str(w.message) for w in caught if w.category is VocabularyWarning] == [message]
    assert list(pipe.generate([1, 2, 3]).token_ids) == greedy_reference(model, [1, 2, 3], 4)
    with pytest.raises(TreegraftError, match="70"):
        pipe.generate([1, 70, 3])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    _, errors, warned = checked_file(path)
    assert errors == [] and warned == [f"{path}: {message}"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", VocabularyWarning)
        fits = _save(tmp_path / "tok", tiny_llama(seed=5, vocab=8), word_tokenizer(64))
        load_pipeline({**spec, "tokenizer": fits}, resources=Resources(dtype=torch.float64))
        padded = _save(tmp_path / "p", tiny_llama(seed=5, vocab=80), word_tokenizer(64))
        load_pipeline(_pipeline(padded, padded), resources=Resources(dtype=torch.float64))


def test_two_different_tokenizers_are_refused_naming_both(tmp_path: Path) -> None:
    from tests.conftest import word_tokenizer

    other = word_tokenizer(64)
    other.add_tokens(["zz"])  # one more word: another token-to-id map
    t_dir = _save(tmp_path / "t", tiny_llama(seed=5, vocab=64), word_tokenizer(64))
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=64, hidden=16), other)
    with pytest.raises(ConfigError) as info:
        load_pipeline(_pipeline(t_dir, d_dir), resources=Resources(dtype=torch.float64))
    message = str(info.value)
    assert message.startswith("pipeline.drafters.strong.model: tokenizer mismatch")
    assert repr(t_dir) in message and repr(d_dir) in message
    assert f"(their token-to-id maps differ: {d_dir!r} has a token 'zz' at id 64, which " in message


@pytest.mark.parametrize(
    ("edit", "difference"),
    [
        ("swap", "id 3 is 't4' in {d} but 't3' in the target's, and 1 more id differs"),
        ("rename", "id 5 is 'zz' in {d} but 't5' in the target's"),
        ("drop", "{d} lacks the target's token 't62' (id 62)"),
    ],
    ids=["swap", "rename", "drop"],
)
def test_a_tokenizer_mismatch_says_which_token_differs(
    tmp_path: Path, edit: str, difference: str
) -> None:
    """Two tokenizers for one vocabulary size whose maps differ were refused as 'their
    token-to-id maps differ', without saying where; the message now names the first token
    that differs (by id) and how many more do."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.conftest import word_tokenizer

    words = {f"t{i}": i for i in range(63)} | {"[UNK]": 63}
    if edit == "swap":
        words |= {"t3": 4, "t4": 3}
    elif edit == "rename":
        words = {("zz" if w == "t5" else w): i for w, i in words.items()}
    else:
        del words["t62"]
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    t_dir = _save(tmp_path / "t", tiny_llama(seed=5, vocab=64), word_tokenizer(64))
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=64, hidden=16), other)
    spec = pipeline_spec_from_dict(_pipeline(t_dir, d_dir), default_registry())
    with pytest.raises(ConfigError) as info:
        check_vocabularies(spec, Resources())
    assert f"(their token-to-id maps differ: {difference.format(d=repr(d_dir))}); " in str(
        info.value
    )


def test_an_in_memory_targets_own_tokenizer_is_compared_with_the_drafters(
    tmp_path: Path,
) -> None:
    """A target added in memory with its tokenizer (`add_model(..., tokenizer=)`) beside a
    drafter folder whose tokenizer maps ids otherwise: only the sizes were compared, and the
    drafter was accepted; the target's given tokenizer is now compared as a folder's is."""
    from tests.conftest import word_tokenizer

    other = word_tokenizer(64)
    other.add_tokens(["zz"])
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=64, hidden=16), other)
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", tiny_llama(seed=5, vocab=64), tokenizer=word_tokenizer(64))
    spec = pipeline_spec_from_dict(_pipeline("mem:target", d_dir), default_registry())
    with pytest.raises(ConfigError) as info:
        check_vocabularies(spec, res)
    assert str(info.value).startswith(
        f"pipeline.drafters.strong.model: tokenizer mismatch: {d_dir!r} and the target "
        f"'mem:target' ship different tokenizers (their token-to-id maps differ: {d_dir!r} has "
        "a token 'zz' at id 64, which the target's lacks); "
    )
    res.add_model("mem:same", tiny_llama(seed=5, vocab=64), tokenizer=word_tokenizer(64))
    same = pipeline_spec_from_dict(_pipeline("mem:target", "mem:same"), default_registry())
    check_vocabularies(same, res)  # two in-memory models given one tokenizer: accepted


def test_a_drafter_tokenizer_without_tokenizer_json_is_compared_too(tmp_path: Path) -> None:
    """A drafter whose tokenizer is in `vocab.json` (no `tokenizer.json` to compare byte for
    byte): its token-to-id map is compared with the target's, not taken on trust."""
    import json

    from tests.conftest import word_tokenizer

    t_dir = _save(tmp_path / "t", tiny_llama(seed=5, vocab=64), word_tokenizer(64))
    d_dir = _save(tmp_path / "d", tiny_llama(seed=6, vocab=64, hidden=16), None)
    vocab = {f"w{i}": i for i in range(63)} | {"<|endoftext|>": 63}
    (Path(d_dir) / "vocab.json").write_text(json.dumps(vocab))
    (Path(d_dir) / "merges.txt").write_text("#version: 0.2\n")
    (Path(d_dir) / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    spec = pipeline_spec_from_dict(_pipeline(t_dir, d_dir), default_registry())
    with pytest.raises(
        ConfigError, match=r"^pipeline\.drafters\.strong\.model: tokenizer mismatch"
    ):
        check_vocabularies(spec, Resources())


# ---------------------------------------------------------------------------- found by fuzzing


@pytest.mark.parametrize("key", ["target", "drafters", "builder"])
def test_a_null_required_section_is_missing(registry: Registry, key: str) -> None:
    data = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered"},
        key: None,
    }
    assert error_of(data, registry) == f"pipeline.{key}: missing required key (null given)"


def test_sane_upper_bounds_name_the_bound(registry: Registry) -> None:
    data = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "budget": 100_000},
    }
    assert error_of(data, registry).startswith(
        "pipeline.builder.budget: expected int >= 1 and <= 8192, got 100000"
    )


def test_a_literal_field_lists_its_values() -> None:
    from treegraft.core.config import structure_config

    @attrs.frozen
    class Modes:
        mode: Literal["fast", "exact"] = "exact"

    with pytest.raises(ConfigError) as info:
        structure_config(Modes, {"mode": "quick"}, "pipeline.drafters.weak")
    assert str(info.value) == (
        "pipeline.drafters.weak.mode: expected one of 'fast', 'exact', got 'quick'"
    )
    assert structure_config(Modes, {"mode": "fast"}, "p").mode == "fast"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen
class Inner:
    a: int = 1


@attrs.frozen
class PluginTypes:
    """Field types a third-party plugin's Config may use besides the built-ins' own."""

    pair: tuple[int, str] = (1, "a")
    names: Sequence[str] = ()
    ids: frozenset[int] = frozenset()
    either: int | str = 0
    table: dict[str, int] = attrs.Factory(dict)
    color: Color = Color.RED
    inner: Inner = Inner()


PLUGIN_TYPES_BAD = {
    "pair-short": ("pair", [1], "p.pair: expected list of 2 items (int, str), got [1]"),
    "pair-type": ("pair", [1, 2], "p.pair: expected list of 2 items (int, str), got [1, 2]"),
    "sequence-letters": ("names", "abc", "p.names: expected list of str, got 'abc'"),
    "sequence-keys": ("names", {"a": 1}, "p.names: expected list of str, got {'a': 1}"),
    "set-letters": ("ids", "12", "p.ids: expected list of int, got '12'"),
    "union": ("either", 1.5, "p.either: expected int or str, got 1.5"),
    "dict": ("table", {"a": "1"}, "p.table: expected mapping of str to int, got {'a': '1'}"),
    "enum": ("color", "RED", "p.color: expected one of 'red', 'blue', got 'RED'"),
    "nested-key": ("inner", {"a": 2.5}, "p.inner.a: expected int, got 2.5"),
    "nested-type": ("inner", 5, "p.inner: expected mapping of Inner fields, got 5"),
}


@pytest.mark.parametrize(
    ("key", "value", "message"), PLUGIN_TYPES_BAD.values(), ids=PLUGIN_TYPES_BAD
)
def test_plugin_field_types_are_structured_strictly(key: str, value: Any, message: str) -> None:
    """A `tuple[int, str]` was read as a list of ints (`[1, 'a']` refused, `[1]` taken), a
    `Sequence[str]` or `frozenset[str]` took a string's letters or a mapping's keys, `int | str`
    refused both, a nested config's error named no key, an Enum or a dict named no values."""
    from treegraft.core.config import config_errors, structure_config

    with pytest.raises(ConfigError) as info:
        structure_config(PluginTypes, {key: value}, "p")
    assert str(info.value) == message
    assert config_errors(PluginTypes, {key: value}, "p") == [message]


def test_plugin_field_types_take_their_values() -> None:
    from treegraft.core.config import structure_config

    data = {"pair": [2, "b"], "names": ["x"], "ids": [3, 3], "either": "s", "color": "blue"}
    got = structure_config(PluginTypes, {**data, "table": {"k": 1}, "inner": {"a": 4}}, "p")
    assert (got.pair, got.names, got.ids, got.either) == ((2, "b"), ["x"], frozenset({3}), "s")
    assert (got.table, got.color, got.inner) == ({"k": 1}, Color.BLUE, Inner(4))
    assert structure_config(PluginTypes, {"either": 7}, "p").either == 7


def test_a_check_across_fields_names_the_field_and_the_component() -> None:
    """A Config's `__attrs_post_init__` refusing a combination is a `ConfigError` at its path
    (the n-gram drafter's `min_ngram` above `max_ngram` never drafted a token)."""
    data = {
        "target": "zoo:target",
        "drafters": {"weak": {"name": "ngram", "min_ngram": 5, "max_ngram": 2}},
        "builder": {"name": "layered"},
    }
    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(data, default_registry())
    assert str(info.value) == (
        "pipeline.drafters.weak.min_ngram: 5 is above max_ngram 2; expected min_ngram <= max_ngram"
    )


def test_a_device_map_key_naming_no_model_is_refused() -> None:
    data = {
        "target": "zoo:target",
        "drafters": {
            "weak": {"name": "ngram"},
            "strong": {"name": "hf_lm", "model": "zoo:draft-s"},
        },
        "builder": {"name": "layered"},
        "decoding": {"device_map": {"zoo:targte": "auto"}},
    }
    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(data, default_registry())
    assert str(info.value) == (
        "pipeline.decoding.device_map: 'zoo:targte' names no model of this pipeline; did you "
        "mean 'zoo:target'? expected keys: zoo:target, zoo:draft-s"
    )
    data["decoding"]["device_map"] = {"/models/x": "cpu"}  # no close name: the ';' stays
    with pytest.raises(ConfigError, match=r"names no model of this pipeline; expected keys: zoo"):
        pipeline_spec_from_dict(data, default_registry())
    data["decoding"]["device_map"] = {"zoo:draft-s": "cpu"}
    assert pipeline_spec_from_dict(data, default_registry()).decoding.device_map


@pytest.mark.parametrize("field", ["scheduler.threshold", "builder.stop_below"])
def test_nan_is_no_setting(field: str) -> None:
    """NaN compares false with everything: a threshold of NaN silently called at every layer."""
    section, key = field.split(".")
    names = {"scheduler": "distilled", "builder": "layered"}
    data = {
        "target": "zoo:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered"},
        section: {"name": names[section], key: float("nan")},
    }
    with pytest.raises(ConfigError, match=rf"^pipeline\.{field}: expected .*, not NaN, got nan"):
        pipeline_spec_from_dict(data, default_registry())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "decoding.seed",
            2**80,
            "pipeline.decoding.seed: expected int with 0 <= value <= 4294967295, got "
            "1208925819614629174706176",
        ),
        (
            "scheduler",
            {"name": "every_k", "drafter": 2**80},  # an int field without a check of its own
            "pipeline.scheduler.drafter: expected int with -9223372036854775808 <= value <= "
            "9223372036854775807, got 1208925819614629174706176",
        ),
        (
            "builder.budget",
            10**30,
            "pipeline.builder.budget: expected int >= 1 and <= 8192, got 10" + "0" * 29,
        ),
        ("builder.budget", -(10**30), "pipeline.builder.budget: expected int >= 1, got -10"),
        (
            "decoding.max_new_tokens",
            10**5000,  # past the digits Python converts to text
            "pipeline.decoding.max_new_tokens: expected int >= 1 and <= 1000000, got <int of "
            "about 5001 digits>",
        ),
        (
            "builder.max_strong_calls",
            2**80,
            "pipeline.builder.max_strong_calls: expected int >= 0 and <= 9223372036854775807, or "
            "null, got 1208925819614629174706176",
        ),
    ],
    ids=["seed-32-bits", "unchecked", "sane-bound", "negative", "too-long-to-print", "optional"],
)
def test_an_int_past_64_bits_names_the_range(
    field: str, value: Any, message: str, registry: Registry
) -> None:
    assert error_of(override({**BASE, "decoding": {}}, field, value), registry).startswith(message)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**32 + 7, 2**63 - 1])
def test_a_seed_past_32_bits_is_refused_not_aliased(seed: int, registry: Registry) -> None:
    """torch's CPU generator keeps a seed's low 32 bits: 2**32 would draw seed 0's numbers (and
    -1 those of 2**32 - 1), so the same sample would come out under two "different" seeds."""
    low = seed % 2**32
    draws = [torch.rand(4, generator=torch.Generator().manual_seed(s)) for s in (seed, low)]
    assert torch.equal(*draws)  # why the range stops at 32 bits
    message = error_of(override({**BASE, "decoding": {}}, "decoding.seed", seed), registry)
    assert message.startswith(
        f"pipeline.decoding.seed: expected int with 0 <= value <= 4294967295, got {seed}"
    )
    spec = pipeline_spec_from_dict(override(BASE, "decoding", {"seed": 2**32 - 1}), registry)
    assert spec.decoding.seed == 2**32 - 1


def test_numpy_scalars_are_the_numbers_they_equal(registry: Registry) -> None:
    data = override(BASE, "builder.budget", np.int64(32))
    data = override(data, "decoding", {"seed": np.uint8(3), "chat": np.True_})
    data = override(data, "verifier", {"name": "pointmass", "temperature": np.float32(0.5)})
    spec = pipeline_spec_from_dict(data, registry)
    assert spec.builder.config.budget == 32 and type(spec.builder.config.budget) is int
    assert spec.decoding.seed == 3 and spec.decoding.chat is True
    assert spec.verifier.config.temperature == 0.5
    layers = override(BASE, "scheduler", {"name": "layers", "layers": np.array([0, 2])})
    assert pipeline_spec_from_dict(layers, registry).scheduler.config.layers == [0, 2]
    grid = override(BASE, "scheduler", {"name": "layers", "layers": np.zeros((2, 2), int)})
    assert error_of(grid, registry).startswith("pipeline.scheduler.layers: expected list of int")
    assert error_of(override(BASE, "builder.budget", np.True_), registry).startswith(
        "pipeline.builder.budget: expected int >= 1, got np.True_"
    )
    assert error_of(override(BASE, "builder.budget", np.float64(2.5)), registry).startswith(
        "pipeline.builder.budget: expected int >= 1, got np.float64(2.5)"
    )


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("decoding.device", "x" * 5000, "'" + "x" * 27 + "..." + "x" * 28 + "' (5000 characters)"),
        ("decoding.stop", [""] * 3000, "['', '', '', '', '', '', '', '', ...] (3000 items)"),
        ("target", list(range(3000)), "[0, 1, 2, 3, 4, 5, 6, 7, ...] (3000 items)"),
    ],
    ids=["string", "list", "target"],
)
def test_long_values_are_shortened_in_messages(
    field: str, value: Any, shown: str, registry: Registry
) -> None:
    message = error_of(override({**BASE, "decoding": {}}, field, value), registry)
    assert f"got {shown}" in message and len(message) < 400


@pytest.mark.parametrize("key", ["target", "builder", "decoding.stop", "scheduler.layers"])
def test_yaml_aliases_nesting_billions_of_items_are_shown_at_once(
    key: str, tmp_path: Path, registry: Registry
) -> None:
    """A 600-byte file nests 9 lists of 9 through aliases ten deep (3.4e9 items); its error
    message spelled them all out first (`repr`), for minutes, out of memory; now it is shown
    shortened at once."""

    def nested(depth: int) -> str:
        if depth == 0:
            return "&a0 [" + ", ".join(["lol"] * 9) + "]"
        return f"&a{depth} [{nested(depth - 1)}" + f", *a{depth - 1}" * 8 + "]"

    data = override(
        {**BASE, "scheduler": {"name": "layers", "layers": [0]}, "decoding": {}}, key, "BOMB"
    )
    path = write(tmp_path, yaml.safe_dump(data).replace("BOMB", nested(9)))
    assert path.stat().st_size < 700
    with pytest.raises(ConfigError) as info:
        load_pipeline_spec(path, registry)
    assert "got [[...], [...], [...], [...], [...], [...], [...], [...], ...] (9 items)" in str(
        info.value
    )
    assert len(str(info.value)) < 400


def test_a_long_unknown_key_is_shortened(registry: Registry) -> None:
    message = error_of({**BASE, "k" * 3000: 1}, registry)
    assert message.startswith("pipeline." + "k" * 30 + "...") and len(message) < 400
    assert "(3000 characters): unknown key" in message


def test_an_int_too_long_to_read_names_its_line(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, "target: mem:target\nseed: " + "1" * 5000 + "\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline_spec(path, registry)
    assert str(info.value) == (
        f"{path}: malformed YAML at line 2, column 7: an int of 5000 digits is too long"
    )
