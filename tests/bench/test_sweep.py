"""End to end: `treegraft bench CONFIG --quick`, exactness reports, replay and `compare`."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import attrs
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from tests.bench.conftest import char_tokenizer, pair_resources, tiny_pair_models, write_suites
from tests.conftest import greedy_reference, memory_resources
from treegraft.bench import bench_config_from_dict, run_bench
from treegraft.bench.cli import app as bench_app
from treegraft.bench.measure import first_difference, logit_margin
from treegraft.bench.readback import read_requests
from treegraft.bench.report import CSV_COLUMNS
from treegraft.core.config import ConfigError
from treegraft.core.hookspecs import hookimpl
from treegraft.core.interfaces import Verdict
from treegraft.core.registry import Registry
from treegraft.plugins.verifiers.greedy import GreedyVerifier

MAX_NEW = 12


def cli() -> typer.Typer:
    """The bench sub-app mounted the way the main command line mounts it."""
    root = typer.Typer()

    @root.command()
    def version() -> None:
        """A sibling command, so that `bench` is a sub-group."""

    root.add_typer(bench_app, name="bench", help="Benchmark pipelines against plain decoding.")
    return root


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """A `--quick` run from the command line on tiny models saved to disk."""
    tmp = tmp_path_factory.mktemp("quick")
    for name, model in zip(("target", "draft"), tiny_pair_models(), strict=True):
        model.save_pretrained(tmp / name)
        char_tokenizer().save_pretrained(tmp / name)
    config = {
        "pairs": [{"target": str(tmp / "target"), "drafter": str(tmp / "draft")}],
        "suites": [Path(p).name for p in write_suites(tmp)],
        "prompts_per_suite": 5,
        "max_new_tokens": MAX_NEW,
        "dtype": "float64",
        "device": "cpu",
        "baselines": ["hf-assisted", "hf-prompt-lookup", "chain", "ngram-only"],
        "pipelines": [
            {
                "pipeline": "treegraft-threshold",
                "label": "treegraft-every2",
                "override": {"scheduler": {"name": "every_k", "k": 2}},
            }
        ],
        "warmup_tokens": 2,
    }
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(config))
    out = tmp / "results"
    result = CliRunner().invoke(
        cli(), ["bench", str(tmp / "sweep.yaml"), "--quick", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    (tmp / "terminal.txt").write_text(result.output)
    return out


METHODS = [
    "ar",
    "ar-runner",
    "hf-assisted",
    "hf-prompt-lookup",
    "chain",
    "ngram-only",
    "treegraft-every2",
]


def test_quick_run_writes_every_output(quick_run: Path):
    names = {p.name for p in quick_run.iterdir()}
    assert {"requests.jsonl", "summary.csv", "summary.md", "summary.json", "manifest.json"} <= names
    assert {"speedup.png", "tau.png", "time_split.png"} <= names
    for png in ("speedup.png", "tau.png", "time_split.png"):
        assert (quick_run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_terminal_gets_a_short_summary(quick_run: Path):
    text = (quick_run.parent / "terminal.txt").read_text()
    assert "top 8 methods, all pairs and suites, 4 prompts per method" in text
    summary = text[text.index("top 8 methods") :]
    assert "speedup [95% CI]" in summary and "…" not in summary  # no column cut short
    assert re.search(r"treegraft-every2 +[\d.]+ \[[\d.]+, [\d.]+\]", text)
    with (quick_run / "summary.csv").open() as fh:
        (baseline,) = {r["baseline"] for r in csv.DictReader(fh) if r["pair"] == "all"}
    assert not re.search(rf"^ {baseline} ", text, re.M)  # the baseline (the faster) is not ranked
    other = next(m for m in ("ar", "ar-runner") if m != baseline)
    assert re.search(rf"^ {other} +[\d.]+ \[", text, re.M)  # the other plain decoding is
    assert "warning: Only 4 prompt(s)" in text
    assert "full report:" in text and "summary.md" in text
    assert "## Per pair" not in text and len(text.splitlines()) < 30


def test_quick_run_requests(quick_run: Path):
    lines = [json.loads(x) for x in (quick_run / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 2 * len(METHODS)  # --quick: 2 prompts per suite, 2 suites
    assert [x["method"] for x in lines[: len(METHODS)]] == METHODS
    for x in lines:
        assert x["new_tokens"] == MAX_NEW and x["exact"] and x["mismatch"] is None
        assert x["wall_s"] > 0 and x["tokens_per_s"] > 0 and x["peak_mem_mib"] > 0
        assert set(x["split"]) == {"target", "strong", "weak", "framework"}
        assert sum(x["split"].values()) == pytest.approx(x["wall_s"], rel=1e-6)
    ar = lines[0]
    assert ar["steps"] == MAX_NEW and ar["tau"] == 1.0 and ar["speedup"] == 1.0
    runner = lines[1]  # plain decoding through the runner: one token per forward, same output
    assert runner["steps"] == MAX_NEW and runner["tau"] == 1.0
    assert runner["output_ids"] == ar["output_ids"] and runner["split"]["target"] > 0
    tree = next(x for x in lines if x["method"] == "treegraft-every2")
    assert len(tree["accept_lengths"]) == tree["steps"] == len(tree["step_times"])
    assert sum(tree["accept_lengths"]) == tree["committed"]
    assert {"build", "target", "verify"} <= set(tree["step_times"][0])
    assert tree["split"]["strong"] > 0 and tree["split"]["weak"] > 0


def test_quick_run_summary(quick_run: Path):
    with (quick_run / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == CSV_COLUMNS
    suites = {r["suite"] for r in rows}
    assert suites == {"code", "chat", "all"}
    overall = {r["method"]: r for r in rows if r["pair"] == "all" and r["suite"] == "all"}
    assert list(overall) == METHODS
    baseline = overall["ar"]["baseline"]
    assert baseline in ("ar", "ar-runner") and {r["baseline"] for r in rows} == {baseline}
    assert float(overall[baseline]["speedup"]) == 1.0
    assert all(float(r["exact_rate"]) == 1.0 for r in rows)
    md = (quick_run / "summary.md").read_text()
    for heading in (
        "## Overall",
        "## Per pair",
        "## Acceptance per depth",
        "## Time split",
        "## Exactness",
    ):
        assert heading in md
    assert "All 24 outputs equal plain decoding token for token." in md
    assert f"- target+draft: **`{baseline}`** (median tokens/s: `ar` " in md
    assert "speedup [95% CI]" in md and "ratio of medians [95% CI]" in md
    assert "**Warning:** Only 4 prompt(s) per method" in md  # --quick: 2 per suite, 2 suites
    assert float(overall[baseline]["speedup_lo"]) == float(overall[baseline]["speedup_hi"]) == 1.0
    summary = json.loads((quick_run / "summary.json").read_text())
    assert summary["primary"] == "speedup" and summary["warnings"]
    tree = next(r for r in summary["rows"] if r["method"] == "treegraft-every2")
    lo, hi = tree["intervals"]["speedup"]
    assert lo <= tree["speedup"] <= hi and tree["prompts"] >= 2
    manifest = json.loads((quick_run / "manifest.json").read_text())
    env = manifest["environment"]
    assert {"python", "torch", "transformers", "treegraft", "cpu", "git"} <= set(env)
    assert manifest["options"]["quick"] is True
    assert manifest["config"]["max_new_tokens"] == MAX_NEW


# ---------------------------------------------------------------------------- exactness


@attrs.define
class OffByOneVerifier(GreedyVerifier):
    """Greedy, except that the second step's bonus token is replaced by the next token id."""

    calls: int = 0

    def begin(self, seed: int) -> None:
        self.calls = 0

    def verify(self, tree, target_logits) -> Verdict:
        verdict = super().verify(tree, target_logits)
        self.calls += 1
        if self.calls != 2:
            return verdict
        wrong = (verdict.bonus + 1) % target_logits.shape[-1]
        return Verdict(path=verdict.path, length=verdict.length, bonus=wrong)


