"""The trusted description of a hidden test: which student function to call, on which fresh inputs, and the
reference that decides. Also the two file formats that cross the sandbox boundary (inputs in, outputs out).

Book-keeping only; the comparison itself is in ``compare.py`` and the per-assignment checks are in
``assignments/``.
"""

from __future__ import annotations

import inspect
import io
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autograder.capture import from_data, to_data
from autograder.compare import compare_arrays, compare_data, returned_value_name

MAX_OUTPUT_BYTES = 64 * 2**20  # one captured array; larger files are rejected unread
MAX_DATA_BYTES = 4 * 2**20  # one captured plain-data result (JSON)
OUTPUTS = ".grader-outputs"  # capture.OUTPUTS, relative to the submission folder


@dataclass(frozen=True)
class CallableArg:
    """A function handed to the student's function, e.g. the ``f`` of ``equivariance_error(f, x, perm)``.
    ``name`` is a key of ``capture.CALLABLES`` (the sandbox side) and of the assignment's trusted callables."""

    name: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class RngArg:
    """A random generator handed to the student's function (``mlm_mask(..., rng=...)``):
    ``np.random.default_rng(seed)``, made afresh in the sandbox, and for the reference. Two cases with the same
    seed must then give the same result, whatever the student's code does with NumPy's global state."""

    seed: int

    def generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


@dataclass
class Case:
    """One call of the student's function: ``args`` and ``kwargs``, and ``note``, a one-line description of what
    the case checks (shown in the feedback, as the visible tests show theirs)."""

    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def describe(self, function: str) -> str:
        def show(a):
            if isinstance(a, np.ndarray):
                return f"array{a.shape}" if a.dtype != bool else f"bool array{a.shape}"
            if isinstance(a, CallableArg):
                return f"<{a.name} function>"
            if isinstance(a, RngArg):
                return f"np.random.default_rng({a.seed})"
            return repr(a)

        parts = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"{function}({', '.join(parts)})"

    def label(self, index: int, count: int, function: str) -> str:
        """How the feedback names this case: ``hidden case 2 of 5 (its note), softmax(array(3,))``."""
        about = f" ({self.note})" if self.note else ""
        return f"hidden case {index + 1} of {count}{about}, {self.describe(function)}"


@dataclass
class Check:
    """One graded test cell: ``cases(rng)`` builds fresh inputs; ``reference(*args, **kwargs)`` returns the
    expected value (an array, or a tuple of arrays when the student's function returns a tuple).

    ``output="data"``: the function returns plain data (strings, numbers, lists, tuples, dicts, as a tokenizer
    does), captured as JSON and compared by ``compare_data`` (numbers within ``rtol``/``atol``).

    ``depends_on``: the student's own functions that ``function`` calls (multi-head attention calls softmax);
    when this check fails and one of those fails its own checks, the feedback says to fix that one first.

    ``verdict``: for a check graded by a property of all its outputs together rather than by their values
    (MinHash signatures, whose collision rates must estimate Jaccard similarities), a trusted function called
    with the cases and every case's returned arrays (a tuple per case); it returns ``None`` when they pass, else
    the message. The reference then only fixes how many values each case returns. Arrays output only.

    ``keeps_inputs``: where the notebook's text forbids changing the arguments, that rule in the text's words
    ("the text asks for a new array and the input unchanged"); capture then saves every array argument as it is
    after the call, and a case whose argument changed fails, naming the argument (:func:`_changed_argument`)."""

    function: str
    cases: Callable[[np.random.Generator], list[Case]]
    reference: Callable[..., Any]
    rtol: float = 1e-6
    atol: float = 1e-8
    output: str = "arrays"  # or "data"
    depends_on: tuple[str, ...] = ()  # the student's other functions this one calls (named when they fail)
    verdict: Callable[[list[Case], list[tuple]], str | None] | None = None  # judges all outputs together
    dtype: str | None = None  # a stated contract ("float64"): a float answer of another dtype fails, by name
    returns: tuple[str, ...] = ()  # the names of the returned values, for messages: ("n_noise", "n_spans")
    keeps_inputs: str = ""  # the text's rule when it forbids changing the arguments in place


@dataclass(frozen=True)
class FailureClass:
    """One way an answer can be wrong that the hidden checks must meet in every draw (README, "Writing a problem
    set"): whatever the random generator, the check ``check`` (a grade_id) has at least one case for which
    ``meets(case)`` holds, so the same bug loses the same points under any seed."""

    name: str
    check: str
    meets: Callable[[Case], bool]


@dataclass
class CheckResult:
    passed: bool
    message: str


def _has_tuple_or_dict(value) -> bool:
    if isinstance(value, (tuple, dict)):
        return True
    return isinstance(value, list) and any(_has_tuple_or_dict(v) for v in value)


