"""Phase 2 of grading, in the trusted process: compare a student's captured output with the reference.

Messages are written for the student: the expected and actual shape or type first, then how many entries
differ and the index and size of the largest error. They never show an expected value: students resubmit, and
feedback that printed the reference's answers would let them collect a lookup table instead of an
implementation. What counts as an answer (sequences of values, integer vs float results) is stated once, in
``capture.py``.
"""

from __future__ import annotations

import math

import numpy as np


def returned_value_name(index: int, count: int, names: tuple[str, ...] = ()) -> str:
    """How a message names the ``index``-th (0-based) of ``count`` returned values, with its name when known:
    ``returned_value_name(0, 2, ("n_noise", "n_spans")) == "the 1st of 2 returned values (n_noise)"``; never a
    bare number, which reads as a value."""
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}.get(index + 1, f"{index + 1}th")
    name = f" ({names[index]})" if index < len(names) else ""
    return f"the {ordinal} of {count} returned values{name}"


def compare_arrays(actual: np.ndarray, expected: np.ndarray, what: str, rtol: float, atol: float) -> str | None:
    """``None`` when ``|actual - expected| <= atol + rtol * |expected|`` everywhere (infinities must match
    exactly, NaN never matches), else a message explaining the first problem."""
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        return f"{what}: expected shape {expected.shape}, got {actual.shape}"
    if expected.dtype == bool:
        if actual.dtype != bool:
            return f"{what}: expected a boolean array, got dtype {actual.dtype}"
        wrong = np.argwhere(actual != expected)
        if len(wrong):
            idx = tuple(int(i) for i in wrong[0])
            return f"{what}: {len(wrong)} of {actual.size} entries are wrong, the first at index {idx}"
        return None
    narrow = f" (the result has dtype {actual.dtype})" if actual.dtype.kind == "f" and actual.dtype.itemsize < 8 else ""
    actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    if np.isnan(actual).any():
        idx = tuple(int(i) for i in np.argwhere(np.isnan(actual))[0])
        return f"{what}: the result contains NaN (first at index {idx})"
    inf_mismatch = np.isinf(expected) != np.isinf(actual)
    inf_mismatch |= np.isinf(expected) & (np.sign(expected) != np.sign(actual))
    if inf_mismatch.any():
        idx = tuple(int(i) for i in np.argwhere(inf_mismatch)[0])
        should = "an infinity of the other sign" if np.isinf(actual[idx]) and np.isinf(expected[idx]) else (
            "infinite" if np.isinf(expected[idx]) else "finite")
        return (f"{what}: {int(inf_mismatch.sum())} of {actual.size} entries are wrong, the first at index {idx}: "
                f"it should be {should}, got {actual[idx]}")
    finite = np.isfinite(expected)
    err = np.where(finite, np.abs(actual - np.where(finite, expected, 0.0)), 0.0)
    tol = atol + rtol * np.abs(np.where(finite, expected, 0.0))
    bad = err > tol
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, err - tol, -np.inf)), err.shape)
        worst = tuple(int(i) for i in worst)
        return (f"{what}: {int(bad.sum())} of {err.size} entries differ; the largest error is {err[worst]:.3g} "
                f"at index {worst}{narrow}")
    return None


def _short(value, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "a list/tuple"
    return {str: "a string", dict: "a dict", type(None): "None"}.get(type(value), type(value).__name__)


def _data_difference(actual, expected, rtol: float, atol: float, where: list[str]) -> str | None:
    at = f"{', '.join(where)}: " if where else ""
    if _kind(actual) != _kind(expected):
        got = "None" if actual is None else f"{_kind(actual)} {_short(actual)}"
        return f"{at}expected {_kind(expected)}, got {got}"
    if isinstance(expected, dict):
        missing = [k for k in expected if k not in actual]
        extra = [k for k in actual if k not in expected]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"{len(missing)} expected key(s) missing")
            if extra:
                parts.append(f"{len(extra)} unexpected key(s), e.g. {_short(extra[0], 80)} "
                             f"(value {_short(actual[extra[0]], 80)})")
            return at + "; ".join(parts)
        for key, value in expected.items():
            problem = _data_difference(actual[key], value, rtol, atol, where + [f"key {_short(key, 80)}"])
            if problem:
                return problem
        return None
    if isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            return f"{at}expected {len(expected)} item(s), got {len(actual)}: {_short(actual)}"
        for j, (a, e) in enumerate(zip(actual, expected)):
            if _data_difference(a, e, rtol, atol, []) is None:
                continue
            if isinstance(e, dict) or (isinstance(e, (list, tuple)) and any(isinstance(x, (list, tuple, dict)) for x in e)):
                return _data_difference(a, e, rtol, atol, where + [f"item {j}"])  # nested: find the exact spot
            return f"{', '.join(where + [f'item {j}'])} is wrong: got {_short(a, 80)}"
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        e, a = float(expected), float(actual)
        same = a == e if math.isinf(e) or math.isinf(a) else abs(a - e) <= atol + rtol * abs(e)
        if same:
            return None
        off = "" if math.isinf(e) or math.isinf(a) or math.isnan(a) else f", off by {abs(a - e):.3g}"
        return f"{at}got {actual!r}{off}"
    return None if actual == expected else f"{at}got {_short(actual)}, which is wrong"


def compare_data(actual, expected, what: str, rtol: float, atol: float, names: tuple[str, ...] = ()) -> str | None:
    """``None`` when ``actual`` equals ``expected`` as plain data (strings, bools, None exactly; numbers within
    ``atol + rtol * |expected|``, NaN never; lists and tuples interchangeable; dicts by key, in any order), else
    a message naming the first difference without showing the expected value, e.g.
    ``"...: item 2 is wrong: got ('s', 't')"``."""
    try:
        if isinstance(expected, tuple) and len(expected) > 1 and isinstance(actual, (list, tuple)) and len(actual) == len(expected):
            for j, (a, e) in enumerate(zip(actual, expected)):  # several returned values: name which one is wrong
                problem = _data_difference(a, e, rtol, atol, [returned_value_name(j, len(expected), names)])
                if problem:
                    return f"{what}: {problem}"
            return None
        problem = _data_difference(actual, expected, rtol, atol, [])
    except (OverflowError, RecursionError, ValueError, TypeError) as err:  # e.g. an int too large for a float
        return f"{what}: the result could not be compared with the expected value ({type(err).__name__})"
    return f"{what}: {problem}" if problem else None
