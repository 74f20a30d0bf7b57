"""The sweep file: defaults, strictness and path-addressed errors."""

from __future__ import annotations

import pytest
import yaml

from treegraft.bench.config import BASELINES, bench_config_from_dict, load_bench_config
from treegraft.bench.methods import pipeline_mapping, pipeline_plans, substitute_models
from treegraft.core.config import ConfigError
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import resolve_pipeline
from treegraft.zoo import SUITES

PAIR = {"target": "zoo:target", "drafter": "zoo:draft-s"}


def test_defaults_cover_every_suite_and_baseline():
    cfg = bench_config_from_dict({"pairs": [PAIR]})
    assert cfg.settings.suites == list(SUITES)
    assert cfg.settings.baselines == list(BASELINES)
    assert cfg.settings.dtype == "float32"
    assert cfg.pairs[0].name == "target+draft-s"
    assert cfg.pipelines == ()


def test_entries_accept_names_and_mappings():
    cfg = bench_config_from_dict(
        {
            "pairs": [PAIR],
            "pipelines": [
                "treegraft",
                {
                    "pipeline": "treegraft-threshold",
                    "label": "tg-every2",
                    "override": {"scheduler": {"name": "every_k", "k": 2}},
                },
            ],
        }
    )
    assert [e.name for e in cfg.pipelines] == ["treegraft", "tg-every2"]
    assert cfg.pipelines[1].override == {"scheduler": {"name": "every_k", "k": 2}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"pairs": [PAIR], "prompts": 3},
            "bench.prompts: unknown key; did you mean 'prompts_per_suite'?",
        ),
        ({"suites": ["qa"]}, "bench.pairs: missing required key"),
        (
            {"pairs": [PAIR, {"target": "zoo:target"}]},
            "bench.pairs[1].drafter: missing required key",
        ),
        ({"pairs": [PAIR], "max_new_tokens": 0}, "bench.max_new_tokens: expected int >= 1"),
        (  # it was refused as a pipeline's `decoding.max_new_tokens`, not the bench's field
            {"pairs": [PAIR], "max_new_tokens": 10**11},
            "bench.max_new_tokens: expected int >= 1 and <= 1000000, got 100000000000",
        ),
        (
            {"pairs": [PAIR], "baselines": ["hf-assisted", "medusa"]},
            "bench.baselines[1]: unknown baseline 'medusa'",
        ),
        (
            {
                "pairs": [PAIR],
                "pipelines": [{"pipeline": "treegraft-threshold", "substitute": "some"}],
            },
            "bench.pipelines[0].substitute: expected one of 'strongest', 'all', 'none', got 'some'",
        ),
        (
            {"pairs": [PAIR], "pipelines": [{"pipeline": "treegraft-threshold", "label": 3}]},
            "bench.pipelines[0].label: expected str non-empty, or null, got 3",
        ),
        (
            {"pairs": [PAIR], "pipelines": ["chain"]},
            "bench.pipelines[0].label: the name 'chain' is already taken",
        ),
        ({"pairs": [PAIR, PAIR]}, "bench.pairs[1]: duplicate pair 'target+draft-s'"),
        (  # an empty label fell back to the default name, unnoticed
            {"pairs": [{**PAIR, "label": ""}]},
            "bench.pairs[0].label: expected str non-empty, or null, got ''",
        ),
        (
            {"pairs": [PAIR], "pipelines": [{"pipeline": "chain", "label": " "}]},
            "bench.pipelines[0].label: expected str non-empty, or null, got ' '",
        ),
        (
            {"pairs": [PAIR], "executor": {"name": "ray", "workers": 0}},
            "bench.executor.workers: expected int >= 1, or null, got 0",
        ),
        (  # these empty values of the wrong type were read as "no pipelines", unnoticed
            {"pairs": [PAIR], "pipelines": {}},
            "bench.pipelines: expected a list of pipeline names or entries, got {}",
        ),
        ({"pairs": [PAIR], "pipelines": 0}, "bench.pipelines: expected a list of pipeline"),
        (  # ... and as the default (local) executor
            {"pairs": [PAIR], "executor": ""},
            "bench.executor: expected a mapping of ExecutorSettings fields, got ''",
        ),
        ({"pairs": [PAIR], "executor": []}, "bench.executor: expected a mapping of Executor"),
    ],
)
def test_errors_name_the_path(data, message):
    with pytest.raises(ConfigError) as exc:
        bench_config_from_dict(data)
    assert message in str(exc.value)


