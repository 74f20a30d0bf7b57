"""Work units on the local executor: a driver killed with SIGKILL resumes to the records of an
uninterrupted run, a failing unit is retried then reported while the sweep finishes, and a
non-empty `--out` is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import attrs
import pytest
import yaml
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from tests.bench.conftest import CHARS, pair_resources, write_suites
from treegraft.bench import bench_config_from_dict, run_bench
from treegraft.bench.config import BenchConfig
from treegraft.bench.records import Request
from treegraft.bench.store import STORE, OutDirError, read_store
from treegraft.bench.units import plan_units
from treegraft.core.config import ConfigError
from treegraft.core.resources import Resources

ROOT = Path(__file__).resolve().parents[2]
#: A character the test tokenizer maps to an id past the models' 64-token vocabulary.
BROKEN = "~"
#: Fields that hold timings or memory: everything else must match an uninterrupted run.
TIMING = ("wall_s", "split", "step_times", "peak_mem_mib")


def sweep_config(directory: Path, **settings) -> BenchConfig:
    """Tiny sweep: 4 prompts, ar + ngram-only + one pipeline on a fixed schedule, no replay."""
    return bench_config_from_dict(
        {
            "pairs": [{"target": "mem:target", "drafter": "mem:draft"}],
            "suites": write_suites(directory),
            "prompts_per_suite": 2,
            "max_new_tokens": 10,
            "baselines": ["ngram-only"],
            "pipelines": [  # nothing reads the clock: records are repeatable
                {
                    "pipeline": "treegraft-threshold",
                    "label": "tg",
                    "override": {
                        "scheduler": {"name": "every_k", "k": 2},
                        "builder.max_strong_calls": 5,
                    },
                }
            ],
            "latency_repeats": 1,
            "warmup_tokens": 0,
            **settings,
        }
    )


def broken_tokenizer() -> PreTrainedTokenizerFast:
    """The test tokenizer plus `~` -> id 99: a prompt holding it fails inside the target."""
    vocab = {c: i for i, c in enumerate(CHARS)} | {"<unk>": len(CHARS), BROKEN: 99}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def resources_with_broken_tokenizer() -> Resources:
    res = pair_resources()
    res.tokenizer = broken_tokenizer()
    return res


def break_one_prompt(directory: Path) -> None:
    """Put `~` into the second chat prompt of the suites in `directory`."""
    path = directory / "chat.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["prompt"] += BROKEN
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def without_timings(request: Request) -> dict:
    data = attrs.asdict(request)
    return {k: v for k, v in data.items() if k not in TIMING}


def test_units_shard_consecutive_prompts_of_one_cell(tmp_path):
    config = sweep_config(tmp_path, repeat=2)
    from treegraft.bench.suites import load_prompts

    prompts = [p for s in config.settings.suites for p in load_prompts(s, 2, tmp_path)]
    units = plan_units(
        config, prompts, done={("target+draft", "code", "code-0", 0)}, prompts_per_unit=2
    )
    assert [(u.repeat, [p.id for p in u.prompts]) for u in units] == [
        (0, ["code-1"]),
        (0, ["chat-0", "chat-1"]),
        (1, ["code-0", "code-1"]),
        (1, ["chat-0", "chat-1"]),
    ]


CHILD = """
import os, signal, sys
from pathlib import Path
from tests.bench.conftest import pair_resources
from tests.bench.test_units import sweep_config
from treegraft.bench import run_bench, store, sweep

where, directory, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
def die():
    os.kill(os.getpid(), signal.SIGKILL)

if where == "append":  # killed half way through writing the third record
    def append(self, record):
        if len(self.records) == 2:
            os.write(self._fd, store.encode_line(record)[:60])
            die()
        original(self, record)
    original = store.ResultStore.append
    store.ResultStore.append = append
else:  # killed while the third prompt decodes
    def requests(self, prompt, repeat, advance):
        for i, request in enumerate(original(self, prompt, repeat, advance)):
            if prompt.id == "chat-0" and i == 1:
                die()
            yield request
    original = sweep.PairSession.requests
    sweep.PairSession.requests = requests
