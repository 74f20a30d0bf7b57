"""Seeded synthetic task data: word problems, instructions, stdlib questions and two-turn chats.

Every generator takes a :class:`random.Random` and returns a :class:`TaskItem` whose ``key``
names the item for the held-out split (see :mod:`treegraft.zoo.split`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import attrs

from treegraft.zoo.sources import Function

NAMES = (
    "Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira",
    "Liam", "Maya", "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor",
    "Wen", "Yusuf", "Zoe",
)  # fmt: skip
ITEMS = (
    ("apples", "basket", "baskets"), ("books", "shelf", "shelves"), ("marbles", "jar", "jars"),
    ("stickers", "album", "albums"), ("cookies", "box", "boxes"), ("pencils", "case", "cases"),
    ("shells", "bucket", "buckets"), ("cards", "deck", "decks"), ("eggs", "carton", "cartons"),
    ("coins", "purse", "purses"), ("plants", "tray", "trays"), ("bottles", "crate", "crates"),
)  # fmt: skip
WORDS = (
    "river", "garden", "lantern", "pepper", "window", "orbit", "castle", "meadow", "copper",
    "violet", "harbor", "tiger", "pillow", "candle", "forest", "puzzle", "rocket", "silver",
    "thunder", "velvet", "walnut", "zebra", "anchor", "bridge", "cactus", "dragon", "ember",
    "falcon", "glacier", "island", "jungle", "kettle", "lemon", "marble", "needle", "oyster",
    "parrot", "quartz", "saddle", "tunnel", "umbrella", "valley", "wizard", "yellow",
)  # fmt: skip
UNITS = (
    ("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("kilograms", "grams", 1000), ("liters", "milliliters", 1000),
    ("days", "hours", 24), ("weeks", "days", 7),
)  # fmt: skip
ORDINALS = ("first", "second", "third")


@attrs.frozen
class TaskItem:
    """One synthetic example: split key, the chat turns (user/assistant alternating) and answer.

    ``source`` names the unit the example derives from: a source file or page for examples
    built from one, else the key itself.
    """

    key: str
    turns: tuple[str, ...]
    answer: str
    source: str = attrs.field()

    @source.default
    def _source_default(self) -> str:
        return self.key


# ---------------------------------------------------------------- word problems (gsm8k-style)


def word_problem(rng: random.Random) -> TaskItem:
    """A multi-step arithmetic word problem with a step-by-step solution and an answer line."""
    name, other = rng.sample(NAMES, 2)
    thing, box, boxes_word = rng.choice(ITEMS)
    boxes, per_box = rng.randint(2, 9), rng.randint(3, 15)
    extra, given = rng.randint(1, 30), rng.randint(1, 10)
    total = boxes * per_box + extra
    kind = rng.randrange(3)
    text = (
        f"{name} has {boxes} {boxes_word} with {per_box} {thing} in each {box}, "
        f"and {extra} more {thing} on the table."
    )
    steps = [
        f"{name} has {boxes} * {per_box} = {boxes * per_box} {thing} in the {boxes_word}.",
        f"Adding the {extra} on the table gives {boxes * per_box} + {extra} = {total} {thing}.",
    ]
    if kind == 0:
        text += f" {name} gives {given} {thing} to {other}. How many {thing} does {name} have left?"
        answer = total - given
        steps.append(f"After giving {given} to {other}, {name} has {total} - {given} = {answer}.")
    elif kind == 1:
        price = rng.randint(2, 9)
        text += f" Each of the {thing} sells for ${price}. How much money does {name} get for all of them?"
        answer = total * price
        steps.append(
            f"Selling {total} {thing} at ${price} each gives {total} * {price} = ${answer}."
        )
    else:
        friends = rng.randint(2, 6)
        total -= total % friends
        steps[-1] = f"Without the spare ones that is {total} {thing}."
        text = (
            f"{name} has {boxes} {boxes_word} with {per_box} {thing} in each {box}. "
            f"{name} shares {total} of them equally among {friends} friends. "
            f"How many {thing} does each friend get?"
        )
        steps = [f"{name} shares {total} {thing} among {friends} friends."]
        answer = total // friends
        steps.append(f"Each friend gets {total} / {friends} = {answer} {thing}.")
    solution = "Let's solve this step by step.\n" + "\n".join(steps) + f"\nAnswer: {answer}"
    return TaskItem(key=f"gsm:{text}", turns=(text,), answer=solution)


# ---------------------------------------------------------------- instructions (alpaca-style)

_FUNCTION_TASKS: tuple[tuple[str, str, str], ...] = (
    ("returns the sum of the squares of a list of numbers", "sum_of_squares", "    return sum(x * x for x in {a})"),
    ("returns the largest element of a list", "largest", "    return max({a})"),
    ("counts how many times a value occurs in a list", "count_value", "    return sum(1 for x in {a} if x == value)"),
    ("reverses a string", "reverse_text", "    return {a}[::-1]"),
    ("returns True if a number is even", "is_even", "    return {a} % 2 == 0"),
    ("removes duplicates from a list while keeping the order", "unique", "    seen = set()\n    out = []\n    for x in {a}:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out"),
    ("returns the average of a list of numbers", "average", "    if not {a}:\n        return 0.0\n    return sum({a}) / len({a})"),
    ("joins a list of words with spaces", "join_words", "    return \" \".join({a})"),
    ("returns the factorial of n", "factorial", "    result = 1\n    for i in range(2, {a} + 1):\n        result *= i\n    return result"),
    ("checks whether a string is a palindrome", "is_palindrome", "    cleaned = {a}.lower()\n    return cleaned == cleaned[::-1]"),
    ("counts the vowels in a string", "count_vowels", "    return sum(1 for ch in {a}.lower() if ch in \"aeiou\")"),
    ("returns the n-th Fibonacci number", "fibonacci", "    a, b = 0, 1\n    for _ in range({a}):\n        a, b = b, a + b\n    return a"),
)  # fmt: skip
_ARG_NAMES = ("items", "values", "data", "xs", "seq", "text", "n")


def instruction(rng: random.Random, module_docs: Sequence[tuple[str, str, str]]) -> TaskItem:
    """One instruction with a deterministic correct response (several instruction kinds)."""
    makers: list[Callable[[random.Random], tuple[str, ...]]] = [
        _sort_words,
        _convert_units,
        _reverse_word,
        _count_letters,
        _write_function,
        _list_primes,
    ]
    if module_docs:
        makers.append(lambda r: _explain_module(r, module_docs))
    turn, answer, *source = rng.choice(makers)(rng)
    key = f"alpaca:{turn}"
    return TaskItem(key=key, turns=(turn,), answer=answer, source=source[0] if source else key)


def _sort_words(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(WORDS, rng.randint(4, 7))
    return (
        f"Sort the following words alphabetically: {', '.join(words)}.",
        f"Here are the words in alphabetical order: {', '.join(sorted(words))}.",
    )


def _convert_units(rng: random.Random) -> tuple[str, str]:
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 250)
    return (
        f"Convert {n} {big} to {small}.",
        f"One of the {big} is {factor} {small}, so {n} {big} is {n} * {factor} = {n * factor} {small}.",
    )


def _reverse_word(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(WORDS) + rng.choice(WORDS)
    return (f"Reverse the string '{word}'.", f"The reversed string is '{word[::-1]}'.")


def _count_letters(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(WORDS) + rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)))
    n = word.count(letter)
    times = "time" if n == 1 else "times"
    return (
        f"How many times does the letter '{letter}' appear in '{word}'?",
        f"The letter '{letter}' appears {n} {times} in '{word}'.",
    )


def _write_function(rng: random.Random) -> tuple[str, str]:
    task, name, body = rng.choice(_FUNCTION_TASKS)
    arg = (
        "n"
        if "{a} +" in body or "range({a})" in body or "% 2" in body
        else rng.choice(_ARG_NAMES[:-1])
    )
    extra = ", value" if "value" in body else ""
    code = (
        f'def {name}({arg}{extra}):\n    """{task[0].upper()}{task[1:]}."""\n{body.format(a=arg)}'
    )
    return (
        f"Write a Python function that {task}.",
        f"Here is a function that {task}:\n\n```python\n{code}\n```",
    )


def _list_primes(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(3, 12)
    primes = [p for p in range(2, 200) if all(p % d for d in range(2, int(p**0.5) + 1))][:k]
    return (
        f"List the first {k} prime numbers.",
        f"The first {k} prime numbers are {', '.join(map(str, primes))}.",
    )


def _explain_module(
    rng: random.Random, module_docs: Sequence[tuple[str, str, str]]
) -> tuple[str, str, str]:
    module, doc, source = rng.choice(module_docs)
    return (
        f"Explain what the Python module `{module}` is for.",
        f"The `{module}` module: {doc}",
        source,
    )


# ---------------------------------------------------------------- stdlib questions (qa)


def stdlib_question(rng: random.Random, fns: Sequence[Function]) -> TaskItem:
    """A short factual question about a standard-library function, answered from its source."""
    fn = rng.choice(fns)
    ref = f"{fn.module}.{fn.name}"
    kind = rng.randrange(3) if fn.summary else rng.randrange(1, 3)
    if kind == 0:
        turn, answer = f"What does `{ref}` do?", fn.summary
    elif kind == 1:
        turn, answer = (
            f"Which module defines the function `{fn.name}`?",
            f"`{fn.name}` is defined in the `{fn.module}` module.",
        )
    else:
        turn, answer = f"What parameters does `{ref}` take?", _describe_params(ref, fn.params)
    return TaskItem(
        key=f"qa:{fn.module}:{fn.name}:{kind}", turns=(turn,), answer=answer, source=fn.source
    )


def _describe_params(ref: str, params: tuple[str, ...]) -> str:
    """A sentence naming the positional parameters of ``ref``."""
    if not params:
        return f"`{ref}` takes no positional parameters."
    names = ", ".join(f"`{p}`" for p in params)
    noun = "parameter" if len(params) == 1 else "parameters"
    return f"`{ref}` takes the {noun} {names}."


# ---------------------------------------------------------------- two-turn chats (mt_bench)


def two_turn_chat(rng: random.Random, fns: Sequence[Function]) -> TaskItem:
    """A two-turn exchange whose second user turn builds on the first answer."""
    kind = rng.randrange(3) if fns else rng.randrange(2)
    source = None
    if kind == 0:
        a, b, k = rng.randint(2, 60), rng.randint(2, 60), rng.randint(2, 9)
        turns = (
            f"What is {a} + {b}?",
            f"{a} + {b} = {a + b}.",
            f"Now multiply that result by {k}.",
        )
        answer = f"{a + b} * {k} = {(a + b) * k}."
    elif kind == 1:
        words = rng.sample(WORDS, rng.randint(4, 6))
        turns = (
            f"Sort these words alphabetically: {', '.join(words)}.",
            f"{', '.join(sorted(words))}.",
            "Now list them in reverse alphabetical order and say how many there are.",
        )
        answer = f"{', '.join(sorted(words, reverse=True))}. There are {len(words)} words."
    else:
        fn = rng.choice(fns)
        turns = (
            f"Which module defines the function `{fn.name}`?",
            f"`{fn.name}` is defined in the `{fn.module}` module.",
            "Show me its signature and docstring.",
        )
        answer = f"```python\n{fn.prompt.rstrip()}\n```"
        source = fn.source
    key = f"mt:{turns[0]}:{turns[2]}"
    return TaskItem(key=key, turns=turns, answer=answer, source=source or key)