def test_quick_shrinks_the_protocol():
    cfg = bench_config_from_dict({"pairs": [PAIR], "prompts_per_suite": 30, "repeat": 3}).quick()
    assert (cfg.settings.prompts_per_suite, cfg.settings.max_new_tokens, cfg.settings.repeat) == (
        2,
        32,
        1,
    )


def test_pair_models_are_substituted_into_the_strongest_lm_drafter():
    raw = {
        "target": "zoo:target",
        "drafters": {
            "weak": {"name": "ngram"},
            "mid": {"name": "hf_lm", "model": "zoo:draft-s"},
            "strong": {"name": "hf_lm", "model": "zoo:draft-l"},
        },
    }
    pair = bench_config_from_dict({"pairs": [{"target": "mem:t", "drafter": "mem:d"}]}).pairs[0]
    out = substitute_models(raw, pair, "strongest")
    assert out["target"] == "mem:t"
    assert [d.get("model") for d in out["drafters"].values()] == [None, "zoo:draft-s", "mem:d"]
    assert [d.get("model") for d in substitute_models(raw, pair, "all")["drafters"].values()] == [
        None,
        "mem:d",
        "mem:d",
    ]
    assert raw["drafters"]["strong"]["model"] == "zoo:draft-l"  # the input is not modified


def test_a_pairs_drafter_options_go_into_the_drafter_it_replaces():
    raw = {
        "target": "zoo:target",
        "drafters": {
            "weak": {"name": "ngram"},
            "strong": {"name": "hf_lm", "model": "zoo:draft-m", "head": 2048},
        },
    }
    options = {"head": 4096, "token_counts": "zoo:smollm2-token-counts"}
    pair = bench_config_from_dict(
        {"pairs": [{"target": "mem:t", "drafter": "mem:d", "drafter_options": options}]}
    ).pairs[0]
    out = substitute_models(raw, pair, "strongest")
    assert out["drafters"]["strong"] == {"name": "hf_lm", "model": "mem:d", **options}
    assert out["drafters"]["weak"] == {"name": "ngram"}
    assert substitute_models(raw, pair, "none")["drafters"]["strong"]["head"] == 2048
    with pytest.raises(ConfigError, match=r"pairs\[0\]\.drafter_options"):
        bench_config_from_dict(
            {"pairs": [{"target": "mem:t", "drafter": "mem:d", "drafter_options": [1]}]}
        )


def test_overrides_apply_after_substitution_and_decoding_is_the_bench_s():
    cfg = bench_config_from_dict(
        {
            "pairs": [PAIR],
            "max_new_tokens": 17,
            "pipelines": [
                {"pipeline": "treegraft-threshold", "label": "x", "override": {"builder.budget": 7}}
            ],
        }
    )
    raw = pipeline_mapping(cfg.pipelines[0], cfg.pairs[0], cfg.settings, cfg.base_dir, "here")
    assert raw["builder"]["budget"] == 7
    assert raw["drafters"]["strong"]["model"] == "zoo:draft-s"
    assert raw["decoding"]["max_new_tokens"] == 17 and raw["decoding"]["stop"] == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"target": "zoo:draft-m"}, "override.target: the pair sets every pipeline's target"),
        ({"decoding.max_new_tokens": 5}, "decoding.max_new_tokens to 5, but the sweep sets it"),
        ({"decoding": {"stop": ["x"]}}, "override.decoding: sets decoding.stop to ['x']"),
        ({"decoding.dtype": "float64"}, "decoding.dtype to 'float64', but the sweep sets it"),
    ],
)
def test_an_override_of_what_the_sweep_sets_is_refused(override, message):
    """Once kept silently: another target (compared with the pair's target's plain decoding),
    or a decoding key the sweep then replaced."""
    entry = {"pipeline": "ngram-only", "label": "x", "override": override}
    cfg = bench_config_from_dict({"pairs": [PAIR], "baselines": [], "pipelines": [entry]})
    with pytest.raises(ConfigError, match=r"bench.pipelines\[0\]\.override\.") as info:
        pipeline_plans(cfg, cfg.pairs[0])
    assert message in str(info.value)


