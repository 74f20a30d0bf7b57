"""SmolLM2 through the shipped `smollm2-ngram` pipeline against its own HF `generate`.

Three chat prompts (through the chat template), at most 96 new tokens each: asserts the pipeline's
tokens equal greedy `generate`'s, then prints both throughputs (tokens over wall time, summed over
the prompts, measured back to back) and their ratio. Run from the repository root:

    OMP_NUM_THREADS=1 python benchmarks/smollm2_generate_check.py
"""

from __future__ import annotations

import time

import torch

from treegraft.core.pipeline import load_pipeline

MAX_NEW = 96
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France? Answer in one sentence, then list three facts about it.",
    "Summarize: The quick brown fox jumps over the lazy dog. The dog did not move. "
    "The fox ran away into the forest.",
)


def main() -> None:
    torch.set_num_threads(1)
    pipe = load_pipeline("smollm2-ngram")
    model = pipe.resources.model("zoo:smollm2")
    pipe.prepare(pipe.encode(PROMPTS[0]))
    hf_s = pipe_s = 0.0
    hf_n = pipe_n = 0
    for text in PROMPTS:
        ids = pipe.encode(text)
        start = time.perf_counter()
        with torch.inference_mode():
            ref = model.generate(
                ids[None],
                attention_mask=torch.ones_like(ids[None]),
                max_new_tokens=MAX_NEW,
                do_sample=False,
            )[0, ids.numel() :].tolist()
        hf_s += time.perf_counter() - start
        start = time.perf_counter()
        got = list(pipe.generate(ids, max_new_tokens=MAX_NEW).token_ids)
        pipe_s += time.perf_counter() - start
        if got != ref:
            raise SystemExit(f"{text!r}: the pipeline's tokens differ from generate's")
        hf_n, pipe_n = hf_n + len(ref), pipe_n + len(got)
        print(f"equal ({len(got)} tokens): {pipe.text_of(got)[:60]!r}")
    hf, tg = hf_n / hf_s, pipe_n / pipe_s
    print(f"HF generate {hf:.1f} tokens/s, smollm2-ngram {tg:.1f} tokens/s, ratio {tg / hf:.2f}")


if __name__ == "__main__":
    main()
