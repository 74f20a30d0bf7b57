"""Gains over the endpoints, `treegraft scheduler evaluate --json` and `scheduler loo`."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import tiny_llama, word_tokenizer
from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import COST, VOCAB, pipeline_raw
from treegraft import console as consoles
from treegraft.core.pipeline import load_pipeline
from treegraft.plugins.schedulers.basic import AlwaysScheduler
from treegraft.scheduling.artifact import SchedulerArtifact
from treegraft.scheduling.cli import app
from treegraft.scheduling.value_eval import Evaluation, gains, summary_rows
from treegraft.scheduling.value_system import Dataset, PromptIds, collect

runner = CliRunner()
FAST_FIT = ["--epochs", "20", "--hidden", "8"]


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps at the terminal width (80 when none): one line per message and table row."""
    for c in (consoles.out, consoles.console):
        monkeypatch.setattr(c, "_width", 1000)


# ---------------------------------------------------------------------------- the arithmetic


def test_gains_against_the_better_endpoint_and_the_oracle():
    g = gains({"never": 50.0, "always": 40.0, "distilled": 55.0, "oracle": 70.0})
    assert g.best_endpoint == "never"
    assert g.vs_best_endpoint == pytest.approx(
        {"never": 1.0, "always": 0.8, "distilled": 1.1, "oracle": 1.4}
    )
    # oracle gain 70 - 50 = 20: distilled 5 / 20, always -10 / 20
    assert g.oracle_share == pytest.approx(
        {"never": 0.0, "always": -0.5, "distilled": 0.25, "oracle": 1.0}
    )
    g = gains({"never": 30.0, "always": 60.0, "budgeted": 75.0, "oracle": 90.0})
    assert g.best_endpoint == "always"
    assert g.vs_best_endpoint["budgeted"] == pytest.approx(1.25)
    assert g.oracle_share["budgeted"] == pytest.approx(0.5)
    assert g.oracle_share["never"] == pytest.approx(-1.0)


def test_gains_without_an_oracle_gain_or_endpoints_are_not_available():
    g = gains({"never": 50.0, "always": 40.0, "distilled": 45.0})
    assert g.vs_best_endpoint["distilled"] == pytest.approx(0.9)
    assert set(g.oracle_share.values()) == {None}
    g = gains({"never": 50.0, "always": 40.0, "oracle": 50.0})  # oracle gain 0
    assert set(g.oracle_share.values()) == {None}
    g = gains({"always": 40.0, "oracle": 50.0})  # one endpoint is enough
    assert g.best_endpoint == "always" and g.oracle_share["oracle"] == 1.0
    g = gains({"distilled": 45.0, "oracle": 50.0})
    assert g.best_endpoint is None
    assert set(g.vs_best_endpoint.values()) == set(g.oracle_share.values()) == {None}


def test_summary_rows():
    results = [
        Evaluation("never", tokens=100, steps=50, seconds=2.0, strong_calls=0),  # 50 tok/s
        Evaluation("always", tokens=120, steps=40, seconds=3.0, strong_calls=120),  # 40
        Evaluation("distilled", tokens=110, steps=45, seconds=2.0, strong_calls=9),  # 55
        Evaluation("oracle", tokens=140, steps=35, seconds=2.0, strong_calls=14),  # 70
    ]
    rows = summary_rows(results)
    assert [r["scheduler"] for r in rows] == ["never", "always", "distilled", "oracle"]
    d = rows[2]
    assert d["tokens_per_s"] == pytest.approx(55.0) and d["tau"] == pytest.approx(110 / 45)
    assert d["strong_calls_per_step"] == pytest.approx(0.2)
    assert d["vs_never"] == d["vs_best_endpoint"] == pytest.approx(1.1)
    assert d["oracle_share"] == pytest.approx(0.25) and d["best_endpoint"] == "never"
    json.dumps(rows)  # JSON-ready


