"""The truncated self-drafter's distillation recipe (`treegraft.zoo.self_distill`), end to end on a
small trained zoo model given a chat template: prompts from a corpus, the target's
batched greedy answers (equal to one-at-a-time `generate`, resumable), training that raises the
early exit's agreement, the shipped delta put back on a truncated copy, and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.zoo.tiny_gguf import CHAT_TEMPLATE
from treegraft import zoo
from treegraft.core.chat import chat_ids
from treegraft.zoo import formats, self_distill
from treegraft.zoo.truncate import DELTA_FILE, apply_delta

FUNCTION = '''def area(w, h):
    """Return the area
    of a rectangle."""
    return w * h
'''


def _task(kind: str, i: int) -> dict:
    text = formats.chat_example([f"{kind} question number {i}?"], f"answer {i}")
    return {"key": f"{kind}:{i}", "kind": "task", "text": text}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    rows = [_task(kind, i) for kind in self_distill.KINDS if kind != "function" for i in range(12)]
    rows += [
        {"key": f"f{i}", "kind": "function", "text": FUNCTION.replace("area", f"area{i}")}
        for i in range(12)
    ]
    rows.append({"key": "doc", "kind": "docs", "text": "A documentation page."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """zoo:draft-m (2 layers, trained: its greedy answers are text, not one repeated token) with
    a chat template."""
    path = tmp_path_factory.mktemp("target")
    for file in zoo.resolve("zoo:draft-m").iterdir():
        if file.is_file():
            shutil.copy2(file, path / file.name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def answers(tmp_path_factory, corpus, target_dir) -> Path:
    out = tmp_path_factory.mktemp("answers") / "answers.jsonl"
    prompts = self_distill.training_prompts(corpus, per_kind=10, seed=1)
    self_distill.generate_answers(target_dir, prompts, out, max_new_tokens=12, batch_size=7)
    return out


def test_function_prompt_stops_at_the_docstrings_closing_quotes():
    assert self_distill.function_prompt(FUNCTION) == FUNCTION[: FUNCTION.index('."""') + 4]
    assert self_distill.function_prompt("def f():\n    return 1\n") is None  # no docstring
    assert self_distill.function_prompt('def f():\n    """Only a docstring."""\n') is None
    assert self_distill.function_prompt("def f(:\n") is None
    assert self_distill.function_prompt("x = 1\n") is None


def test_training_prompts_are_balanced_seeded_and_complain_when_short(corpus):
    prompts = self_distill.training_prompts(corpus, per_kind=10, seed=1)
    kinds = [p.kind for p in prompts]
    assert sorted(set(kinds)) == sorted(self_distill.KINDS)
    assert all(kinds.count(k) == 10 for k in self_distill.KINDS)
    assert len({p.text for p in prompts}) == len(prompts)
    task = next(p for p in prompts if p.kind == "gsm")
    assert task.text.endswith(formats.ASSISTANT + "\n") and "answer" not in task.text
    assert next(p for p in prompts if p.kind == "function").text.endswith('rectangle."""')
    assert prompts == self_distill.training_prompts(corpus, per_kind=10, seed=1)
    assert prompts != self_distill.training_prompts(corpus, per_kind=10, seed=2)
    with pytest.raises(ValueError, match=r"per_kind: the corpus has 12 distinct 'alpaca'"):
        self_distill.training_prompts(corpus, per_kind=13)


def test_batched_answers_equal_one_prompt_at_a_time_greedy(answers, corpus, target_dir):
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    rows = self_distill.read_answers(answers)
    prompts = self_distill.training_prompts(corpus, per_kind=10, seed=1)
    assert len(rows) == len(prompts) == 60
    by_prompt = {tuple(ids[:n]): ids for ids, n in rows}
    for prompt in prompts[::6]:
        ids = torch.tensor([chat_ids(tokenizer, prompt.text)])
        alone = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False
        )[0].tolist()
        got = by_prompt[tuple(ids[0].tolist())]
        eos = model.generation_config.eos_token_id
        assert got == alone[: len(got)] and (len(got) == len(alone) or got[-1] == eos)


