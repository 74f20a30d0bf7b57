"""The prepared GPU run: kernels, zoo pipelines, latency curves of real-size targets, replay.

Usage::

    python benchmarks/gpu_check.py                   # CUDA: every part, one JSON + markdown report
    python benchmarks/gpu_check.py --cpu-dry-run     # no CUDA: every part at toy sizes (< 3 min)
    python benchmarks/gpu_check.py --parts curves,replay --out runs/gpu-check   # some parts

Parts (written to ``--out``: ``gpu_check.json`` and ``gpu_check.md``; the pipelines' bench runs
in subfolders):

1. ``kernels``: each Triton kernel against its pure-torch reference (exactness) and timed against
   it (CUDA events, median of ``--repeats``) on trees of 64 and 256 nodes after 1k and 4k cached
   tokens; tree attention also against torch SDPA given a prebuilt dense mask.
2. ``pipelines``: the zoo pipelines (zoo:target with zoo:draft-m: the harness's baselines and the
   shipped pipelines) in float32 and bfloat16, with SDPA and with the tree kernel
   (``decoding.forward`` lean and tree): exactness against plain decoding, tau, tokens/s and its ratio to
   ``ar-runner`` and ``ar``.
3. ``curves``: the latency curve t(N), N = 1..256 tokens per forward, of random-weight
   Llama-3-8B- and Llama-3.2-1B-shaped models in bfloat16 built from configs (no downloads), at
   1k and 4k cached tokens, with SDPA (lean forward) and with the tree kernel.
4. ``replay``: the speedup the bench replay predicts for each zoo pipeline (its recorded
   acceptance and real drafters) if its target cost what each measured SDPA curve says.

The CPU dry run exercises the same code at toy sizes: the kernels in the Triton interpreter, the
pipelines on the CPU, toy-shaped random models. Exit status: 0 when every kernel matched its
reference and every float32 pipeline output equalled plain decoding; 1 otherwise, or when no CUDA
device is available without ``--cpu-dry-run``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F

ATTENTION_TOLERANCE = {torch.float16: 3e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}


@attrs.frozen
class Sizes:
    """Problem sizes of one run."""

    tree_nodes: tuple[int, ...]
    prefixes: tuple[int, ...]
    q_heads: int
    kv_heads: int
    head_dim: int
    layers: int
    repeats: int
    dtype: torch.dtype

    @classmethod
    def for_device(cls, device: str, repeats: int) -> Sizes:
        """A Llama-3-8B-like attention shape on CUDA; a toy shape for the CPU interpreter."""
        if device == "cuda":
            return cls((64, 256), (1024, 4096), 32, 8, 128, 32, repeats, torch.bfloat16)
        return cls((8,), (16,), 2, 1, 16, 2, min(repeats, 2), torch.float32)


@attrs.define
class Row:
    """One line of the result table."""

    op: str
    nodes: int
    prefix: int | None
    check: str
    times_us: dict[str, float] = attrs.field(factory=dict)


def median_time_us(fn: Callable[[], Any], repeats: int, device: str) -> float:
    """Median wall time of ``fn()`` in microseconds (CUDA events on the GPU); synchronises."""
    for _ in range(min(repeats, 5)):
        fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            begin = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - begin) * 1e6)
    return statistics.median(samples)


def random_parents(n: int, device: str, generator: torch.Generator) -> torch.Tensor:
    """A random draft-like tree [n]: each node's parent among the previous 8 nodes."""
    index = torch.arange(1, n)
    low = (index - 8).clamp(min=0)
    offset = (torch.rand(n - 1, generator=generator) * (index - low)).long()
    return torch.cat([torch.tensor([-1]), low + offset]).to(device)


def exact(got: Any, want: Any) -> str:
    """'exact' when every tensor field is equal, else 'MISMATCH'."""
    pairs = zip(_tensors(got), _tensors(want), strict=True)
    return "exact" if all(torch.equal(a.cpu(), b.cpu()) for a, b in pairs) else "MISMATCH"


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [value.path, value.length, value.bonus]


def tree_op_rows(sizes: Sizes, device: str, generator: torch.Generator) -> list[Row]:
    """Check and time the integer tree ops (mask, packed mask, depth, acceptance, prune)."""
    rows = []
    for n in sizes.tree_nodes:
        for op, kwargs in _tree_op_inputs(n, device, generator).items():
            reference, triton = _backends(op)
            row = Row(op, n, None, exact(triton(**kwargs), reference(**kwargs)))
            row.times_us["triton"] = median_time_us(
                partial(triton, **kwargs), sizes.repeats, device
            )
            row.times_us["reference"] = median_time_us(
                partial(reference, **kwargs), sizes.repeats, device
            )
            rows.append(row)
    return rows