def expected_results(check: Check, cases: list[Case], trusted_callables: dict) -> list:
    """The reference's answer for every case, computed in the trusted process before the student's code runs
    (a callable argument is handed to the reference as its trusted version)."""
    def trusted(value):
        if isinstance(value, RngArg):
            return value.generator()
        return trusted_callables[value.name](value.arrays) if isinstance(value, CallableArg) else value

    return [check.reference(*map(trusted, case.args), **{k: trusted(v) for k, v in case.kwargs.items()})
            for case in cases]


def _value_count(expected) -> int:
    return len(expected) if isinstance(expected, tuple) else 1


def write_inputs(check_id: str, check: Check, cases: list[Case], expected: list, root: Path) -> None:
    """Write ``root/<check_id>/spec.json`` and the ``.npy`` arrays the capture harness reads; each case says how
    many values the function returns (``"returns"``), so that capture can unpack any sequence of that length."""
    folder = root / check_id
    folder.mkdir(parents=True)

    def encode(value, name):
        if isinstance(value, np.ndarray):
            np.save(folder / f"{name}.npy", value, allow_pickle=False)
            return {"array": f"{name}.npy"}
        if isinstance(value, CallableArg):
            files = {}
            for key, array in value.arrays.items():
                np.save(folder / f"{name}_{key}.npy", np.asarray(array), allow_pickle=False)
                files[key] = f"{name}_{key}.npy"
            return {"callable": value.name, "arrays": files}
        if isinstance(value, RngArg):
            return {"rng": value.seed}
        if _has_tuple_or_dict(value):
            return {"data": to_data(value)}  # JSON alone would turn tuples into lists and lose tuple keys
        return {"value": value}

    spec = {
        "output": check.output,
        "keeps_inputs": bool(check.keeps_inputs),
        "function": check.function,
        "cases": [
            {
                "args": [encode(a, f"case{i}_arg{j}") for j, a in enumerate(case.args)],
                "kwargs": {k: encode(v, f"case{i}_kw_{k}") for k, v in case.kwargs.items()},
                "returns": _value_count(exp),
            }
            for i, (case, exp) in enumerate(zip(cases, expected))
        ],
    }
    (folder / "spec.json").write_text(json.dumps(spec))


_NPY_DTYPES = {np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.bool_)}  # capture.py's


def parse_npy(data: bytes) -> np.ndarray | None:
    """The array in the bytes of an ``.npy`` file, or ``None`` unless it is a plain float64, int64 or bool
    array whose header agrees with the data that follows it. The header is checked before anything is
    allocated, so a forged header that declares a shape of 10^15 entries, or an object dtype, costs nothing."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            return None
    except Exception:  # noqa: BLE001 - numpy's header parser raises many types (TokenError, SyntaxError, ...)
        return None
    if dtype not in _NPY_DTYPES or not all(isinstance(n, int) and n >= 0 for n in shape):
        return None
    count = math.prod(shape)  # an exact Python int: no overflow
    payload = memoryview(data)[stream.tell():]
    if count * dtype.itemsize != len(payload):
        return None
    array = np.frombuffer(payload, dtype=dtype, count=count).reshape(shape, order="F" if fortran_order else "C")
    return array.copy()  # writable, and independent of the file's bytes


def pack_inputs(root: Path) -> bytes:
    """Every check's input folder under ``root`` as one uncompressed zip (``<check>/<file>``): what the runner's
    supervisor reads on its standard input and hands out one test cell at a time."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            archive.write(path, path.relative_to(root).as_posix())
    return buffer.getvalue()


def decode_data(raw: bytes | None):
    """A captured JSON result decoded by ``from_data``; ``(False, None)`` if it is missing or malformed, else
    ``(True, value)``."""
    if raw is None or len(raw) > MAX_DATA_BYTES:
        return False, None
    try:
        return True, from_data(json.loads(raw.decode("utf-8")))
    except (ValueError, TypeError, RecursionError):
        return False, None


def _array_arguments(check: Check, case: Case) -> list[tuple[str, str, np.ndarray]]:
    """``(key, name, array)`` for every array argument of ``case``: ``key`` as capture names the argument's
    copy after the call (``case<i>_after_<key>.npy``, as ``capture.py`` writes it), ``name`` as the reference's
    signature names the parameter (``buffers``)."""
    try:
        names = list(inspect.signature(check.reference).parameters)
    except (TypeError, ValueError):
        names = []
    found = [(f"arg{j}", names[j] if j < len(names) else f"argument {j + 1}", a) for j, a in enumerate(case.args)]
    found += [(f"kw_{k}", k, a) for k, a in case.kwargs.items()]
    return [(key, name, a) for key, name, a in found if isinstance(a, np.ndarray)]


