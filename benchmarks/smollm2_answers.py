"""How well SmolLM2-135M-Instruct answers the zoo's gsm8k and humaneval prompts, for the record.

The target of `benchmarks/real.yaml` is a real model, and its speed-ups are measured on what it
actually writes; this script says how good that writing is. Each prompt goes through SmolLM2's
chat template (as `chat: true` in a sweep) and is decoded greedily by the shipped
`smollm2-ngram` pipeline, whose output is plain greedy decoding's (checked against HF `generate`
on the first prompt of each suite):

- gsm8k: the answer is the last number of the output; it is correct when it equals the number
  after `Answer:` in the suite's reference;
- humaneval: the completion parses when the first fenced code block of the output (or the whole
  output without one) parses as Python with `ast.parse`, and the prompt's function signature
  followed by the output parses when the model continued the body instead.

Prints one line per prompt and the two fractions. Run from the repository root (SmolLM2 is
fetched and cached at first use, docs/real-models.md):

    python benchmarks/smollm2_answers.py --prompts 10 --max-new-tokens 256
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import time
from pathlib import Path

import torch

from treegraft.bench.suites import load_prompts
from treegraft.core.chat import chat_ids
from treegraft.core.pipeline import load_pipeline

SUITES = Path(__file__).resolve().parent.parent / "src" / "treegraft" / "zoo" / "suites"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def last_number(text: str) -> str | None:
    """The last number in `text`, without thousands separators or a trailing `.0`."""
    found = NUMBER.findall(text)
    if not found:
        return None
    value = found[-1].replace(",", "")
    return value[:-2] if value.endswith(".0") else value


def reference_answers(suite: str) -> dict[str, str]:
    """Prompt id -> the number after `Answer:` in the suite's reference."""
    out = {}
    for line in (SUITES / f"{suite}.jsonl").read_text().splitlines():
        record = json.loads(line)
        match = re.search(r"Answer:\s*(-?[\d,.]+)", record.get("reference", ""))
        if match:
            out[record["id"]] = match.group(1).replace(",", "").rstrip(".")
    return out


def parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def code_parses(prompt: str, output: str) -> bool:
    """Whether the output's code parses: its first fenced block (or the whole output), or the
    prompt followed by the output (a continued function body)."""
    fenced = FENCE.search(output)
    code = fenced.group(1) if fenced else output
    return parses(code) or parses(prompt + output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=10, help="prompts per suite")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    pipe = load_pipeline("smollm2-ngram")
    model = pipe.resources.model("zoo:smollm2")
    tokenizer = pipe.resources.load_tokenizer("zoo:smollm2")
    answers = reference_answers("gsm8k")
    results: dict[str, list[bool]] = {"gsm8k": [], "humaneval": []}
    start = time.perf_counter()
    for suite in results:
        for i, prompt in enumerate(load_prompts(suite, args.prompts, SUITES)):
            ids = torch.tensor(chat_ids(tokenizer, prompt.text), dtype=torch.long)
            out = pipe.generate(ids, max_new_tokens=args.max_new_tokens)
            if i == 0:
                with torch.inference_mode():
                    ref = model.generate(
                        ids[None],
                        attention_mask=torch.ones_like(ids[None]),
                        max_new_tokens=args.max_new_tokens,
                        do_sample=False,
                    )[0, ids.numel() :].tolist()
                if list(out.token_ids) != ref:  # batch 1: no padding
                    raise SystemExit(f"{prompt.id}: the pipeline's tokens differ from generate's")
            text = pipe.text_of(out.token_ids)
            if suite == "gsm8k":
                got, want = last_number(text), answers.get(prompt.id)
                ok = got is not None and want is not None and float(got) == float(want)
                detail = f"answer {got} (reference {want}; ends {text[-60:]!r})"
            else:
                ok = code_parses(prompt.text, text)
                detail = "parses" if ok else "does not parse"
            results[suite].append(ok)
            print(f"{prompt.id}: {detail}, {len(out.token_ids)} tokens, {out.finish_reason}")
    for suite, oks in results.items():
        what = "correct" if suite == "gsm8k" else "parse"
        print(f"{suite}: {sum(oks)}/{len(oks)} {what}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