def _tree_op_inputs(n: int, device: str, generator: torch.Generator) -> dict[str, dict[str, Any]]:
    """Keyword arguments of each integer tree op on one random ``n``-node tree."""
    from treegraft.kernels.ancestor_mask.reference import tree_depth

    parents = random_parents(n, device, generator)  # [n]
    score = -torch.rand(n, generator=generator).to(device).cumsum(0)  # [n], parents score higher
    target_argmax = torch.randint(0, 3, (n,), generator=generator).to(device)  # [n]
    tree = {"parents": parents}
    return {
        "ancestor_mask": tree,
        "ancestor_mask_packed": tree,
        "tree_depth": tree,
        "greedy_accept": {
            "tokens": _sibling_ranks(parents),
            "parents": parents,
            "target_argmax": target_argmax,
        },
        "prune_to_budget": {
            "parents": parents,
            "score": score,
            "depth": tree_depth(parents),
            "budget": n // 2,
        },
    }


def _backends(op: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(reference, triton) functions of ``op``; imported lazily, after TRITON_INTERPRET is set."""
    package = "ancestor_mask" if op in ("ancestor_mask_packed", "tree_depth") else op
    reference = importlib.import_module(f"treegraft.kernels.{package}.reference")
    triton = importlib.import_module(f"treegraft.kernels.{package}.triton")
    return getattr(reference, op), getattr(triton, op)


def _sibling_ranks(parents: torch.Tensor) -> torch.Tensor:
    """Distinct tokens among siblings: each node's rank among its parent's children. [n]"""
    n = parents.shape[0]
    same_parent = parents[:, None] == parents[None, :]  # [n, n]
    earlier = torch.ones(n, n, dtype=torch.bool, device=parents.device).tril(-1)
    return (same_parent & earlier).sum(dim=1)


def kv_compact_rows(sizes: Sizes, device: str, generator: torch.Generator) -> list[Row]:
    """Check and time KV compaction of an accepted path into a full-size cache."""
    return [
        _kv_compact_row(sizes, device, generator, prefix, n)
        for prefix in sizes.prefixes
        for n in sizes.tree_nodes
    ]


def _kv_compact_row(
    sizes: Sizes, device: str, generator: torch.Generator, prefix: int, n: int
) -> Row:
    from treegraft.kernels.kv_compact import reference as ref
    from treegraft.kernels.kv_compact import triton as tri

    shape = (sizes.layers, 2, sizes.kv_heads, prefix + n, sizes.head_dim)
    want = torch.randn(shape, device=device, dtype=sizes.dtype)  # [L, 2, H, S, D]
    got = want.clone()
    accepted = min(8, n - 1)  # a typical accepted path; the root sits at slot ``prefix``
    src = prefix + 1 + torch.randperm(n - 1, generator=generator)[:accepted].sort().values
    kwargs = {"src": src.to(device), "dst_start": prefix + 1}
    ref.kv_compact(kv=want, **kwargs)
    tri.kv_compact(kv=got, **kwargs)
    row = Row("kv_compact", n, prefix, "exact" if torch.equal(got, want) else "MISMATCH")
    row.times_us["triton"] = median_time_us(
        partial(tri.kv_compact, kv=got, **kwargs), sizes.repeats, device
    )
    row.times_us["reference"] = median_time_us(
        partial(ref.kv_compact, kv=want, **kwargs), sizes.repeats, device
    )
    return row


def attention_rows(sizes: Sizes, device: str, generator: torch.Generator) -> list[Row]:
    """Check tree attention against the float64 reference; time Triton, reference and SDPA."""
    return [
        _attention_row(sizes, device, generator, prefix, n)
        for prefix in sizes.prefixes
        for n in sizes.tree_nodes
    ]


def _attention_row(
    sizes: Sizes, device: str, generator: torch.Generator, prefix: int, n: int
) -> Row:
    from treegraft.kernels.ancestor_mask import reference as mask_ref
    from treegraft.kernels.tree_attention import reference as ref
    from treegraft.kernels.tree_attention import triton as tri

    tree_mask = mask_ref.ancestor_mask(random_parents(n, device, generator))  # [n, n]
    query = torch.randn(1, sizes.q_heads, n, sizes.head_dim, generator=generator)
    key, value = torch.randn(2, 1, sizes.kv_heads, prefix + n, sizes.head_dim, generator=generator)
    query, key, value = (t.to(device, sizes.dtype) for t in (query, key, value))
    kwargs = {
        "query": query,
        "key": key,
        "value": value,
        "prefix_len": prefix,
        "tree_mask": tree_mask,
    }
    exact_inputs = {
        k: v.double() if v.is_floating_point() else v
        for k, v in kwargs.items()
        if torch.is_tensor(v)
    }
    want = ref.tree_attention(**{**kwargs, **exact_inputs})
    error = (tri.tree_attention(**kwargs).double() - want).abs().max().item()
    verdict = "" if error <= ATTENTION_TOLERANCE[sizes.dtype] else " MISMATCH"
    row = Row("tree_attention", n, prefix, f"max err {error:.1e}{verdict}")
    row.times_us["triton"] = median_time_us(
        partial(tri.tree_attention, **kwargs), sizes.repeats, device
    )
    row.times_us["reference"] = median_time_us(
        partial(ref.tree_attention, **kwargs), sizes.repeats, device
    )
    ones = torch.ones(n, prefix, dtype=torch.bool, device=device)
    dense = torch.cat([ones, tree_mask], dim=1)  # [n, prefix + n], built once, outside the timing
    sdpa = partial(
        F.scaled_dot_product_attention, query, key, value, attn_mask=dense, enable_gqa=True
    )
    row.times_us["sdpa dense mask"] = median_time_us(sdpa, sizes.repeats, device)
    return row


def markdown_table(rows: list[Row], header: str) -> str:
    """The result table: one row per (op, tree size, prefix)."""
    lines = [
        header,
        "",
        "| op | tree nodes | prefix | check | triton µs | reference µs | SDPA dense µs | reference / triton |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        t = row.times_us
        sdpa = f"{t['sdpa dense mask']:.1f}" if "sdpa dense mask" in t else "—"
        prefix = "—" if row.prefix is None else str(row.prefix)
        ratio = t["reference"] / t["triton"]
        lines.append(
            f"| {row.op} | {row.nodes} | {prefix} | {row.check} | {t['triton']:.1f} | "
            f"{t['reference']:.1f} | {sdpa} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


PARTS = ("kernels", "pipelines", "curves", "replay")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="without CUDA: run every part at toy sizes (kernels in the Triton interpreter)",
    )
    parser.add_argument(
        "--repeats", type=int, default=50, help="timed runs per kernel measurement (median)"
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check"), help="report folder")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown part(s) {', '.join(unknown)}; expected {', '.join(PARTS)}")
    return args


def kernel_rows(sizes: Sizes, device: str) -> list[Row]:
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # large caches are drawn on the device
    rows = tree_op_rows(sizes, device, generator)
    rows += kv_compact_rows(sizes, device, generator)
    return rows + attention_rows(sizes, device, generator)


def run_parts(args: argparse.Namespace, device: str) -> tuple[dict[str, Any], list[str]]:
    """Every asked-for part: (JSON report, markdown sections)."""
    import gpu_check_models as models

    sizes = models.ModelSizes.for_device(device)
    report: dict[str, Any] = {"device": device_name(device), "parts": args.parts, "seconds": {}}
    md = [f"# treegraft GPU check on {report['device']}"]
    curves: list[dict[str, Any]] = []
    for part in args.parts:
        start = time.perf_counter()
        if part == "kernels":
            ksizes = Sizes.for_device(device, args.repeats)
            rows = kernel_rows(ksizes, device)
            report["kernels"] = [attrs.asdict(r) for r in rows]
            md += ["## Kernels against their references", kernel_table(rows, ksizes)]
        elif part == "pipelines":
            rows = models.pipeline_rows(sizes, args.out)
            report["pipelines"] = rows
            md += ["## Zoo pipelines (zoo:target + zoo:draft-m)", models.pipeline_table(rows)]
        elif part == "curves":
            curves = models.latency_curves(sizes)
            report["curves"] = curves
            md += ["## Latency curves t(N), ms per forward", models.curve_table(curves)]
        elif part == "replay":
            curves = curves or models.latency_curves(sizes)
            rows = models.replay_rows(sizes, curves)
            report["replay"] = rows
            md += ["## Speedup the replay predicts on those curves", models.replay_table(rows)]
        report["seconds"][part] = time.perf_counter() - start
    md.append(
        "Seconds per part: " + ", ".join(f"{p} {s:.0f}" for p, s in report["seconds"].items())
    )
    return report, md


def kernel_table(rows: list[Row], sizes: Sizes) -> str:
    dtype = str(sizes.dtype).removeprefix("torch.")
    header = (
        f"{dtype}, attention {sizes.q_heads}/{sizes.kv_heads} heads, head_dim {sizes.head_dim}, "
        f"median of {sizes.repeats}"
    )
    return markdown_table(rows, header)


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "CPU (dry run: toy sizes, kernels in the Triton interpreter)"


def failures(report: dict[str, Any]) -> list[str]:
    """What makes the run fail: kernel mismatches and inexact float32 pipelines."""
    bad = [
        f"kernel {k['op']} ({k['nodes']} nodes, prefix {k['prefix']})"
        for k in report.get("kernels", [])
        if "MISMATCH" in k["check"]
    ]
    bad += [
        f"pipeline {r['method']} ({r['attention']}): {r['exact_rate']:.0%} exact"
        for r in report.get("pipelines", [])
        if r["dtype"] == "float32" and r["exact_rate"] < 1.0
    ]
    return bad


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.cpu_dry_run:
        print(
            "gpu_check: no CUDA device found; nothing was checked. On a GPU machine run this "
            "script again, or pass --cpu-dry-run to exercise every part at toy sizes on the CPU."
        )
        return 1
    if device == "cpu" and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check_models
    args.out.mkdir(parents=True, exist_ok=True)
    report, md = run_parts(args, device)
    bad = failures(report)
    report["failures"] = bad
    md.append("**Failures:** " + ("; ".join(bad) if bad else "none"))
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = "\n\n".join(md) + "\n"
    (args.out / "gpu_check.md").write_text(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