def _changed_argument(check: Check, case: Case, label: str, folder: str, i: int, files: dict) -> str | None:
    """The message when ``check.keeps_inputs`` and an array argument of case ``i`` came back changed (its values
    or its shape) or not at all."""
    for key, name, before in _array_arguments(check, case) if check.keeps_inputs else ():
        data = files.get(f"{folder}/case{i}_after_{key}.npy")
        after = None if data is None else parse_npy(data)
        if after is None:
            return f"{label}: the grader received no copy of the argument `{name}` after the call"
        if not (after.shape == before.shape and np.array_equal(after, before, equal_nan=before.dtype.kind == "f")):
            return f"{label}: changed its argument `{name}` in place; {check.keeps_inputs}"
    return None


def captured_files(check: Check, check_id: str, expected_all: list, cases: list[Case] = ()) -> dict[str, int]:
    """Every file phase 1 may leave for this check that :func:`judge` reads, with the most bytes it reads of
    each (``{".grader-outputs/<check>/case0_out0.npy": MAX_OUTPUT_BYTES, ...}``): what a worker sends back.
    ``cases``: for a check with ``keeps_inputs``, whose array arguments come back too."""
    folder = f"{OUTPUTS}/{check_id}"
    files = {}
    for i, case in enumerate(cases if check.keeps_inputs else ()):
        for key, _, _ in _array_arguments(check, case):
            files[f"{folder}/case{i}_after_{key}.npy"] = MAX_OUTPUT_BYTES
    for i, expected in enumerate(expected_all):
        files[f"{folder}/case{i}.error.txt"] = 4000
        if check.output == "data":
            files[f"{folder}/case{i}_out.json"] = MAX_DATA_BYTES
        else:
            for j in range(_value_count(expected) + 1):  # one more: to notice an extra returned value
                files[f"{folder}/case{i}_out{j}.npy"] = MAX_OUTPUT_BYTES
    return files


def _dtype_problem(check: Check, got: np.ndarray, what: str) -> str | None:
    """The message when ``check`` states a float dtype and a float array of another dtype came back."""
    if check.dtype and got.dtype.kind == "f" and got.dtype != np.dtype(check.dtype):
        return (f"{what}: returned dtype {got.dtype}; this problem set's contract is {check.dtype} (its rounding, "
                "about 1e-7 of each value, exceeds the tolerance near zero): compute in float64")
    return None


def judge(check: Check, check_id: str, cases: list[Case], expected_all: list, files: dict[str, bytes]) -> CheckResult:
    """Compare every case's captured output (``files``, by the names of :func:`captured_files`) with the
    reference's answers ``expected_all``; the first failing case explains the verdict."""
    folder = f"{OUTPUTS}/{check_id}"
    returned = []  # every case's values, for a verdict
    for i, (case, expected) in enumerate(zip(cases, expected_all)):
        label = case.label(i, len(cases), check.function)
        error = files.get(f"{folder}/case{i}.error.txt")
        if error is not None:
            return CheckResult(False, f"{label} raised {error.decode('utf-8', 'replace').strip()}")
        if check.output == "data":
            found, got = decode_data(files.get(f"{folder}/case{i}_out.json"))
            if not found:
                return CheckResult(False, f"{label}: the grader received no result (did the notebook stop before this test?)")
            problem = (compare_data(got, expected, label, check.rtol, check.atol, check.returns)
                       or _changed_argument(check, case, label, folder, i, files))
            if problem:
                return CheckResult(False, problem)
            continue
        expected = expected if isinstance(expected, tuple) else (expected,)
        values = []
        for j, exp in enumerate(expected):
            data = files.get(f"{folder}/case{i}_out{j}.npy")
            got = None if data is None else parse_npy(data)
            if got is None:
                what = "no result" if j == 0 else f"only {j} value(s), expected {len(expected)}"
                return CheckResult(False, f"{label}: the grader received {what} (did the notebook stop before this test?)")
            part = f"{label}, {returned_value_name(j, len(expected), check.returns)}" if len(expected) > 1 else label
            problem = _dtype_problem(check, got, part) or (
                None if check.verdict else compare_arrays(got, np.asarray(exp), part, check.rtol, check.atol))
            if problem:
                return CheckResult(False, problem)
            values.append(got)
        if files.get(f"{folder}/case{i}_out{len(expected)}.npy") is not None:
            return CheckResult(False, f"{label}: returned more than {len(expected)} value(s)")
        changed = _changed_argument(check, case, label, folder, i, files)
        if changed:
            return CheckResult(False, changed)
        returned.append(tuple(values))
    if check.verdict:
        problem = check.verdict(cases, returned)
        if problem:
            return CheckResult(False, problem)
    return CheckResult(True, "the hidden case passes" if len(cases) == 1 else f"all {len(cases)} hidden cases pass")
