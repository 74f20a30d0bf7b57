"""Resident memory of a generation with a huge `max_new_tokens`: the caches grow as tokens come.

Builds the zoo's `treegraft` pipeline around a target with room for millions of positions (the
zoo target's weights, its config's `max_position_embeddings` raised: RoPE has no position table),
starts a generation with `max_new_tokens=1_000_000` (the most a pipeline accepts), decodes a few steps, and prints the process's
resident memory before and after, beside what caches sized for the whole limit would take.

    python benchmarks/kv_memory.py [--max-new-tokens 1000000] [--steps 5]
"""

from __future__ import annotations

import argparse
import resource
import sys

import torch
import yaml

from treegraft.core.pipeline import load_pipeline, resolve_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner.kv_cache import cache_geometry


def rss_mb() -> float:
    """Current resident set size in MiB (Linux: /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        scale = 2**20 if sys.platform == "darwin" else 2**10
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    resources = Resources.create(device="cpu", dtype="float32")
    for ref in ("zoo:target", "zoo:draft-m"):
        resources.model(ref).config.max_position_embeddings = args.max_new_tokens + 4096
    spec = yaml.safe_load(resolve_pipeline("treegraft").read_text())
    spec.setdefault("decoding", {})["max_new_tokens"] = args.max_new_tokens
    pipe = load_pipeline(spec, resources=resources)
    before = rss_mb()
    steps = pipe.steps("def count_words(path):", max_new_tokens=args.max_new_tokens)
    tokens = sum(len(next(steps).tokens) for _ in range(args.steps))
    after = rss_mb()
    sized = 0
    for ref in ("zoo:target", "zoo:draft-m"):
        n_layers, n_kv, head_dim = cache_geometry(resources.model(ref))
        sized += n_layers * 2 * n_kv * args.max_new_tokens * head_dim * 4 / 2**20
    print(f"max_new_tokens {args.max_new_tokens:,}; {args.steps} steps decoded {tokens} tokens")
    print(
        f"resident memory: {before:.0f} MiB before the generation, {after:.0f} MiB after "
        f"({after - before:+.0f} MiB)"
    )
    print(
        f"target cache capacity now {pipe.decoder.target.capacity:,} slots; caches sized for "
        f"the whole limit would take {sized:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