class BrokenPlugin:
    @hookimpl
    def treegraft_register_verifiers(self, register) -> None:
        register("off_by_one", OffByOneVerifier)


def test_an_inexact_pipeline_is_reported_at_its_first_wrong_token(tmp_path):
    config = bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 1,
            "max_new_tokens": MAX_NEW,
            "baselines": ["ngram-only"],
            "pipelines": [
                {
                    "pipeline": "ngram-only",
                    "label": "broken",
                    "override": {"verifier": {"name": "off_by_one"}},
                }
            ],
            "warmup_tokens": 0,
        }
    )
    res = pair_resources()
    registry = Registry.create(autoload=False, plugins=[BrokenPlugin()])
    result = run_bench(config, tmp_path / "out", resources=res, registry=registry, progress=False)
    target = res.models["mem:target"]
    broken = [r for r in result.requests if r.method == "broken"]
    assert len(broken) == 2
    for r in broken:
        prompt = torch.tensor(
            char_tokenizer()(_prompt_text(r), add_special_tokens=False)["input_ids"]
        )
        reference = greedy_reference(target, prompt, MAX_NEW)
        pos = first_difference(reference, r.output_ids)
        assert not r.exact and r.mismatch.position == pos
        assert pos == r.accept_lengths[0] + r.accept_lengths[1] - 1  # the 2nd step's bonus
        assert (r.mismatch.expected, r.mismatch.got) == (reference[pos], r.output_ids[pos])
        margin = logit_margin(target, torch.cat([prompt, torch.tensor(reference[:pos])]))
        assert r.mismatch.margin == pytest.approx(margin)
    assert all(r.exact for r in result.requests if r.method != "broken")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "2 of 6 outputs differ from plain decoding" in md  # ar-runner: exact
    rows = {(r.method, r.pair, r.suite): r for r in result.rows}
    assert rows[("broken", "all", "all")].exact_rate == 0.0
    assert rows[("ngram-only", "all", "all")].exact_rate == 1.0


