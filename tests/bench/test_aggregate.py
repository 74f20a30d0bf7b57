"""Aggregation arithmetic on a hand-computed example."""

from __future__ import annotations

import attrs
import pytest

from treegraft.bench.aggregate import (
    ALL,
    aggregate,
    ar_index,
    plain_baselines,
    speedup_of,
)
from treegraft.bench.records import (
    MEASURED,
    Mismatch,
    Request,
    request_from_json,
    request_to_json,
)
from treegraft.bench.report import baseline_section, markdown_report, standing_table, warnings
from treegraft.bench.summary import summary_data, terminal_rows
from treegraft.core.errors import ArgumentError


def req(
    method: str, prompt: str, wall: float, new: int = 10, *, suite="s", repeat=0, **kw
) -> Request:
    values = {
        "pair": "p",
        "suite": suite,
        "prompt_id": prompt,
        "method": method,
        "mode": MEASURED,
        "repeat": repeat,
        "prompt_tokens": 5,
        "new_tokens": new,
        "wall_s": wall,
        "steps": new,
        "committed": new,
        "split": {"target": wall, "strong": 0.0, "weak": 0.0, "framework": 0.0},
        "peak_mem_mib": 100.0,
        "output_ids": tuple(range(new)),
        **kw,
    }
    return Request(**values)


def example(repeat: int = 0, scale: float = 1.0) -> list[Request]:
    """Plain decoding at 10 and 5 tokens/s; the method at 20 and 4 tokens/s (x `scale`)."""
    return [
        req("ar", "a", 1.0, repeat=repeat),
        req("ar", "b", 2.0, repeat=repeat),
        req(
            "m",
            "a",
            0.5 / scale,
            repeat=repeat,
            steps=5,
            committed=12,
            accept_lengths=(3, 1, 4, 2, 2),
            strong_calls=(1, 1, 0, 0, 1),
            split={"target": 0.2, "strong": 0.1, "weak": 0.1, "framework": 0.1},
            peak_mem_mib=120.0,
        ),
        req(
            "m",
            "b",
            2.5 / scale,
            repeat=repeat,
            steps=7,
            committed=14,
            accept_lengths=(2,) * 7,
            strong_calls=(1,) * 7,
            split={"target": 1.0, "strong": 0.5, "weak": 0.5, "framework": 0.5},
            peak_mem_mib=150.0,
            exact=False,
            mismatch=Mismatch(position=3, expected=1, got=2, margin=0.01),
        ),
    ]


def row(rows, method, pair=ALL, suite=ALL):
    (found,) = [r for r in rows if (r.method, r.pair, r.suite) == (method, pair, suite)]
    return found


def test_hand_computed_example():
    m = row(aggregate(example()), "m")
    assert m.requests == 2 and m.new_tokens == 20
    assert m.tokens_per_s == pytest.approx(12.0)  # median of 20 and 4
    assert m.speedup == pytest.approx((2.0 * 0.8) ** 0.5)  # geometric mean of 20/10 and 4/5
    assert m.speedup_median == pytest.approx(12.0 / 7.5)  # ratio of medians: 12 / median(10, 5)
    assert m.prompts == 2
    assert set(m.intervals) == {"speedup", "speedup_median", "tau"}
    assert m.intervals["speedup"].lo == pytest.approx(0.8)  # two prompts: resamples span both
    assert m.intervals["speedup"].hi == pytest.approx(2.0)
    assert m.speedup_mean == pytest.approx((2.0 + 0.8) / 2)  # mean of 20/10 and 4/5
    assert m.tau == pytest.approx(26 / 12)  # committed / target forwards, pooled
    # accepted drafts per step: 2 0 3 1 1 | 1 1 1 1 1 1 1 -> >=1: 11, >=2: 2, >=3: 1 of 12
    assert m.acceptance == pytest.approx((11 / 12, 2 / 12, 1 / 12))
    assert m.strong_calls_per_step == pytest.approx(10 / 12)
    assert m.split == pytest.approx(
        {"target": 0.4, "strong": 0.2, "weak": 0.2, "framework": 0.2}
    )  # 1.2 / 3.0 s, 0.6 / 3.0 s, ...
    assert m.peak_mem_mib == 150.0
    assert m.exact_rate == 0.5
    ar = row(aggregate(example()), "ar")
    assert (ar.speedup, ar.speedup_mean, ar.tau, ar.strong_calls_per_step) == (1.0, 1.0, 1.0, None)
    assert (ar.intervals["speedup"].lo, ar.intervals["speedup"].hi) == (1.0, 1.0)


