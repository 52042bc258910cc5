"""Argument checks shared by every public constructor.

Each check raises an error whose message names the argument, the value it got and what is
allowed, so a user can fix a config without reading the source.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = False,
    high_inclusive: bool = True,
) -> float:
    """Returns `value` as a float after checking that it is a finite real in the given range."""
    if not _is_real(value):
        raise TypeError(f"`{name}` must be a real number, got {value!r} ({type(value).__name__}).")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be finite, got {value!r}.")
    too_low = low is not None and (value < low or (value == low and not low_inclusive))
    too_high = high is not None and (value > high or (value == high and not high_inclusive))
    if too_low or too_high:
        left = "[" if low_inclusive else "("
        right = "]" if high_inclusive and high is not None else ")"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ValueError(f"`{name}` must be in {left}{lo}, {hi}{right}, got {value!r}.")
    return value


def check_positive(name: str, value: Any) -> float:
    """A finite real > 0."""
    return check_number(name, value, low=0.0)


def check_non_negative(name: str, value: Any) -> float:
    """A finite real >= 0."""
    return check_number(name, value, low=0.0, low_inclusive=True)


def check_optional_positive(name: str, value: Any) -> float | None:
    """None, or a finite real > 0."""
    return None if value is None else check_positive(name, value)


def check_int(name: str, value: Any, *, low: int | None = None) -> int:
    """An integer (not bool) >= `low`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}.")
    return value


def check_bool(name: str, value: Any) -> bool:
    """True or False (numpy booleans accepted)."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"`{name}` must be True or False, got {value!r} ({type(value).__name__}).")
    return bool(value)


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """One of the strings in `allowed`."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {list(allowed)}, got {value!r}.")
    return value


def check_seed(name: str, value: Any) -> int | None:
    """None, or an integer in [0, 2**31)."""
    if value is None:
        return None
    value = check_int(name, value, low=0)
    if value >= 2**31:
        raise ValueError(f"`{name}` must be None or an integer in [0, 2**31), got {value!r}.")
    return value
