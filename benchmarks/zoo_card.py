"""Regenerate the tables of docs/zoo.md: the zoo's models measured on this machine.

Per model: size, shape, training budget and held-out loss per suite; forward latency of 1/4/16/64
tokens after a 256-token prefix; each drafter's top-1 agreement with the target's greedy output;
one greedy sample per suite; and two task checks (humaneval completions that parse, gsm8k answers
that are right). Run from the repository root:

    python benchmarks/zoo_card.py                 # rewrites the marked block of docs/zoo.md
    python benchmarks/zoo_card.py --json card.json
"""

from __future__ import annotations

import ast
import copy
import json
import re
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from transformers import AutoModelForCausalLM, AutoTokenizer

from treegraft import zoo

BEGIN, END = "<!-- zoo-card:begin -->", "<!-- zoo-card:end -->"
LATENCY_SIZES = (1, 4, 16, 64)
PREFIX_TOKENS = 256

app = typer.Typer(add_completion=False)


# ---------------------------------------------------------------- models


def load_model(name: str) -> torch.nn.Module:
    """A zoo model in float32, eval mode."""
    return AutoModelForCausalLM.from_pretrained(str(zoo.resolve(name)), dtype=torch.float32).eval()


def training_record(name: str) -> dict[str, Any]:
    """The model's ``training.json`` (written by the zoo trainer)."""
    return json.loads((zoo.resolve(name) / "training.json").read_text())


def describe(name: str, model: torch.nn.Module) -> dict[str, Any]:
    """Size, shape and training budget of one model."""
    cfg, rec = model.config, training_record(name)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "shape": f"{cfg.num_hidden_layers}L d{cfg.hidden_size} h{cfg.num_attention_heads}/kv{cfg.num_key_value_heads} ffn{cfg.intermediate_size}",
        "tokens": rec["tokens"],
        "cpu_hours": rec["cpu_seconds"] / 3600,
        "teacher": rec.get("teacher") or "-",
        "valid_loss": rec.get("valid_loss"),
    }


# ---------------------------------------------------------------- measurements