def _prompt_text(request) -> str:
    from tests.bench.conftest import PROMPTS

    return PROMPTS[request.suite][int(request.prompt_id.rsplit("-", 1)[1])]


# ---------------------------------------------------------------------------- replay


def test_replay_curves_time_each_lm_drafter_as_its_pipeline_runs_it(tmp_path, monkeypatch):
    """The sweep's latency curves (`latency.json`) time a drafter with `head: K` over its K
    token ids and with its runner's forward, the target over the whole vocabulary."""
    import numpy as np

    import treegraft.bench.sweep as sweep
    from tests.bench.conftest import VOCAB
    from treegraft.zoo.token_counts import save_counts

    save_counts(tmp_path / "counts.json", np.arange(VOCAB)[::-1].copy(), source="test")
    head = {
        "drafters.strong.head": 6,
        "drafters.strong.token_counts": str(tmp_path / "counts.json"),
    }
    config = bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 1,
            "max_new_tokens": 6,
            "baselines": [],
            "pipelines": [{"pipeline": "treegraft-threshold", "label": "headed", "override": head}],
            "replay": True,
            "latency_repeats": 1,
            "warmup_tokens": 0,
        }
    )
    seen = {}
    real = sweep.measure_latency

    def spy(runner, ref, **kw):
        rows = kw.get("rows")
        seen[ref] = (runner.forward, None if rows is None else sorted(rows.tolist()))
        return real(runner, ref, **kw)

    monkeypatch.setattr(sweep, "measure_latency", spy)
    result = run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    assert all(r.exact for r in result.requests if r.method == "headed")
    assert seen == {"mem:target": ("auto", None), "mem:draft": ("fused", [0, 1, 2, 3, 4, 5])}
    stored = json.loads((tmp_path / "out" / "latency.json").read_text())
    assert [set(curves) for curves in stored.values()] == [{"mem:target", "mem:draft"}]