@pytest.mark.parametrize(
    "override", [{"decoding.check_model": False}, {"decoding.dtype": "float32"}]
)
def test_an_override_of_other_decoding_keys_or_to_the_sweeps_value_is_kept(override):
    entry = {"pipeline": "ngram-only", "label": "x", "override": override}
    cfg = bench_config_from_dict({"pairs": [PAIR], "baselines": [], "pipelines": [entry]})
    assert [plan.label for plan in pipeline_plans(cfg, cfg.pairs[0])] == ["x"]


@pytest.mark.parametrize("options", [{"model": "zoo:draft-m"}, {"name": "ngram", "head": 8}])
def test_drafter_options_may_not_name_another_drafter(options):
    """`drafter_options: {model: ...}` once replaced the pair's drafter without a word."""
    pair = {**PAIR, "drafter_options": options}
    with pytest.raises(ConfigError, match=r"bench.pairs\[0\].drafter_options: .*not name or model"):
        bench_config_from_dict({"pairs": [pair]})


def test_a_pipeline_file_given_as_a_sweep_is_named_as_such():
    with pytest.raises(ConfigError) as info:
        bench_config_from_dict({"target": "zoo:target", "drafters": {"weak": "ngram"}})
    assert str(info.value).startswith("bench.target: unknown key;")
    assert str(info.value).endswith(
        "; this looks like a pipeline file: pass it to `treegraft "
        "generate --pipeline` or list it under a sweep's `pipelines:`"
    )
    with pytest.raises(ConfigError, match=r"bench.nam: unknown key; expected keys: pairs"):
        bench_config_from_dict({"nam": 1, "pairs": [PAIR]})  # no hint: the ';' still ends it


def test_a_bad_override_is_reported_with_the_entry_path():
    cfg = bench_config_from_dict(
        {
            "pairs": [PAIR],
            "baselines": [],
            "pipelines": [
                {
                    "pipeline": "treegraft-threshold",
                    "label": "x",
                    "override": {"scheduler": {"name": "sometimes"}},
                }
            ],
        }
    )
    with pytest.raises(
        ConfigError, match=r"bench.pipelines\[0\]: pipeline.scheduler.name: unknown scheduler"
    ):
        pipeline_plans(cfg, cfg.pairs[0])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("target: zoo:target\ndecoding: 3\n", "pipeline.decoding: expected a mapping, got 3"),
        ("target: zoo:target\ndrafters: 3\n", "pipeline.builder: missing required key"),
        ("target: zoo:target\ndrafters: 3\nbuilder: {name: layered}\n", "pipeline.drafters"),
    ],
)
def test_a_pipeline_file_of_the_wrong_shape_is_named(tmp_path, body, message):
    """`decoding: 3` or `drafters: 3` in a sweep's pipeline file was an internal TypeError."""
    (tmp_path / "p.yaml").write_text(body)
    cfg = bench_config_from_dict({"pairs": [PAIR], "baselines": [], "pipelines": ["p.yaml"]},
                                 base_dir=tmp_path)  # fmt: skip
    with pytest.raises(ConfigError) as info:
        pipeline_plans(cfg, cfg.pairs[0])
    assert str(info.value).startswith(f"bench.pipelines[0]: {message}")


@pytest.mark.parametrize(("name", "max_new"), [("paper.yaml", 128), ("paper-cpu.yaml", 64)])
def test_the_shipped_paper_configs_are_valid(name: str, max_new: int):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / name
    cfg = load_bench_config(path)
    assert [p.drafter for p in cfg.pairs] == ["zoo:draft-s", "zoo:draft-m", "zoo:draft-l"]
    assert cfg.settings.suites == list(SUITES)
    assert cfg.settings.baselines == list(BASELINES)
    assert cfg.settings.max_new_tokens == max_new
    for pair in cfg.pairs:
        labels = [p.label for p in pipeline_plans(cfg, pair)]
        assert len(labels) >= len(BASELINES) - 2 and "treegraft-distilled-adaptive" in labels


def test_the_tutorial_config_is_valid():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "schedulers.yaml"
    cfg = load_bench_config(path)
    plans = pipeline_plans(cfg, cfg.pairs[0])
    assert [p.label for p in plans] == ["ngram-only", "lm-only", "threshold", "every2"]
    assert plans[-1].raw["scheduler"] == {"name": "every_k", "k": 2}
    assert plans[-1].raw["builder"]["max_strong_calls"] == 3