def test_answering_resumes_where_it_stopped(answers, corpus, target_dir, tmp_path):
    prompts = self_distill.training_prompts(corpus, per_kind=10, seed=1)
    partial = tmp_path / "answers.jsonl"
    lines = answers.read_text().splitlines(keepends=True)
    partial.write_text("".join(lines[:25]))
    calls = []
    n = self_distill.generate_answers(
        target_dir,
        prompts,
        partial,
        max_new_tokens=12,
        batch_size=7,
        progress=lambda i, total, tokens: calls.append((i, total, tokens)),
    )
    assert n == 60 and calls[-1][:2] == (5, 5)  # 35 prompts left: 5 batches of 7
    rows = self_distill.read_answers(partial)[25:]
    assert calls[-1][2] == sum(len(ids) - n for ids, n in rows) > 0
    assert sorted(partial.read_text().splitlines()) == sorted(answers.read_text().splitlines())
    assert self_distill.generate_answers(target_dir, prompts, partial, max_new_tokens=12) == 60


def test_answers_cut_short_or_for_other_prompts(answers, corpus, target_dir, tmp_path):
    prompts = self_distill.training_prompts(corpus, per_kind=10, seed=1)
    cut = tmp_path / "cut.jsonl"
    lines = answers.read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:59]) + lines[59][:20])  # the run stopped while writing
    assert self_distill.generate_answers(target_dir, prompts, cut, max_new_tokens=12) == 60
    assert sorted(cut.read_text().splitlines()) == sorted(answers.read_text().splitlines())
    others = self_distill.training_prompts(corpus, per_kind=10, seed=2)
    with pytest.raises(ValueError, match=r"answers\.jsonl:1: answers a prompt other than"):
        self_distill.generate_answers(target_dir, others, answers, max_new_tokens=12)


def test_answers_of_another_model_or_settings_are_refused(answers, corpus, target_dir, tmp_path):
    """A work folder's answers resumed by another base model or answer length would train the
    drafter on another target's labels: the answers' sidecar names the difference."""
    prompts = self_distill.training_prompts(corpus, per_kind=10, seed=1)
    mine = tmp_path / "answers.jsonl"
    mine.write_text(answers.read_text())
    assert self_distill.generate_answers(target_dir, prompts, mine, max_new_tokens=12) == 60
    assert json.loads(mine.with_suffix(".json").read_text())["max_new_tokens"] == 12
    with pytest.raises(ValueError, match=r"another max_new_tokens than this run's \(.*12 there"):
        self_distill.generate_answers(target_dir, prompts, mine, max_new_tokens=20)
    other = tmp_path / "other"
    shutil.copytree(target_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    with pytest.raises(ValueError, match=r"answers\.jsonl: answers of another model than"):
        self_distill.generate_answers(other, prompts, mine, max_new_tokens=12)


def test_distilling_raises_the_early_exits_agreement_and_the_delta_rebuilds_it(
    answers, target_dir, tmp_path
):
    out = tmp_path / "delta"
    record = self_distill.distil(
        target_dir, answers, out, layers=1, epochs=4, lr=3e-3, batch_tokens=1024, seed=0
    )
    assert record["valid_loss_after"] < record["valid_loss_before"] - 0.5
    assert record["valid_agreement_after"] > record["valid_agreement_before"] + 0.1
    from safetensors.torch import load_file

    delta = load_file(out / DELTA_FILE)
    assert {name.split(".")[2] for name in delta if name.startswith("model.layers.")} == {"0"}
    assert "model.norm.weight" in delta and "model.embed_tokens.weight" not in delta
    assert all(t.dtype == torch.bfloat16 for t in delta.values())

    built = apply_delta(target_dir, tmp_path / "built", out)
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32).eval()
    assert model.config.num_hidden_layers == 1
    base = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    assert torch.equal(model.model.embed_tokens.weight, base.model.embed_tokens.weight)
    assert torch.equal(model.model.norm.weight, delta["model.norm.weight"].float())
    _, valid = self_distill.split_rows(self_distill.read_answers(answers), 0.05)
    agreement, _ = self_distill.evaluate(model, valid, 0, 1024)
    assert agreement == pytest.approx(record["valid_agreement_after"], abs=0.05)


def test_teacher_rows_supervise_every_position_with_the_targets_top1(answers, target_dir, tmp_path):
    teacher = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    rows = self_distill.read_answers(answers)[:9]
    labelled = self_distill.teacher_rows(teacher, rows, 0, 256)
    assert sorted(ids for ids, _, _ in labelled) == sorted(ids for ids, _ in rows)
    for ids, first, targets in labelled:
        n = dict((tuple(i), p) for i, p in rows)[tuple(ids)]
        assert first == 1 and len(targets) == len(ids) - 1
        assert targets[n - 1 :] == ids[n:]  # the answers: the target's greedy tokens
        with torch.no_grad():
            top = teacher(torch.tensor([ids[:n]])).logits[0].argmax(-1).tolist()
        agree = sum(a == b for a, b in zip(targets[: n - 1], top, strict=False))
        assert agree >= 0.9 * (n - 1)  # bf16 autocast may flip a near tie
    record = self_distill.distil(
        target_dir, answers, tmp_path / "d", layers=1, epochs=1, label_prompts=True
    )
    assert record["label_prompts"] and record["supervised_tokens"] > 2 * record["answer_tokens"]