def test_a_state_target_is_replayed_from_its_chains(tmp_path):
    """A hybrid target (Qwen3-Next: linear attention beside full attention): the sweep timed
    its latency curve through an attention runner, which refused the model, so every unit
    failed with `replay` on; it is timed through its `StateRunner`, and replay predicts what
    was measured."""
    from treegraft.conformance.tiny import tiny_model

    res = memory_resources(target=tiny_model("qwen3_next"), draft=tiny_model("llama", seed=1))
    res.tokenizer = char_tokenizer()
    config = bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 1,
            "max_new_tokens": 8,
            "baselines": ["chain", "ngram-only"],
            "replay": True,
            "latency_repeats": 1,
            "warmup_tokens": 0,
        }
    )
    result = run_bench(config, tmp_path / "out", resources=res, progress=False)
    assert all(r.error is None and r.exact for r in result.requests), result.requests
    measured = {(r.method, r.key): r for r in result.requests if r.mode == "measured"}
    replayed = [r for r in result.requests if r.mode == "replay"]
    assert {r.method for r in replayed} == {"chain", "ngram-only"}
    for r in replayed:
        assert r.output_ids == measured[(r.method, r.key)].output_ids


def test_replay_tau_equals_measured_tau(tmp_path):
    pipelines = [
        {
            "pipeline": "treegraft-threshold",
            "label": "treegraft-fixed",
            "override": {"scheduler": {"name": "every_k", "k": 2}, "builder.max_strong_calls": 2},
        }
    ]
    config = bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 2,
            "max_new_tokens": 20,
            "baselines": ["chain", "ngram-only", "lm-only"],
            "pipelines": pipelines,
            "replay": True,
            "latency_repeats": 1,
            "warmup_tokens": 0,
        }
    )
    result = run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    measured = {(r.method, r.key): r for r in result.requests if r.mode == "measured"}
    replayed = [r for r in result.requests if r.mode == "replay"]
    assert {r.method for r in replayed} == {"chain", "ngram-only", "lm-only", "treegraft-fixed"}
    assert len(replayed) == 4 * 4
    for r in replayed:
        m = measured[(r.method, r.key)]
        assert r.error is None and r.exact
        assert r.accept_lengths == m.accept_lengths and r.committed == m.committed
        assert r.tau == m.tau and r.output_ids == m.output_ids
        assert r.split["target"] == pytest.approx(sum(t["target"] for t in r.step_times))
    rows = {(r.method, r.mode): r for r in result.rows if r.pair == "all" and r.suite == "all"}
    for method in ("chain", "ngram-only", "lm-only", "treegraft-fixed"):
        assert rows[(method, "replay")].tau == rows[(method, "measured")].tau
    out = tmp_path / "out"
    assert (out / "replay.png").is_file()
    assert set(json.loads((out / "latency.json").read_text())["target+draft"]) == {
        "mem:target",
        "mem:draft",
    }
    assert "## Replay-predicted vs measured" in (out / "summary.md").read_text()


# ---------------------------------------------------------------------------- compare


def test_compare_two_result_directories(quick_run: Path, tmp_path):
    md = tmp_path / "cmp.md"
    result = CliRunner().invoke(
        cli(), ["bench", "compare", str(quick_run), str(quick_run), "--markdown", str(md)]
    )
    assert result.exit_code == 0, result.output
    assert "treegraft-every2" in result.output and "0.00" in result.output
    text = md.read_text()
    assert "| target+draft | treegraft-every2 | measured |" in text
    assert "| pair | method | mode | speedup A | speedup B | Δ speedup | beyond intervals |" in text
    assert "| target+draft | ar-runner | measured |" in text
    baseline = (
        "ar" if "| target+draft | ar | measured | 1.00 [1.00, 1.00] |" in text else "ar-runner"
    )
    assert (
        f"| target+draft | {baseline} | measured | 1.00 [1.00, 1.00] | 1.00 [1.00, 1.00] | +0.00 | no |"
        in text
    )
    assert f"speedups over the faster plain decoding: A `{baseline}`, B `{baseline}`" in text
    assert f"A `{baseline}`, B `{baseline}`" in result.output
    assert "differ?" in result.output
    assert "0 of 7 rows differ beyond their 95% speedup intervals" in result.output