def test_the_baseline_is_a_parameter():
    reqs = [*example(), req("fast-ar", "a", 0.5), req("fast-ar", "b", 1.0)]  # 2x plain decoding
    rows = aggregate(reqs, baseline="fast-ar")
    assert row(rows, "fast-ar").speedup == 1.0
    assert row(rows, "ar").speedup == pytest.approx(0.5)
    assert row(rows, "m").speedup == pytest.approx((1.0 * 0.4) ** 0.5)


def test_per_prompt_speedup():
    reqs = example()
    index = ar_index(reqs)
    assert [speedup_of(r, index) for r in reqs] == pytest.approx([1.0, 1.0, 2.0, 0.8])


def test_repeats_give_mean_and_spread():
    rows = aggregate(example(0, 1.0) + example(1, 2.0))  # the method twice as fast the 2nd time
    m = row(rows, "m")
    assert m.requests == 4
    assert m.speedup_median == pytest.approx((1.6 + 3.2) / 2)
    assert m.spread["speedup_median"] == pytest.approx(((1.6 - 2.4) ** 2 * 2) ** 0.5)  # sample std
    # pooled: per prompt the geometric mean over repetitions, then over prompts
    assert m.speedup == pytest.approx(((2.0 * 4.0) ** 0.5 * (0.8 * 1.6) ** 0.5) ** 0.5)
    assert m.prompts == 2
    assert m.spread["tau"] == 0.0
    assert m.tau == pytest.approx(26 / 12)


def test_groups_per_pair_suite_and_overall():
    a = example()
    b = [req(r.method, r.prompt_id, r.wall_s, suite="t") for r in example()[:2]]
    b += [req("m", "a", 1.0, suite="t"), req("m", "b", 1.0, suite="t")]  # 10 tok/s each
    rows = aggregate(a + b)
    assert {(r.pair, r.suite) for r in rows} == {
        (x, y) for x in ("p", ALL) for y in ("s", "t", ALL)
    }
    assert row(rows, "m", "p", "t").speedup_median == pytest.approx(10 / 7.5)
    # overall: method tokens/s 20, 4, 10, 10 -> median 10; ar 10, 5, 10, 5 -> median 7.5
    assert row(rows, "m").speedup_median == pytest.approx(10 / 7.5)
    # the geometric mean over all prompts lies between the suites' (1.0 * 2.0 = 2 ** 0.5)
    assert row(rows, "m", "p", "t").speedup == pytest.approx(2**0.5)
    assert row(rows, "m").speedup == pytest.approx((2.0 * 0.8 * 1.0 * 2.0) ** 0.25)
    # the overall interval resamples within each suite: both suites always present
    assert row(rows, "m").prompts == 4
    assert row(rows, "m").speedup_mean == pytest.approx((2.0 + 0.8 + 1.0 + 2.0) / 4)


def test_requests_without_plain_decoding_or_with_errors_are_left_out():
    reqs = [*example(), req("m", "zzz", 1.0), req("m", "a", 1.0, mode="replay", error="diverged")]
    rows = aggregate(reqs)
    assert row(rows, "m").requests == 2
    assert [r for r in rows if r.mode == "replay"] == []