# ---------------------------------------------------------------------------- tiny datasets


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two pairs saved on disk (the CLI loads `pipeline_raw`): a training and a disjoint
    evaluation dataset each. Pair `a`: a tiny LM drafter; pair `b`: the target as its own
    strong drafter (calls pay)."""
    root = tmp_path_factory.mktemp("loo")
    target = root / "target"
    tiny_llama(seed=3, vocab=VOCAB).save_pretrained(target)
    word_tokenizer(VOCAB).save_pretrained(target)
    draft = root / "draft"
    tiny_llama(seed=4, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1).save_pretrained(draft)
    out: dict[str, Any] = {"root": root, "target": str(target)}
    for name, strong in (("a", draft), ("b", target)):
        raw = {**pipeline_raw(depth=2, strong=str(strong)), "target": str(target)}
        pipe = load_pipeline(raw)
        for split, seeds in (("train", range(3)), ("eval", range(3, 5))):
            prompts = [PromptIds(f"p{i}", repetitive_prompt(40 + i, 12) % VOCAB) for i in seeds]
            data = collect(pipe, prompts, COST, max_new_tokens=8, extra_meta={"pipeline_raw": raw})
            out[f"{name}-{split}"] = data.save(root / f"{name}-{split}")
        if name == "a":  # DAgger-style extra rows of pair a, along `always`
            prompts = [PromptIds(f"p{i}", repetitive_prompt(40 + i, 12) % VOCAB) for i in (5, 6)]
            data = collect(
                pipe, prompts, COST, max_new_tokens=8, extra_meta={"pipeline_raw": raw},
                follow=AlwaysScheduler(None),
            )  # fmt: skip
            out["a-follow"] = data.save(root / "a-follow")
    return out


def test_loo_fits_without_each_pair_and_reports_its_gains(pairs, tmp_path):
    out_dir = tmp_path / "loo"
    result = runner.invoke(
        app,
        ["loo", str(pairs["a-train"]), str(pairs["b-train"]), "--eval", str(pairs["a-eval"]),
         "--eval", str(pairs["b-eval"]), "--out", str(out_dir), *FAST_FIT],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out_dir / "loo.json").read_text())
    assert [p["eval"] for p in report["pairs"]] == [str(pairs["a-eval"]), str(pairs["b-eval"])]
    strongs = [str(pairs["root"] / "draft"), pairs["target"]]
    for i, p in enumerate(report["pairs"]):
        assert p["pair"] == ("target + draft", "target + target")[i] and p["held_out"]
        assert (p["target"], p["strong_model"]) == (pairs["target"], strongs[i])
        # one target for both pairs: the table names each pair by its strong drafter
        assert f"\n {('draft', 'target')[i]} " in result.output
        # the leave-one-out artifact saw only the other pair; the in-pair one saw both
        fitted = SchedulerArtifact.load(p["artifact"]).metadata["pairs"]
        assert [f["strong_model"] for f in fitted] == [strongs[1 - i]]
        rows = p["rows"]
        assert list(rows) == ["never", "always", "distilled-loo", "distilled-all", "oracle"]
        speeds = {name: r["tokens_per_s"] for name, r in rows.items()}
        g = gains(speeds)
        for name, r in rows.items():
            assert r["vs_best_endpoint"] == pytest.approx(g.vs_best_endpoint[name])
            assert r["oracle_share"] == pytest.approx(g.oracle_share[name])
        oracle = Dataset.load(p["eval"]).meta["summary"]["oracle_tokens_per_s"]
        assert speeds["oracle"] == pytest.approx(oracle, rel=1e-9)
        assert speeds["oracle"] >= max(speeds["never"], speeds["always"]) - 1e-9
    all_pairs = SchedulerArtifact.load(report["all_artifact"]).metadata["pairs"]
    assert [f["strong_model"] for f in all_pairs] == strongs
    assert report["fit"]["epochs"] == 20 and report["fit"]["hidden"] == [8]
    assert set(report["mean"]) == {"distilled-loo", "distilled-all"}
    assert "loo sh." in result.output and "mean over pairs" in result.output


def test_loo_extra_datasets_join_their_pair_and_are_held_out_with_it(pairs, tmp_path):
    out_dir = tmp_path / "loo"
    result = runner.invoke(
        app,
        ["loo", str(pairs["a-train"]), str(pairs["b-train"]), "--eval", str(pairs["a-eval"]),
         "--eval", str(pairs["b-eval"]), "--extra", str(pairs["a-follow"]), "--out", str(out_dir),
         "--plot", str(out_dir / "loo.svg"), *FAST_FIT],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out_dir / "loo.svg").read_text().lstrip().startswith("<?xml")
    report = json.loads((out_dir / "loo.json").read_text())
    assert report["extra_datasets"] == 1
    draft, target = str(pairs["root"] / "draft"), pairs["target"]

    def fitted(path: str) -> list[tuple[str, str]]:
        meta = SchedulerArtifact.load(path).metadata["pairs"]
        return [(f["strong_model"], f["followed"]) for f in meta]

    a, b = report["pairs"]
    assert fitted(a["artifact"]) == [(target, "oracle")]  # pair a and its extra rows left out
    assert fitted(b["artifact"]) == [(draft, "oracle"), (draft, "scheduler")]
    assert fitted(report["all_artifact"]) == [
        (draft, "oracle"), (target, "oracle"), (draft, "scheduler")
    ]  # fmt: skip


def test_evaluate_writes_its_rows_with_gains_as_json(pairs, tmp_path):
    art = tmp_path / "art"
    result = runner.invoke(app, ["fit", str(pairs["b-train"]), "--out", str(art), *FAST_FIT])
    assert result.exit_code == 0, result.output
    path, figure = tmp_path / "rows.json", tmp_path / "gains.png"
    args = ["--artifact", str(art), "--json", str(path), "--plot", str(figure)]
    result = runner.invoke(app, ["evaluate", str(pairs["b-eval"]), *args])
    assert result.exit_code == 0, result.output
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(path.read_text())
    names = ["never", "always", "threshold", "budgeted", "distilled", "oracle"]
    assert [r["scheduler"] for r in rows] == names
    g = gains({r["scheduler"]: r["tokens_per_s"] for r in rows})
    assert rows[4]["oracle_share"] == pytest.approx(g.oracle_share["distilled"])
    assert {r["best_endpoint"] for r in rows} == {g.best_endpoint}
    assert "vs best endpoint" in result.output and "oracle share" in result.output


def test_evaluate_replays_the_distilled_row_with_a_call_guard(pairs, tmp_path):
    art = tmp_path / "art"
    result = runner.invoke(app, ["fit", str(pairs["b-train"]), "--out", str(art), *FAST_FIT])
    assert result.exit_code == 0, result.output
    path = tmp_path / "rows.json"
    args = ["evaluate", str(pairs["b-eval"]), "--artifact", str(art), "--json", str(path)]
    result = runner.invoke(app, [*args, "--guard", "0.2"])
    assert result.exit_code == 0, result.output
    rows = {r["scheduler"]: r for r in json.loads(path.read_text())}
    assert rows["distilled"]["tokens_per_s"] > 0 and "oracle" in rows
    result = runner.invoke(app, [*args, "--guard", "1.5"])
    assert result.exit_code == 2
    assert "--guard: expected float with 0 <= value < 1, got 1.5" in result.output


def test_evaluate_names_a_dataset_that_does_not_replay_as_collected(pairs, tmp_path):
    """A meta.json whose pipeline is not the collection's (another depth), or whose plans are
    another's, raised OracleMismatch or ReplayDiverged with a traceback (exit 1); a dataset
    listing no prompt printed a table of zeros."""
    changed = tmp_path / "changed"
    shutil.copytree(pairs["b-eval"], changed)
    meta = json.loads((changed / "meta.json").read_text())
    meta["pipeline_raw"]["builder"]["depth"] = 3
    (changed / "meta.json").write_text(json.dumps(meta))
    result = runner.invoke(app, ["evaluate", str(changed)])
    assert result.exit_code == 2, result.output
    assert "builds trees of depth 3, the data was collected at depth 2" in result.output
    shutil.copy(pairs["a-eval"] / "meta.json", changed / "meta.json")  # pair a, pair b's plans
    result = runner.invoke(app, ["evaluate", str(changed)])
    assert result.exit_code == 2 and "do not replay as collected" in result.output
    (changed / "meta.json").write_text(json.dumps({**meta, "prompts": []}))
    result = runner.invoke(app, ["evaluate", str(changed)])
    assert result.exit_code == 2 and "meta.json lists no prompt to replay" in result.output
    cost = {**meta["cost"], "step_overhead_s": -1.0}
    (changed / "meta.json").write_text(json.dumps({**meta, "depth": 3, "cost": cost}))
    a, b, ae = pairs["a-train"], pairs["b-train"], pairs["a-eval"]
    out = tmp_path / "o"
    msg = loo_error(a, b, "--eval", ae, "--eval", changed, "--out", out)  # before any fit
    assert f"--eval {changed}: meta.json 'cost': not a recorded cost model" in msg
    assert "step_overhead_s: expected seconds >= 0, got -1.0" in msg and not out.exists()


# ---------------------------------------------------------------------------- bad input


def loo_error(*args: Any) -> str:
    result = runner.invoke(app, ["loo", *map(str, args)])
    assert result.exit_code == 2, result.output
    return result.output


def test_loo_refuses_bad_inputs_naming_the_option(pairs, tmp_path):
    a, b, ae, be = (pairs[k] for k in ("a-train", "b-train", "a-eval", "b-eval"))
    out = ["--out", tmp_path / "o"]
    assert "DATASETS: expected at least 2 training datasets" in loo_error(a, "--eval", ae, *out)
    msg = loo_error(a, b, "--eval", ae, "--eval", be, "--plot", tmp_path / "loo.jpeg", *out)
    assert "--plot: expected a path ending in .png, .svg, .pdf, got" in msg
    assert not (tmp_path / "o").exists()  # refused before any fit
    msg = loo_error(a, b, "--eval", ae, *out)
    assert "--eval: expected one per training dataset (2" in msg and "got 1" in msg
    assert "--eval: expected one per training dataset" in loo_error(a, b, *out)
    missing = tmp_path / "nope"
    assert f"--eval {missing}: not found" in loo_error(a, b, "--eval", ae, "--eval", missing, *out)
    assert f"DATASETS {missing}: not found" in loo_error(a, missing, "--eval", ae, "--eval", be)
    assert f"--eval {tmp_path}: not a scheduler dataset" in loo_error(
        a, b, "--eval", ae, "--eval", tmp_path, *out
    )
    assert f"--eval {be}: pair" in loo_error(a, b, "--eval", be, "--eval", ae, *out)
    assert "collect it with --skip" in loo_error(a, b, "--eval", a, "--eval", be, *out)
    stranger = tmp_path / "stranger"
    shutil.copytree(pairs["a-follow"], stranger)
    meta = json.loads((stranger / "meta.json").read_text())
    (stranger / "meta.json").write_text(json.dumps({**meta, "strong_model": "zoo:other"}))
    msg = loo_error(a, b, "--eval", ae, "--eval", be, "--extra", stranger, *out)
    assert f"--extra {stranger}: pair" in msg and "not the pair of any training dataset" in msg
    msg = loo_error(a, b, "--eval", ae, "--eval", be, "--extra", ae, *out)
    assert f"--eval {ae}:" in msg and "also in training dataset" in msg  # extra shares prompts
    assert not (tmp_path / "o").exists()  # nothing fitted
