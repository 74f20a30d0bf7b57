"""The model parts of `gpu_check.py`: zoo pipelines on the device, latency curves of random-weight
targets of real sizes, and the speedups the bench replay predicts on those curves.

Each part returns plain data (lists of dicts) for the JSON report and a markdown table for the
human one. Sizes come from a `ModelSizes`: real ones on CUDA, tiny ones for `--cpu-dry-run`.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
from pathlib import Path
from typing import Any

import attrs
import torch

#: Llama-3-8B and Llama-3.2-1B shapes (no weights are downloaded: random weights from configs)
REAL_SHAPES = {
    "llama3-8b-shaped": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
    "llama3-1b-shaped": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=True,
    ),
}
#: the same two roles at toy sizes, for the CPU dry run
TINY_SHAPES = {
    "tiny-8b-role": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        tie_word_embeddings=False,
    ),
    "tiny-1b-role": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        tie_word_embeddings=True,
    ),
}
#: the zoo pipelines checked: baselines of the harness, then shipped pipelines
BASELINES = ["hf-assisted", "chain", "chain-hf", "ngram-only", "lm-only"]
PIPELINES = ["treegraft", "treegraft-threshold", "cascade3"]


@attrs.frozen
class ModelSizes:
    """How much each model part runs."""

    device: str
    dtypes: tuple[str, ...]
    suites: tuple[str, ...]
    prompts_per_suite: int
    max_new_tokens: int
    shapes: dict[str, dict[str, int]]
    contexts: tuple[int, ...]
    largest_tree: int
    curve_repeats: int
    curve_dtype: torch.dtype

    @classmethod
    def for_device(cls, device: str) -> ModelSizes:
        if device == "cuda":
            return cls(
                device="cuda",
                dtypes=("float32", "bfloat16"),
                suites=("humaneval", "gsm8k", "mt_bench"),
                prompts_per_suite=2,
                max_new_tokens=64,
                shapes=REAL_SHAPES,
                contexts=(1024, 4096),
                largest_tree=256,
                curve_repeats=5,
                curve_dtype=torch.bfloat16,
            )
        return cls(
            device="cpu",
            dtypes=("float32", "bfloat16"),
            suites=("humaneval",),
            prompts_per_suite=1,
            max_new_tokens=6,
            shapes=TINY_SHAPES,
            contexts=(32, 64),
            largest_tree=16,
            curve_repeats=1,
            curve_dtype=torch.float32,
        )


# ---------------------------------------------------------------------------- zoo pipelines

#: the `decoding.forward` of each attention path compared: SDPA through the lean forward, or the
#: tree-attention kernel through transformers' forward
FORWARD_OF = {"sdpa": "lean", "tree": "tree"}


def pipeline_rows(sizes: ModelSizes, out: Path) -> list[dict[str, Any]]:
    """Every zoo pipeline in each dtype, with SDPA and with the tree kernel: exactness against
    plain decoding (`ar`), tau, tokens/s and its ratio to `ar-runner` and to `ar`."""
    from treegraft.bench import bench_config_from_dict, run_bench

    rows = []
    for dtype in sizes.dtypes:
        for attention in ("sdpa", "tree"):
            config = bench_config_from_dict(
                {
                    "pairs": [{"target": "zoo:target", "drafter": "zoo:draft-m"}],
                    "suites": list(sizes.suites),
                    "prompts_per_suite": sizes.prompts_per_suite,
                    "max_new_tokens": sizes.max_new_tokens,
                    "dtype": dtype,
                    "device": sizes.device,
                    "forward": FORWARD_OF[attention],
                    "baselines": BASELINES,
                    "pipelines": PIPELINES,
                    "warmup_tokens": 4,
                }
            )
            result = run_bench(config, out / f"pipelines-{dtype}-{attention}", progress=False)
            rows += _overall(result.rows, dtype, attention)
            _release()
    return rows


def _overall(rows: Any, dtype: str, attention: str) -> list[dict[str, Any]]:
    overall = {r.method: r for r in rows if r.pair == "all" and r.suite == "all"}
    plain = {m: overall[m].tokens_per_s for m in ("ar", "ar-runner")}
    return [
        {
            "dtype": dtype,
            "attention": attention,
            "method": r.method,
            "exact_rate": r.exact_rate,
            "tau": r.tau,
            "tokens_per_s": r.tokens_per_s,
            "vs_ar_runner": r.tokens_per_s / plain["ar-runner"],
            "vs_ar": r.tokens_per_s / plain["ar"],
            "split": r.split,
        }
        for r in overall.values()
    ]


def pipeline_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per (dtype, method), SDPA and tree-kernel columns side by side."""
    cell = {(r["dtype"], r["attention"], r["method"]): r for r in rows}
    keys = list(dict.fromkeys((r["dtype"], r["method"]) for r in rows))
    lines = [
        "| dtype | method | exact (sdpa / tree) | tau | tok/s sdpa | tok/s tree | tree / sdpa | "
        "vs ar-runner (sdpa / tree) | vs ar (sdpa / tree) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, method in keys:
        s, t = cell.get((dtype, "sdpa", method)), cell.get((dtype, "tree", method))
        if s is None or t is None:
            continue
        lines.append(
            f"| {dtype} | {method} | {s['exact_rate']:.0%} / {t['exact_rate']:.0%} | "
            f"{s['tau']:.2f} | {s['tokens_per_s']:.1f} | {t['tokens_per_s']:.1f} | "
            f"{t['tokens_per_s'] / s['tokens_per_s']:.2f}x | "
            f"{s['vs_ar_runner']:.2f}x / {t['vs_ar_runner']:.2f}x | "
            f"{s['vs_ar']:.2f}x / {t['vs_ar']:.2f}x |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- latency curves


def random_model(shape: dict[str, int], dtype: torch.dtype, device: str) -> Any:
    """A `LlamaForCausalLM` of `shape` with random weights, built on `device` (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, max_position_embeddings=8192, attn_implementation="sdpa")
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(dtype).eval()


def curve_queries(largest: int) -> tuple[int, ...]:
    """Tree sizes N (tokens per forward) from 1 to `largest`: powers of two and points between."""
    from treegraft.core.runner.latency import query_grid

    between = [q for q in (3, 6, 12, 24, 48, 96, 160, 192) if q < largest]
    return query_grid(largest, marks=between)


def latency_curves(sizes: ModelSizes) -> list[dict[str, Any]]:
    """t(N) of each random model at each context, with SDPA (lean forward) and the tree kernel."""
    from treegraft.core.runner import CausalLMRunner
    from treegraft.core.runner.latency import measure_latency
    from treegraft.kernels.tree_attention.hf import register

    queries = curve_queries(sizes.largest_tree)
    curves = []
    for name, shape in sizes.shapes.items():
        model = random_model(shape, sizes.curve_dtype, sizes.device)
        for attention, implementation in (("sdpa", "sdpa"), ("tree", register())):
            model.set_attn_implementation(implementation)
            for context in sizes.contexts:
                curve = measure_latency(
                    CausalLMRunner(model),
                    name,
                    context=context,
                    queries=queries,
                    repeats=sizes.curve_repeats,
                )
                curves.append({"attention": attention, **attrs.asdict(curve)})
        del model
        _release()
    return curves


def curve_table(curves: list[dict[str, Any]]) -> str:
    """Markdown: milliseconds per forward for each N, one line per (model, context, attention)."""
    queries = curves[0]["queries"]
    lines = [
        "| model | context | attention | " + " | ".join(f"N={q}" for q in queries) + " |",
        "|---|---:|---|" + "---:|" * len(queries),
    ]
    for c in curves:
        ms = " | ".join(f"{1e3 * s:.2f}" for s in c["seconds"])
        lines.append(f"| {c['model']} | {c['context']} | {c['attention']} | {ms} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- replay


def replay_rows(sizes: ModelSizes, curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The speedup the bench replay predicts for each zoo pipeline if its target cost what each
    measured SDPA curve says: the zoo's own acceptance (the recorded greedy continuation) and
    drafters (run for real), the target's forwards timed by the curve; plain decoding is
    one forward of one token per token."""
    from treegraft.bench.config import Pair
    from treegraft.bench.methods import (
        PipelineMethod,
        build_pipelines,
        hf_methods,
        pipeline_plans,
    )
    from treegraft.bench.replay import ReplayDiverged, replay_pipeline
    from treegraft.bench.suites import load_prompts
    from treegraft.bench.sweep import encode_prompt, predicted_run
    from treegraft.core.resources import Resources
    from treegraft.core.runner.latency import LatencyCurve

    config = _replay_config(sizes)
    pair = Pair("zoo:target", "zoo:draft-m")
    res = Resources.create(device=sizes.device, dtype="float32", forward="lean")
    ar = hf_methods(pair, config.settings, res)["ar"]
    methods = build_pipelines(pipeline_plans(config, pair), res)
    prompts = [p for s in sizes.suites for p in load_prompts(s, sizes.prompts_per_suite, Path())]
    cases = []
    for prompt in prompts:
        ids = encode_prompt(res, pair, prompt.text)
        out = ar.run(ids, sizes.max_new_tokens).output_ids
        cases.append((ids, ar.continuation(ids, out, 2 * sizes.largest_tree + 2)))
    rows = []
    for data in (c for c in curves if c["attention"] == "sdpa"):
        curve = monotone(LatencyCurve.from_dict(data))
        for method in methods:
            pipe, target = replay_pipeline(method.pipeline, curve)
            replay = PipelineMethod(method.label, pipe, method.strong)
            ratios, diverged = [], 0
            for ids, continuation in cases:
                target.expect(continuation)
                try:
                    run = predicted_run(replay.run(ids, sizes.max_new_tokens), target)
                except ReplayDiverged:  # an inexact output: no prediction for this prompt
                    diverged += 1
                    continue
                plain = len(run.output_ids) * curve(1)
                ratios.append(plain / run.wall_s)
            rows.append(
                {
                    "model": curve.model,
                    "context": curve.context,
                    "method": method.label,
                    "predicted_speedup": statistics.median(ratios) if ratios else float("nan"),
                    "prompts": len(ratios),
                    "diverged": diverged,
                }
            )
    _release()
    return rows


def monotone(curve: Any) -> Any:
    """The curve with each point raised to the largest before it: a forward of more tokens never
    predicts less time (timing noise on a busy machine can say otherwise)."""
    seconds = tuple(max(curve.seconds[: i + 1]) for i in range(len(curve.seconds)))
    return attrs.evolve(curve, seconds=seconds)


def _replay_config(sizes: ModelSizes) -> Any:
    from treegraft.bench import bench_config_from_dict

    return bench_config_from_dict(
        {
            "pairs": [{"target": "zoo:target", "drafter": "zoo:draft-m"}],
            "max_new_tokens": sizes.max_new_tokens,
            "device": sizes.device,
            "forward": "lean",
            "baselines": [b for b in BASELINES if not b.startswith("hf-")],
            "pipelines": PIPELINES,
        },
        base_dir=Path(tempfile.gettempdir()),
    )


def replay_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: predicted speedup per pipeline (rows) and curve (columns)."""
    columns = list(dict.fromkeys((r["model"], r["context"]) for r in rows))
    cell = {(r["method"], r["model"], r["context"]): r["predicted_speedup"] for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = [
        "| pipeline | " + " | ".join(f"{m} @ {c}" for m, c in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{cell[(m, *col)]:.2f}x" for col in columns) + " |")
    return "\n".join(lines)


def _release() -> None:
    """Free what the last part held (models, caches) before the next one loads."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