@pytest.mark.parametrize(
    ("changed", "shown"),
    [
        ({"new": 0}, "new_tokens 0 in wall_s 0.5"),
        ({"wall": float("nan")}, "new_tokens 10 in wall_s nan"),
        ({"wall": float("inf")}, "new_tokens 10 in wall_s inf"),
        ({"wall": 0.0}, "new_tokens 10 in wall_s 0.0"),
    ],
)
def test_a_request_without_tokens_per_second_is_refused_naming_it(changed, shown):
    """A hand-built record of no token or a NaN, infinite or zero wall time made its rows'
    speedups 0.00 (the ratio of a zero tokens/s) as if measured."""
    args = {"wall": 0.5, **changed}
    bad = req("m", "a", args["wall"], args.get("new", 10))
    with pytest.raises(ArgumentError) as info:
        aggregate([*example()[:2], bad, example()[3]])
    assert str(info.value) == (
        "aggregate: the request of pair 'p', suite 's', prompt 'a', method 'm' (measured), "
        f"repetition 0 has {shown}: no tokens/s to take a speedup of (expected new_tokens >= 1 "
        "and a finite wall_s > 0)"
    )


def with_runner(reqs: list[Request], wall: dict[str, float], pair: str = "p") -> list[Request]:
    """`reqs` plus an `ar-runner` request per prompt of `wall` (seconds for 10 tokens)."""
    return reqs + [req("ar-runner", prompt, w, pair=pair) for prompt, w in wall.items()]


def test_speedups_are_against_the_faster_plain_decoding_of_each_pair():
    # ar-runner at 20 and 10 tokens/s: twice `ar`; the method's speedups halve
    reqs = with_runner(example(), {"a": 0.5, "b": 1.0})
    assert plain_baselines(reqs) == {"p": "ar-runner"}
    rows = aggregate(reqs)
    m, ar, runner = row(rows, "m"), row(rows, "ar"), row(rows, "ar-runner")
    assert m.speedup_median == pytest.approx(12.0 / 15.0)
    assert m.speedup == pytest.approx((1.0 * 0.4) ** 0.5)  # per-prompt ratios 1.0 and 0.4
    assert m.speedup_mean == pytest.approx((1.0 + 0.4) / 2)
    assert (runner.speedup, ar.speedup) == (1.0, pytest.approx(0.5))
    assert {r.baseline for r in rows} == {"ar-runner"}
    # a slower ar-runner leaves `ar` the baseline
    slow = with_runner(example(), {"a": 2.0, "b": 4.0})
    assert plain_baselines(slow) == {"p": "ar"}
    assert row(aggregate(slow), "m").speedup_median == pytest.approx(12.0 / 7.5)


def test_each_pair_gets_its_own_baseline_and_the_report_names_them():
    other = [attrs.evolve(r, pair="q") for r in example()]
    reqs = with_runner(example(), {"a": 0.5, "b": 1.0}) + other
    assert plain_baselines(reqs) == {"p": "ar-runner", "q": "ar"}
    rows = aggregate(reqs)
    assert row(rows, "m", pair="q").baseline == "ar"
    assert row(rows, "m").baseline == "ar-runner/ar"
    text = baseline_section(reqs)
    assert "- p: **`ar-runner`** (median tokens/s: `ar` 7.5 vs `ar-runner` 15.0)" in text
    assert "- q: **`ar`** (median tokens/s: `ar` 7.5)" in text
    assert "## Baseline" in markdown_report(rows, reqs, "header")


def test_json_round_trip():
    r = example()[3]
    data = request_to_json(r, speedup=0.8)
    assert data["tau"] == pytest.approx(2.0) and data["speedup"] == 0.8
    assert request_from_json(data) == r


def cell_requests(pair: str, suite: str, **tps: float) -> list[Request]:
    """One prompt of one pair x suite cell: plain decoding at 10 tokens/s, each method at `tps`."""
    speeds = {"ar": 10.0, **tps}
    return [
        req(m.replace("_", "-"), "q", 10 / v, pair=pair, suite=suite) for m, v in speeds.items()
    ]


