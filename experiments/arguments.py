"""argparse types for the options of the studies, the sweep and bench-ci (numbers, and
comma-separated lists): a bad value is an argparse error that names the option and the item
(before anything is measured), never a traceback from a study's main() or an option that silently
selects nothing."""
from __future__ import annotations

import argparse
import math


def count(text: str) -> int:
    """'3' -> 3: a whole number of at least 1 (rounds, passes, trees, a hidden size, seconds)."""
    try:
        n = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return n


def _number(text: str) -> float:
    try:
        x = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return x


def positive(text: str) -> float:
    """'1.5' -> 1.5: a finite number above 0 (a time limit in seconds)."""
    x = _number(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return x


def at_least_zero(text: str) -> float:
    """'0' -> 0.0: a finite number of at least 0 (a budget where 0 means none)."""
    x = _number(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0")
    return x


def counts(text: str) -> list[int]:
    """'1,2' -> [1, 2]: whole numbers of at least 1 (thread counts, hidden sizes, cell numbers)."""
    out = [count(item) for item in filter(None, (t.strip() for t in str(text).split(",")))]
    if not out:
        raise argparse.ArgumentTypeError("give at least one number")
    return out


def items(text: str) -> list[str]:
    """'a, b,' -> ['a', 'b']."""
    return [t.strip() for t in str(text).split(",") if t.strip()]


def not_in_experiment(exp, systems, panels) -> str | None:
    """What of `systems` and `panels` the experiment `exp` lacks, as a message (None: nothing):
    a sweep given one of them would run none of its cells."""
    for what, wanted, known in (("system", systems, exp.systems), ("panel", panels, [p.id for p in exp.panels])):
        unknown = [w for w in wanted or () if w not in known]
        if unknown:
            return f"unknown {what} {', '.join(unknown)}; this experiment has: {', '.join(known)}"
    return None


def names(*allowed: str):
    """A type for a comma-separated subset of `allowed`, kept in the order given."""
    def parse(text: str) -> list[str]:
        picked = items(text)
        unknown = [t for t in picked if t not in allowed]
        if unknown or not picked:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                                             f"choose from {', '.join(allowed)}")
        return picked
    parse.__name__ = "names"
    return parse