run_bench(sweep_config(directory), out, resources=pair_resources(), progress=False)
"""


@pytest.mark.parametrize("where", ["append", "decode"])
def test_a_driver_killed_with_sigkill_resumes_to_the_uninterrupted_records(tmp_path, where):
    config = sweep_config(tmp_path)
    whole = run_bench(config, tmp_path / "whole", resources=pair_resources(), progress=False)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, where, str(tmp_path), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stderr
    stored = read_store(out / STORE)
    assert len(stored.records) == 2 and stored.corrupt_lines == (where == "append")

    with pytest.raises(OutDirError, match="pass --resume"):
        run_bench(config, out, resources=pair_resources(), progress=False)
    torn = pytest.warns(UserWarning, match="1 damaged line") if where == "append" else nullcontext()
    with torn:
        resumed = run_bench(config, out, resources=pair_resources(), progress=False, resume=True)
    assert [without_timings(r) for r in resumed.requests] == [
        without_timings(r) for r in whole.requests
    ]
    kept = tuple(r for rec in stored.records for r in rec.requests)
    assert resumed.requests[: len(kept)] == kept
    assert resumed.rows and not resumed.failed
    assert read_store(out / STORE).corrupt_lines == 0
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt_id"] for line in lines] == [
        r.prompt_id for r in whole.requests
    ]


def test_a_failing_unit_is_retried_then_reported_and_the_sweep_finishes(tmp_path):
    config = sweep_config(tmp_path).with_executor(retries=1)
    break_one_prompt(tmp_path)
    out = tmp_path / "out"
    result = run_bench(config, out, resources=resources_with_broken_tokenizer(), progress=False)
    assert [(r.prompt_ids, r.attempts) for r in result.failed] == [(("chat-1",), 2)]
    assert "IndexError" in result.failed[0].error
    assert {r.prompt_id for r in result.requests} == {"code-0", "code-1", "chat-0"}
    assert all(r.exact for r in result.requests)
    assert "## Failed units (1)" in (out / "summary.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert [f["prompt_ids"] for f in manifest["failed"]] == [["chat-1"]]
    statuses = [r.status for r in read_store(out / STORE).records]
    assert statuses == ["done", "done", "done", "failed"]  # retries are not stored

    again = run_bench(
        config, out, resources=resources_with_broken_tokenizer(), progress=False, resume=True
    )
    assert [r.prompt_ids for r in again.failed] == [("chat-1",)]  # only the failed unit reran
    assert again.requests == result.requests


def test_a_sweep_whose_every_unit_failed_says_nothing_was_measured(tmp_path, capsys):
    """It wrote empty tables, 'All 0 outputs equal plain decoding', '1 prompt(s) per suite',
    empty plots (with matplotlib's legend warning) and an empty top-methods table."""
    from treegraft.bench.cli import print_summary

    config = sweep_config(tmp_path, prompts_per_suite=1).with_executor(retries=0)
    for path in tmp_path.glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "prompt": r["prompt"] + BROKEN}) + "\n"
                                for r in records))  # fmt: skip
    out = tmp_path / "out"
    result = run_bench(config, out, resources=resources_with_broken_tokenizer(), progress=False)
    assert len(result.failed) == 2 and not result.requests and not result.rows
    summary = (out / "summary.md").read_text()
    assert "prompts per suite: code 0, chat 0 ·" in summary
    assert "Nothing was measured: every unit failed (listed below)" in summary
    assert "## Failed units (2)" in summary and "## Overall" not in summary
    assert not list(out.glob("*.png"))
    print_summary(result.rows, out)
    assert "Nothing was measured" in capsys.readouterr().out