def test_standing_is_the_per_prompt_ratio_to_the_better_endpoint_and_hf_assisted():
    requests = [
        # pair a, suite s1: better endpoint ngram-only (100); pair a, s2: lm-only (60)
        *cell_requests("a", "s1", ngram_only=100, lm_only=80, hf_assisted=40, x=120),
        *cell_requests("a", "s2", ngram_only=50, lm_only=60, hf_assisted=50, x=66),
        # pair b: one suite, the method below its better endpoint
        *cell_requests("b", "s1", ngram_only=90, lm_only=30, hf_assisted=45, x=81),
    ]
    table = standing_table(aggregate(requests), requests)
    line = next(r for r in table.splitlines() if r.startswith("| x |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # per prompt: 120/100 = 1.2, 66/60 = 1.1, 81/90 = 0.9; vs HF: 3.0, 1.32, 1.8; one prompt
    # per cell, so the stratified bootstrap never changes the value: point intervals
    end, hf, a = (1.2 * 1.1 * 0.9) ** (1 / 3), (3.0 * 1.32 * 1.8) ** (1 / 3), (1.2 * 1.1) ** 0.5
    assert cells == [
        "x",
        f"{end:.3f}x [{end:.3f}, {end:.3f}]",
        f"{hf:.3f}x [{hf:.3f}, {hf:.3f}]",
        f"{a:.3f}x [{a:.3f}, {a:.3f}]",
        "0.900x [0.900, 0.900]",
    ]
    assert "vs better endpoint, a" in table and "vs better endpoint, b" in table
    (standing,) = summary_data(aggregate(requests), requests)["standing"]
    assert standing["method"] == "x" and standing["vs_better_endpoint"]["prompts"] == 3
    assert standing["vs_better_endpoint"]["value"] == pytest.approx(end)
    assert standing["vs_hf_assisted"]["interval"] == pytest.approx([hf, hf])
    assert standing["vs_better_endpoint_per_pair"]["b"]["value"] == pytest.approx(0.9)
    assert not any(
        r.startswith(("| ngram-only", "| lm-only", "| hf-assisted")) for r in table.splitlines()
    )


def test_no_standing_without_endpoints_or_hf_assisted():
    requests = cell_requests("a", "s1", x=10, y=20)
    assert standing_table(aggregate(requests), requests) is None


def test_warnings_small_sample_interval_crossing_one_and_unseparated_leaders():
    rows = aggregate(example())  # two prompts; m: 2.0 and 0.8, interval [0.8, 2.0]
    found = warnings(rows)
    assert any(w.startswith("Only 2 prompt(s) per method") for w in found)
    assert any("includes 1.0" in w and "m [0.80, 2.00]" in w for w in found)
    assert "**Warning:** Only 2 prompt(s)" in markdown_report(rows, example(), "header")


@pytest.mark.parametrize("plain", ["ar", "ar-runner"])
def test_no_warning_for_a_clear_result_on_enough_prompts(plain):
    """Whichever plain decoding is the baseline, its own row (speedup 1.0 exactly) warns about
    nothing; the other plain decoding is a method like any other."""
    prompts = [f"q{i}" for i in range(12)]
    requests = [req(plain, q, 1.0) for q in prompts]
    requests += [req("fast", q, 0.5 - 0.01 * i) for i, q in enumerate(prompts)]  # ~2x
    requests += [req("slow", q, 0.9 - 0.01 * i) for i, q in enumerate(prompts)]  # ~1.15x
    rows = aggregate(requests)
    assert {r.baseline for r in rows} == {plain}
    assert warnings(rows) == []


def test_the_terminal_leaves_out_the_baseline_whichever_plain_decoding_it_is():
    """With `ar-runner` the faster, the terminal listed it at 1.00 [1.00, 1.00] and left `ar`
    out."""
    requests = [
        r
        for q, wall in (("a", 1.0), ("b", 2.0))
        for r in (req("ar", q, wall), req("ar-runner", q, wall / 2), req("m", q, wall / 3))
    ]
    assert [row[0] for row in terminal_rows(aggregate(requests))] == ["m", "ar"]