@torch.no_grad()
def reference_loss(
    model: torch.nn.Module, prompt: list[int], reference: list[int]
) -> tuple[float, int]:
    """Summed next-token loss of ``reference`` given ``prompt``, and its token count."""
    ids = torch.tensor([prompt + reference])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # [n_ref, vocab]
    loss = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum")
    return float(loss), len(reference)


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], max_new: int, eos: int) -> list[int]:
    """Plain greedy decoding with the model's KV cache; stops at EOS (excluded)."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    tokens: list[int] = []
    while len(tokens) < max_new:
        nxt = int(out.logits[0, -1].argmax())
        if nxt == eos:
            break
        tokens.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]]), cache=out.cache, use_cache=True)
    return tokens


@torch.no_grad()
def agreement(
    drafter: torch.nn.Module, prompt: list[int], continuation: list[int]
) -> tuple[int, int]:
    """Positions of ``continuation`` where the drafter's top-1 equals the target's greedy token."""
    if not continuation:
        return 0, 0
    ids = torch.tensor([prompt + continuation])
    pred = drafter(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1)  # [n_cont]
    return int((pred == torch.tensor(continuation)).sum()), len(continuation)


@torch.no_grad()
def latency_table(
    models: dict[str, torch.nn.Module], prefix: list[int], repeats: int
) -> dict[str, dict[int, float]]:
    """Median wall time (ms) of one forward of n tokens after a cached ``prefix``, per model.

    The models take turns within every repeat, so load from other processes on a shared
    machine hits all of them alike and their ratios stay meaningful.
    """
    caches = {
        name: m(input_ids=torch.tensor([prefix]), use_cache=True).cache
        for name, m in models.items()
    }
    times: dict[str, dict[int, list[float]]] = {
        name: {n: [] for n in LATENCY_SIZES} for name in models
    }
    for _ in range(repeats + 1):
        for n in LATENCY_SIZES:
            for name, model in models.items():
                times[name][n].append(_time_forward(model, caches[name], prefix[:n]))
    return {
        name: {n: 1000 * statistics.median(t[1:]) for n, t in per.items()}
        for name, per in times.items()
    }


def _time_forward(model: torch.nn.Module, cache: Any, block: list[int]) -> float:
    """Seconds for one forward of ``block`` on a copy of ``cache`` (synchronises)."""
    fresh = copy.deepcopy(cache)
    start = time.perf_counter()
    model(input_ids=torch.tensor([block]), cache=fresh, use_cache=True)
    return time.perf_counter() - start


def humaneval_completion(text: str) -> str:
    """The generated function body: lines up to the first non-indented, non-empty line."""
    lines = []
    for line in text.splitlines(keepends=True):
        if line.strip() and not line[0].isspace():
            break
        lines.append(line)
    return "".join(lines)


def parses(prompt: str, body: str) -> bool:
    """Whether prompt + body is valid Python."""
    try:
        ast.parse(prompt + body)
    except SyntaxError:
        return False
    return bool(body.strip())


def final_answer(text: str) -> str | None:
    """The number on the ``Answer:`` line of a solution, if any."""
    match = re.search(r"Answer:\s*\$?(-?[\d,]+)", text)
    return match.group(1).replace(",", "") if match else None


# ---------------------------------------------------------------- the card


def measure(max_new: int, repeats: int) -> dict[str, Any]:
    """Run every measurement; returns a JSON-serialisable card."""
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(zoo.tokenizer_path()))
    eos = tok.eos_token_id
    names = ["target"] + [n for n in zoo.available() if n != "target"]
    models = {n: load_model(n) for n in names}
    suites = {s: zoo.load_suite(s) for s in zoo.SUITES}
    encoded = {
        s: [(tok(r["prompt"])["input_ids"], tok(r["reference"])["input_ids"]) for r in items]
        for s, items in suites.items()
    }
    prefix = [t for s in suites["cnndm"] for t in tok(s["prompt"])["input_ids"]][:PREFIX_TOKENS]
    card: dict[str, Any] = {
        "models": {},
        "settings": {
            "max_new_tokens": max_new,
            "latency_repeats": repeats,
            "threads": torch.get_num_threads(),
        },
    }
    for name, model in models.items():
        row = describe(name, model)
        row["suite_loss"] = {s: _suite_loss(model, pairs) for s, pairs in encoded.items()}
        card["models"][name] = row
    for name, per_size in latency_table(models, prefix, repeats).items():
        card["models"][name]["latency_ms"] = per_size
    card["greedy"] = _greedy_outputs(models["target"], encoded, eos, max_new)
    card["agreement"] = {
        n: {s: _suite_agreement(models[n], encoded[s], card["greedy"][s]) for s in zoo.SUITES}
        for n in names[1:]
    }
    card["samples"] = {s: tok.decode(card["greedy"][s][0]) for s in zoo.SUITES}
    card["tasks"] = _task_scores(tok, suites, card["greedy"])
    return card


def _suite_loss(model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]]) -> float:
    """Token-weighted mean reference loss over a suite."""
    total, count = 0.0, 0
    for prompt, ref in pairs:
        loss, n = reference_loss(model, prompt, ref)
        total, count = total + loss, count + n
    return total / count


def _greedy_outputs(
    target: torch.nn.Module, encoded: dict, eos: int, max_new: int
) -> dict[str, list[list[int]]]:
    """The target's greedy continuation of every suite prompt."""
    return {s: [greedy(target, p, max_new, eos) for p, _ in pairs] for s, pairs in encoded.items()}


def _suite_agreement(drafter: torch.nn.Module, pairs: list, outputs: list[list[int]]) -> float:
    """Fraction of the target's greedy tokens that are also the drafter's top-1, over a suite."""
    hits = total = 0
    for (prompt, _), cont in zip(pairs, outputs, strict=True):
        h, n = agreement(drafter, prompt, cont)
        hits, total = hits + h, total + n
    return hits / max(1, total)