def test_cli_errors_are_short(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pairs: [{target: zoo:target}]\n")
    result = CliRunner().invoke(cli(), ["bench", str(bad)])
    assert result.exit_code == 2
    assert "bench.pairs[0].drafter: missing required key" in result.output
    result = CliRunner().invoke(cli(), ["bench", "compare", str(tmp_path), str(tmp_path)])
    assert result.exit_code == 2 and "no summary.csv" in result.output


def test_a_model_not_made_yet_stops_the_sweep_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "cache"))  # zoo:smollm2-draft untrained
    config = bench_config_from_dict(
        {
            "pairs": [
                {"target": "mem:target", "drafter": "mem:draft"},
                {"target": "mem:target", "drafter": "zoo:smollm2-draft"},
            ],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 1,
            "max_new_tokens": MAX_NEW,
            "pipelines": [{"pipeline": "treegraft-threshold", "label": "tg"}],
            "warmup_tokens": 0,
        }
    )
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as info:
        run_bench(config, out, resources=pair_resources(), progress=False)
    text = str(info.value)
    assert text.startswith("pairs[1] (target+smollm2-draft), drafter: zoo:smollm2-draft is not")
    assert str(tmp_path / "cache" / "deltas" / "smollm2-draft" / "delta.safetensors") in text
    assert "treegraft zoo distil-exit --fresh" in text and "--pairs target+draft" in text
    assert not out.exists()  # refused before any unit ran: nothing is left behind
    kept = attrs.evolve(config, pairs=config.pairs[:1])  # the other pair runs
    result = run_bench(kept, tmp_path / "kept", resources=pair_resources(), progress=False)
    assert result.requests and all(r.exact for r in result.requests)


def test_the_model_check_reads_every_reference_inside_the_pipelines(tmp_path, monkeypatch):
    from treegraft.bench.methods import PipelinePlan
    from treegraft.bench.run import check_models

    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "cache"))
    config = resumable_config(tmp_path)
    name = config.pairs[0].name
    drafters = {
        "weak": {"name": "ngram"},
        "extra": [{"name": "hf_lm", "model": "zoo:smollm2-draft"}],
    }
    plan = PipelinePlan("x", {"drafters": drafters, "target": "mem:target"}, "bench.pipelines[3]")
    check_models(config, {name: [plan]}, set())  # a pair with nothing left to run is not checked
    with pytest.raises(
        ConfigError, match=r"^pairs\[0\] \(target\+draft\), bench\.pipelines\[3\]: zoo:sm"
    ):
        check_models(config, {name: [plan]}, {name})
    plan = PipelinePlan("x", {"drafters": {"strong": {"model": "zoo:smollm2-draft-l"}}}, "p")
    check_models(config, {name: [plan]}, {name})  # built from shipped files: nothing to make


# ---------------------------------------------------------------------------- resume


def resumable_config(tmp_path, **settings):
    return bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(tmp_path),
            "prompts_per_suite": 2,
            "max_new_tokens": MAX_NEW,
            "baselines": ["ngram-only"],
            "pipelines": [{"pipeline": "treegraft-threshold", "label": "tg"}],
            "replay": True,
            "latency_repeats": 1,
            "warmup_tokens": 0,
            **settings,
        }
    )


