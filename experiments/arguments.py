"""argparse types for the comma-separated options of the studies: a bad item is an argparse error
that names the option and the item (before anything is measured), never a traceback from a
study's main() or an option that silently selects nothing."""
from __future__ import annotations

import argparse


def counts(text: str) -> list[int]:
    """'1,2' -> [1, 2]: whole numbers of at least 1 (thread counts, hidden sizes, cell numbers)."""
    out = []
    for item in filter(None, (t.strip() for t in str(text).split(","))):
        try:
            n = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a whole number") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{item!r} must be at least 1")
        out.append(n)
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