def _task_scores(tok: Any, suites: dict, outputs: dict) -> dict[str, float]:
    """humaneval parse rate and gsm8k answer accuracy of the target's greedy outputs."""
    he = [
        parses(r["prompt"], humaneval_completion(tok.decode(o)))
        for r, o in zip(suites["humaneval"], outputs["humaneval"], strict=True)
    ]
    gsm = [
        final_answer(tok.decode(o)) == final_answer(r["reference"])
        for r, o in zip(suites["gsm8k"], outputs["gsm8k"], strict=True)
    ]
    return {"humaneval_parses": sum(he) / len(he), "gsm8k_correct": sum(gsm) / len(gsm)}


# ---------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render(card: dict[str, Any]) -> str:
    """The generated block of docs/zoo.md."""
    models = card["models"]
    target_64 = models["target"]["latency_ms"][64]
    parts = [
        "### Models\n",
        _table(
            ["model", "params", "shape", "train tokens", "CPU hours", "teacher", "valid loss"],
            [
                [
                    n,
                    f"{m['params'] / 1e6:.2f}M",
                    m["shape"],
                    f"{m['tokens'] / 1e6:.2f}M",
                    f"{m['cpu_hours']:.2f}",
                    m["teacher"],
                    f"{m['valid_loss']:.3f}",
                ]
                for n, m in models.items()
            ],
        ),
        "\n### Held-out loss per suite (nats per reference token)\n",
        _table(
            ["model", *zoo.SUITES],
            [[n, *(f"{m['suite_loss'][s]:.3f}" for s in zoo.SUITES)] for n, m in models.items()],
        ),
        f"\n### Forward latency after a {PREFIX_TOKENS}-token prefix (ms, median, float32, {card['settings']['threads']} threads)\n",
        _table(
            ["model", *(f"{n} tok" for n in LATENCY_SIZES), "cost ratio @64"],
            [
                [
                    n,
                    *(f"{m['latency_ms'][k]:.1f}" for k in LATENCY_SIZES),
                    f"{m['latency_ms'][64] / target_64:.2f}",
                ]
                for n, m in models.items()
            ],
        ),
        "\n### Top-1 agreement with the target's greedy output\n",
        _table(
            ["drafter", *zoo.SUITES, "mean"],
            [
                [n, *(f"{a[s]:.3f}" for s in zoo.SUITES), f"{sum(a.values()) / len(a):.3f}"]
                for n, a in card["agreement"].items()
            ],
        ),
        "\n### Task checks (target, greedy)\n",
        f"- humaneval completions that parse with `ast`: {card['tasks']['humaneval_parses']:.0%}",
        f"- gsm8k final answers that are correct: {card['tasks']['gsm8k_correct']:.0%}",
        f"\n### One greedy sample per suite (target, first prompt, up to {card['settings']['max_new_tokens']} tokens)\n",
    ]
    for s, text in card["samples"].items():
        parts.append(f"**{s}**\n\n```text\n{text.strip()}\n```\n")
    return "\n".join(parts)


def write_block(doc: Path, block: str) -> None:
    """Replace the text between the card markers of ``doc`` with ``block``."""
    text = doc.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}", encoding="utf-8")


@app.command()
def main(
    doc: Annotated[Path, typer.Option(help="Markdown file with the card markers.")] = Path(
        "docs/zoo.md"
    ),
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw card as JSON.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Greedy tokens per prompt.")] = 96,
    repeats: Annotated[int, typer.Option(help="Timed repeats per latency point.")] = 15,
) -> None:
    """Measure the zoo and rewrite the generated block of DOC."""
    card = measure(max_new_tokens, repeats)
    if json_out is not None:
        json_out.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    write_block(doc, render(card))


if __name__ == "__main__":
    app()