def test_resume_keeps_finished_prompts_and_reruns_the_one_cut_short(tmp_path):
    config = resumable_config(tmp_path)
    out = tmp_path / "out"
    full = run_bench(config, out, resources=pair_resources(), progress=False)
    per_prompt = 2 + 2 + 2  # ar, ar-runner, two pipelines measured and replayed
    assert len(full.requests) == 4 * per_prompt
    lines = (out / "units.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 4  # one unit per prompt
    (out / "units.jsonl").write_bytes(lines[0] + lines[1][:100])  # killed while writing prompt 2
    (out / "summary.csv").unlink()
    curves = (out / "latency.json").read_text()

    with pytest.warns(UserWarning, match="1 damaged line"):
        result = run_bench(config, out, resources=pair_resources(), progress=False, resume=True)
    keys = [(r.key, r.method, r.mode) for r in result.requests]
    assert len(keys) == len(set(keys)) == 4 * per_prompt
    assert set(keys) == {(r.key, r.method, r.mode) for r in full.requests}
    first = full.requests[:per_prompt]
    assert list(result.requests[:per_prompt]) == list(first)  # kept as recorded, not rerun
    rerun = [r for r in result.requests if r.key == full.requests[per_prompt].key]
    assert all(
        r.wall_s != f.wall_s for r, f in zip(rerun, full.requests[per_prompt:], strict=False)
    )
    assert (out / "latency.json").read_text() == curves  # the replays kept the first curves
    assert len(read_requests(out / "requests.jsonl")) == 4 * per_prompt
    assert (out / "summary.csv").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["segments"]) == 2
    assert all("finished" in s for s in manifest["segments"])
    assert manifest["seconds"] == pytest.approx(sum(s["seconds"] for s in manifest["segments"]))
    assert all(r.exact for r in result.requests)


def test_resuming_a_finished_sweep_loads_no_model(tmp_path):
    config = resumable_config(tmp_path, replay=False)
    out = tmp_path / "out"
    full = run_bench(config, out, resources=pair_resources(), progress=False)
    empty = memory_resources()  # no models: loading any would fail
    result = run_bench(config, out, resources=empty, progress=False, resume=True)
    assert result.requests == full.requests and result.rows == full.rows


def test_resume_refuses_another_sweep_or_no_sweep(tmp_path):
    out = tmp_path / "out"
    run_bench(resumable_config(tmp_path), out, resources=pair_resources(), progress=False)
    other = resumable_config(tmp_path, max_new_tokens=MAX_NEW + 1, prompts_per_suite=1)
    with pytest.raises(
        ConfigError, match=r"its sweep differs from this one in max_new_tokens, prompts_per_suite$"
    ):
        run_bench(other, out, resources=pair_resources(), progress=False, resume=True)
    with pytest.raises(ConfigError, match=r"no manifest\.json there"):
        run_bench(
            other, tmp_path / "empty", resources=pair_resources(), progress=False, resume=True
        )
    result = CliRunner().invoke(cli(), ["bench", "benchmarks/paper.yaml", "--resume"])
    assert result.exit_code == 2 and "--resume: give the results directory" in result.output


def test_resume_refuses_prompts_changed_since_the_results_were_measured(tmp_path):
    """Same sweep file, same ids, but a prompt's text was edited: the stored results of that id
    were measured on the old text and would be mixed with new ones."""
    config = resumable_config(tmp_path, replay=False, prompts_per_suite=1)
    out = tmp_path / "out"
    run_bench(config, out, resources=pair_resources(), progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["prompts"]) == 2 and all(len(d) == 16 for d in manifest["prompts"].values())
    suite = Path(config.settings.suites[0])
    first = json.loads(suite.read_text().splitlines()[0])
    rows = suite.read_text().splitlines()
    rows[0] = json.dumps({**first, "prompt": first["prompt"] + " edited"})
    suite.write_text("\n".join(rows) + "\n")
    with pytest.raises(
        ConfigError, match=rf"the suites' prompts changed since .* \({suite.stem}/{first['id']}\)"
    ):
        run_bench(config, out, resources=pair_resources(), progress=False, resume=True)
    suite.write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")  # restored
    run_bench(config, out, resources=pair_resources(), progress=False, resume=True)


def test_flags_shrink_the_sweep(quick_run: Path, tmp_path):
    out = tmp_path / "small"
    args = ["--suites", "code.jsonl", "--prompts", "1", "--max-new-tokens", "4"]
    sweep = str(quick_run.parent / "sweep.yaml")
    result = CliRunner().invoke(
        cli(), ["bench", sweep, *args, "--pairs", "target+draft", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == len(METHODS)
    assert {x["suite"] for x in lines} == {"code"} and {x["new_tokens"] for x in lines} == {4}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["prompts"] == 1 and manifest["config"]["max_new_tokens"] == 4