class MissingFileTokenizer:
    """The test tokenizer, but a chat prompt needs a file that is not there."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, text, **kw):
        if text.startswith("the cat sat"):
            raise FileNotFoundError("[Errno 2] No such file or directory: '/models/gone'")
        return self.inner(text, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_configuration_error_in_a_local_unit_names_the_unit(tmp_path):
    """The local executor stopped the sweep with the bare error (the Ray executor names the
    unit and worker): which unit met it went unsaid."""
    res = pair_resources()
    res.tokenizer = MissingFileTokenizer(res.tokenizer)
    with pytest.raises(ConfigError) as info:
        run_bench(sweep_config(tmp_path), tmp_path / "out", resources=res, progress=False)
    assert str(info.value) == (
        "[Errno 2] No such file or directory: '/models/gone' (unit target+draft · code-0)"
    )


def test_the_command_line_refuses_a_non_empty_out_and_forces_over_it(tmp_path):
    from tests.bench.test_sweep import cli

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier run")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"pairs": [{"target": "zoo:target", "drafter": "x"}]}))
    result = CliRunner().invoke(cli(), ["bench", str(sweep), "--out", str(out)])
    assert result.exit_code == 2
    assert f"--out {out}: the folder is not empty (1 entries: notes.txt)" in result.output
    assert "--resume" in result.output and "--force" in result.output
    assert (out / "notes.txt").read_text() == "an earlier run"
    result = CliRunner().invoke(cli(), ["bench", str(sweep), "--executor", "spark"])
    assert result.exit_code == 2 and "bench.executor.name" in result.output


def test_the_ray_executor_without_ray_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    config = sweep_config(tmp_path).with_executor(name="ray")
    with pytest.raises(ConfigError, match=r"pip install 'treegraft\[ray\]'"):
        run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)


def test_executor_settings_are_checked_with_their_path(tmp_path):
    with pytest.raises(ConfigError, match=r"bench\.executor\.retries: expected int >= 0, got -1"):
        sweep_config(tmp_path).with_executor(retries=-1)
    with pytest.raises(ConfigError, match=r"bench\.executor\.nodes: unknown key"):
        sweep_config(tmp_path, executor={"nodes": 2})
    assert sweep_config(tmp_path, executor={"name": "ray", "num_gpus": 1}).executor.num_gpus == 1


def test_a_pair_with_its_target_split_over_cpu_and_disk_benchmarks_exactly(tmp_path, caplog):
    pytest.importorskip("accelerate")
    from tests.bench.conftest import char_tokenizer, tiny_pair_models

    refs = {}
    for name, model in zip(("target", "draft"), tiny_pair_models(), strict=True):
        model.save_pretrained(tmp_path / name)
        char_tokenizer().save_pretrained(tmp_path / name)
        refs[name] = str(tmp_path / name)
    split = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    split |= {"model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
    outputs = {}
    offload = tmp_path / "offload"
    placed = {"device_map": {"target": split}, "offload_folder": str(offload)}
    for how, placement in (("plain", {}), ("split", placed)):
        pair = {"target": refs["target"], "drafter": refs["draft"], **placement}
        config = sweep_config(tmp_path, pairs=[pair], dtype="float64", device="cpu")
        result = run_bench(config, tmp_path / how, progress=False)
        assert all(r.exact for r in result.requests) and not result.failed
        outputs[how] = [(r.key, r.method, r.output_ids) for r in result.requests]
    assert outputs["split"] == outputs["plain"]
    assert "offloaded" in caplog.text  # accelerate placed the target, partly on disk
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    assert manifest["config"]["pairs"][0]["device_map"] == {"target": split}
    assert (
        "device_map"
        not in json.loads((tmp_path / "plain" / "manifest.json").read_text())["config"]["pairs"][0]
    )
    with pytest.raises(ConfigError, match=r"bench\.pairs\[0\]\.device_map: expected"):
        sweep_config(tmp_path, pairs=[{"target": "a", "drafter": "b", "device_map": {"x": 0}}])


def test_the_sweeps_small_blocks_choices_are_gathered_once_from_its_workers() -> None:
    from treegraft.bench.store import UnitRecord
    from treegraft.bench.units import small_blocks, worker_identity

    assert isinstance(worker_identity("local")["small_blocks"], list)
    one = {"model": "m", "bitwise": True, "threads": 2, "padded": False, "how": "default"}
    two = {**one, "threads": 1, "padded": True, "how": "measured"}
    records = [
        UnitRecord("p", "s", 0, ("a",), "done", worker={"small_blocks": [one]}),
        UnitRecord("p", "s", 0, ("b",), "done", worker={"small_blocks": [one, two]}),
        UnitRecord("p", "s", 0, ("c",), "failed", worker={}),
    ]
    assert small_blocks(records) == [one, two]