def test_the_standing_config_is_the_full_protocol_with_the_standing_methods():
    from pathlib import Path

    from treegraft.bench.config import BASELINES, ENDPOINTS, HF_ASSISTED

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    cfg = load_bench_config(benchmarks / "standing.yaml")
    full = load_bench_config(benchmarks / "paper.yaml")
    assert cfg.pairs == full.pairs
    for key in ("suites", "prompts_per_suite", "max_new_tokens", "dtype"):
        assert getattr(cfg.settings, key) == getattr(full.settings, key), key
    assert set(cfg.settings.baselines) == {HF_ASSISTED, *(e for e in ENDPOINTS if e in BASELINES)}
    plans = {p.label: p for p in pipeline_plans(cfg, cfg.pairs[0])}
    assert {e for e in ENDPOINTS if e not in BASELINES} <= set(plans)  # eagle-only: a pipeline
    assert "treegraft" in plans
    learned = plans["treegraft-distilled-adaptive"].raw
    assert learned["scheduler"]["name"] == "distilled" and learned["builder"]["adaptive"] is True
    shipped = yaml.safe_load(resolve_pipeline("treegraft").read_text())
    assert {**learned["scheduler"], "artifact": "zoo:scheduler"} == shipped["scheduler"]
    assert plans["ngram-only-adaptive"].raw["builder"]["adaptive"] is True


@pytest.mark.parametrize(("tokens", "depth"), [(None, 20), (7, 7)])
def test_chain_hf_is_the_chain_pipeline_under_hf_assisted_generations_schedule(tokens, depth):
    """The like-for-like row of `hf-assisted`: the same drafter as a chain of up to HF's draft
    length (`hf_assistant_tokens`, HF's default 20), ending at its first token below 0.4."""
    cfg = bench_config_from_dict(
        {"pairs": [PAIR], "baselines": ["hf-assisted", "chain-hf"], "hf_assistant_tokens": tokens}
    )
    (plan,) = pipeline_plans(cfg, cfg.pairs[0])
    assert plan.label == "chain-hf"
    assert plan.raw["builder"] == {
        "name": "layered",
        "depth": depth,
        "top_k": 1,
        "budget": depth,
        "stop_below": 0.4,
    }
    assert plan.raw["drafters"]["strong"]["model"] == PAIR["drafter"]


def sweep_files() -> list:
    """The sweep files under benchmarks/ (every YAML file with `pairs:`)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    return [p for p in sorted(folder.glob("*.yaml")) if "pairs" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", sweep_files(), ids=lambda p: p.name)
def test_every_shipped_sweep_file_is_valid_for_each_of_its_pairs(path):
    """A sweep file's pipelines, overrides and substitutions validate for every pair without a
    model loaded: a typo in an override key fails here, not minutes into a run."""
    cfg = load_bench_config(path)
    for pair in cfg.pairs:
        labels = [p.label for p in pipeline_plans(cfg, pair)]
        assert len(labels) == len(set(labels)), labels


def zoo_tokenizer(ref: str) -> str:
    """Which of the zoo's two tokenizers a zoo model reference uses."""
    return "smollm2" if ref.startswith("zoo:smollm2") else "zoo"


@pytest.mark.parametrize("path", sweep_files(), ids=lambda p: p.name)
def test_every_lm_drafter_of_a_shipped_sweep_shares_its_pairs_target_tokenizer(path):
    """No LM drafter a pipeline chose for its own target is left beside a pair's target of
    another tokenizer (the default's `zoo:draft-s` beside SmolLM2 stops the sweep when it loads
    that pipeline): such entries give the pair's drafter to every LM drafter."""
    cfg = load_bench_config(path)
    for pair in cfg.pairs:
        for plan in pipeline_plans(cfg, pair):
            drafters = plan.raw["drafters"]
            specs = drafters.values() if isinstance(drafters, dict) else drafters
            for spec in specs:
                if "model" in spec:
                    assert zoo_tokenizer(spec["model"]) == zoo_tokenizer(pair.target), (
                        f"{path.name}: {plan.label} keeps {spec['model']} beside {pair.target}"
                    )