def test_a_delta_that_does_not_fit_its_base_is_refused(answers, target_dir, tmp_path):
    out = tmp_path / "delta"
    self_distill.distil(target_dir, answers, out, layers=1, epochs=1)
    from safetensors.torch import load_file, save_file

    delta = load_file(out / DELTA_FILE)
    delta["model.norm.weight"] = torch.ones(7, dtype=torch.bfloat16)
    save_file(delta, out / DELTA_FILE)
    with pytest.raises(ValueError, match=r"model\.norm\.weight of shape \(7,\) does not fit"):
        apply_delta(target_dir, tmp_path / "built", out)
    with pytest.raises(ValueError, match=r"layers: expected an int in \[1, 1\], got 2"):
        self_distill.distil(target_dir, answers, tmp_path / "x", layers=2)


def test_answer_counts_count_only_the_answers():
    counts = self_distill.answer_counts([([5, 6, 7, 7], 2), ([1, 7], 1)], 9)
    assert counts.tolist() == [0, 0, 0, 0, 0, 0, 0, 3, 0]


def test_the_distil_exit_command_runs_the_recipe_and_reports_bad_input(
    corpus, target_dir, tmp_path
):
    from typer.testing import CliRunner

    from treegraft.cli import app

    corpus_dir = corpus.parent
    common = ["zoo", "distil-exit", "--base", str(target_dir), "--corpus", str(corpus_dir)]
    out, work = tmp_path / "out", tmp_path / "work"
    args = [*common, "--out", str(out), "--work", str(work), "--per-kind", "3", "--epochs", "1"]
    result = CliRunner().invoke(app, [*args, "--layers", "1", "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "agreement on held-out answers" in result.stdout
    record = json.loads((out / self_distill.RECORD_FILE).read_text())
    assert record["layers"] == 1 and record["answers"] == 18 and record["label_prompts"]
    assert record["base"] == str(target_dir) and record["base_source"] is None
    counts = json.loads((out / self_distill.COUNTS_FILE).read_text())
    assert counts["tokens"] == record["answer_tokens"] + sum(
        len(ids) - n
        for ids, n in self_distill.split_rows(
            self_distill.read_answers(work / self_distill.ANSWERS_FILE), 0.05
        )[1]
    )
    logged = (work / "train.log").read_text()
    assert "answers: 18 prompts, 0 answered before" in logged and "after: agreement" in logged

    too_deep = CliRunner().invoke(app, [*args, "--layers", "2"])
    assert too_deep.exit_code == 2
    assert "layers: expected an int in [1, 1], got 2" in too_deep.stderr
    missing = CliRunner().invoke(app, [*common[:3], "zoo:no-such", "--corpus", str(corpus_dir)])
    assert missing.exit_code == 2 and "unknown zoo model 'zoo:no-such'" in missing.stderr
    no_corpus = CliRunner().invoke(app, [*common[:5], str(tmp_path)])
    assert no_corpus.exit_code == 2 and "treegraft zoo build-corpus" in no_corpus.stderr
    width = CliRunner().invoke(app, [*args, "--layers", "1", "--intermediate-size", "8"])
    assert width.exit_code == 2 and "only fresh layers (--fresh) take a width" in width.stderr


BAD_NUMBERS = {
    "threads-past-int64": (["--threads", str(2**70)], "--threads: expected int with 1 <= value"),
    "threads-zero": (["--threads", "0"], "--threads: expected int with 1 <= value"),
    "lr-inf": (["--lr", "inf"], "--lr: expected a finite number > 0, got inf"),
    "lr-nan": (["--lr", "nan"], "--lr: expected a finite number > 0, got nan"),
    "lr-zero": (["--lr", "0"], "--lr: expected a finite number > 0, got 0.0"),
}


@pytest.mark.parametrize(("args", "message"), BAD_NUMBERS.values(), ids=BAD_NUMBERS.keys())
def test_the_distil_exit_command_refuses_bad_numbers_before_any_work(
    tmp_path, monkeypatch, args, message
):
    """A thread count past 64 bits was an internal error; an infinite learning rate trained
    the layers into NaN; both are refused naming the option, before the model loads."""
    from typer.testing import CliRunner

    from treegraft.cli import app

    (tmp_path / "corpus.jsonl").write_text('{"text": "x"}\n')
    monkeypatch.setattr(self_distill, "run", lambda *a, **k: pytest.fail("the recipe ran"))
    result = CliRunner().invoke(app, ["zoo", "distil-exit", "--corpus", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_a_fresh_drafter_learns_from_answers_and_corpus_and_decodes_exactly(
    answers, corpus, target_dir, tmp_path
):
    """`fresh`: random layers of their own MLP width on the target's embedding and head, trained
    on the answers and on corpus windows the target labels; the delta rebuilds it, and as a
    drafter it leaves the target's output unchanged."""
    from safetensors.torch import load_file

    from treegraft.core.pipeline import load_pipeline
    from treegraft.zoo.fresh_draft import corpus_windows

    windows = corpus_windows(corpus, target_dir, tokens=600, seq_len=40, seed=0)
    assert 600 <= sum(len(w) for w in windows) < 640 and max(len(w) for w in windows) <= 40
    out = tmp_path / "delta"
    record = self_distill.distil(
        target_dir, answers, out, layers=1, epochs=4, lr=3e-3, batch_tokens=1024, seed=0,
        fresh={"intermediate_size": 64}, windows=windows,
    )  # fmt: skip
    assert record["init"] == "fresh" and record["config"] == {"intermediate_size": 64}
    assert record["corpus_windows"] == len(windows) and "corpus windows" in record["recipe"]
    assert record["valid_agreement_after"] > record["valid_agreement_before"] + 0.1
    delta = load_file(out / DELTA_FILE)
    assert delta["model.layers.0.mlp.up_proj.weight"].shape[0] == 64
    assert "model.embed_tokens.weight" not in delta

    built = apply_delta(target_dir, tmp_path / "built", out)
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32).eval()
    assert model.config.intermediate_size == 64 and model.config.num_hidden_layers == 1
    base = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    assert torch.equal(model.model.embed_tokens.weight, base.model.embed_tokens.weight)
    torch.testing.assert_close(
        model.model.layers[0].mlp.up_proj.weight,
        delta["model.layers.0.mlp.up_proj.weight"].float(),
    )
    _, valid = self_distill.split_rows(self_distill.read_answers(answers), 0.05)
    agreement, _ = self_distill.evaluate(model, valid, 0, 1024)
    assert agreement == pytest.approx(record["valid_agreement_after"], abs=0.05)

    spec = {
        "target": str(target_dir),
        "drafters": {"w": {"name": "ngram"}, "s": {"name": "hf_lm", "model": str(built)}},
        "builder": {"name": "layered", "depth": 4, "top_k": 3, "budget": 12},
        "scheduler": "always",
        "decoding": {"max_new_tokens": 24, "dtype": "float64"},
    }
    pipe = load_pipeline(spec)
    teacher = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    for ids, n in self_distill.read_answers(answers)[:3]:
        out_ids = pipe.generate(ids[:n], max_new_tokens=24).token_ids
        with torch.no_grad():
            ref = teacher.generate(
                torch.tensor([ids[:n]]), max_new_tokens=24, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )[0, n:].tolist()  # fmt: skip
        assert list(out_ids) == ref[: len(out_ids)] and len(out_ids) > 0


def test_fresh_shapes_and_reshaped_deltas_are_checked(answers, target_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from treegraft.zoo.fresh_draft import check_shape

    with pytest.raises(ValueError, match=r"unknown shape setting 'hidden_size'"):
        check_shape({"hidden_size": 8})
    with pytest.raises(
        ValueError, match=r"fresh\.intermediate_size: expected a positive int, got 0"
    ):
        self_distill.distil(
            target_dir, answers, tmp_path / "x", layers=1, fresh={"intermediate_size": 0}
        )
    out = tmp_path / "delta"
    self_distill.distil(
        target_dir, answers, out, layers=1, epochs=1, fresh={"intermediate_size": 32}
    )
    delta = load_file(out / DELTA_FILE)
    del delta["model.layers.0.mlp.down_proj.weight"]
    save_file(delta, out / DELTA_FILE)
    with pytest.raises(
        ValueError,
        match=r"must hold every layer tensor; model\.layers\.0\.mlp\.down_proj\.weight is missing",
    ):
        apply_delta(target_dir, tmp_path / "built", out)