def test_the_silent_chain_sweep_runs_the_default_with_and_without_chains():
    """The default drafts silent steps' chains with its cheap LM drafter (draft-s, the middle
    one) while the pair's drafter goes into the strongest; the sweep also runs it without
    chains and with the strongest drafter's chains."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "silent-chain.yaml"
    cfg = load_bench_config(path)
    pair = next(p for p in cfg.pairs if p.drafter == "zoo:draft-l")
    plans = {p.label: p.raw for p in pipeline_plans(cfg, pair)}
    assert {"chain-hf", "treegraft", "treegraft-no-chain", "treegraft-strong-chain"} == set(plans)
    default = plans["treegraft"]
    assert default["builder"]["silent_chain"] == 20 and default["builder"]["silent_drafter"] == 1
    assert [d["model"] for d in list(default["drafters"].values())[1:]] == [
        "zoo:draft-s",
        "zoo:draft-l",
    ]
    assert plans["treegraft-no-chain"]["builder"]["silent_chain"] == 0
    assert plans["treegraft-strong-chain"]["builder"]["silent_drafter"] == -1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"device": "gpu"},
            "bench.device: expected str 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got 'gpu'",
        ),
        ({"device": "cuda:x"}, "bench.device: expected str 'auto', 'cpu', 'cuda', 'cuda:N'"),
        (
            {"hf_assistant_tokens": -3},
            "bench.hf_assistant_tokens: expected int >= 1, or null, got -3",
        ),
        ({"hf_max_ngram": 0}, "bench.hf_max_ngram: expected int >= 1, or null, got 0"),
        ({"hf_max_ngram": "2"}, "bench.hf_max_ngram: expected int >= 1, or null, got '2'"),
    ],
)
def test_settings_passed_to_the_models_are_checked_when_read(data, message):
    """They were not: the sweep started, and every unit failed after its models loaded."""
    with pytest.raises(ConfigError) as exc:
        bench_config_from_dict({"pairs": [PAIR], **data})
    assert message in str(exc.value)


def test_null_hf_settings_and_every_device_name_are_accepted():
    for device in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        cfg = bench_config_from_dict({"pairs": [PAIR], "device": device, "hf_max_ngram": None})
        assert cfg.settings.device == device and cfg.settings.hf_max_ngram is None
    cfg = bench_config_from_dict({"pairs": [PAIR], "hf_assistant_tokens": 5, "hf_max_ngram": 3})
    assert (cfg.settings.hf_assistant_tokens, cfg.settings.hf_max_ngram) == (5, 3)


def test_a_sweep_file_that_is_not_utf8_is_named(tmp_path):
    """It was an internal error (UnicodeDecodeError)."""
    path = tmp_path / "sweep.yaml"
    path.write_bytes("pairs: [{target: zoo:target, drafter: caf\xe9}]\n".encode("latin-1"))
    with pytest.raises(ConfigError) as exc:
        load_bench_config(path)
    assert str(exc.value) == (
        f"benchmark config: {path} is not UTF-8 text: byte 0xe9 at offset 41 (line 1); "
        "save it as UTF-8"
    )


def test_load_bench_config_names_a_folder_and_a_path_of_another_type(tmp_path) -> None:
    """Once a raw TypeError from pathlib, and a folder reported as not found."""
    with pytest.raises(ArgumentError, match=r"^load_bench_config: path: expected a file path"):
        load_bench_config(None)
    with pytest.raises(ConfigError, match="benchmark config file is a directory; expected a YAML"):
        load_bench_config(tmp_path)


@pytest.mark.parametrize(
    "entry",
    [
        "sampling",
        {
            "pipeline": "treegraft",
            "override": {"verifier": {"name": "pointmass", "temperature": 0.8}},
        },
    ],
)
def test_a_sampling_pipeline_is_refused_by_the_greedy_protocol(entry):
    """A sampling pipeline validated, then every output was counted inexact against plain
    greedy decoding (a sample matches it only by chance): now refused, saying how to fix it."""
    cfg = bench_config_from_dict({"pairs": [PAIR], "baselines": [], "pipelines": [entry]})
    with pytest.raises(ConfigError) as info:
        pipeline_plans(cfg, cfg.pairs[0])
    assert str(info.value).startswith(
        "bench.pipelines[0]: pipeline.verifier: 'pointmass' samples, but the benchmark decodes "
        "greedily"
    )
    fixed = {"pipeline": "sampling", "override": {"verifier": {"name": "greedy"}}}
    cfg = bench_config_from_dict({"pairs": [PAIR], "baselines": [], "pipelines": [fixed]})
    assert pipeline_plans(cfg, cfg.pairs[0])[0].raw["verifier"] == {"name": "greedy"}
