"""Phase 1 of grading, inside the sandbox: call the student's functions on the grader's inputs, save the results.

This file is copied read-only into every sandbox (as ``/grader/capture.py``) and runs in the student's kernel,
so it decides nothing and trusts nothing: it only turns what the student's functions return into plain
``.npy`` files (no pickle) that the trusted grader compares with the reference in phase 2. Anything a
submission does to this module (monkeypatching, deleting it) can only spoil its own outputs.

Input layout (written by the grader): one check's files, ``spec.json`` with
``{"function": name, "cases": [{"args": [...], "kwargs": {...}}, ...]}`` where each argument is
``{"array": "case0_arg1.npy"}``, ``{"value": <json>}``, ``{"rng": seed}`` (``np.random.default_rng(seed)``) or
``{"callable": name, "arrays": {...}}``, and the
arrays it names. In the sandbox they arrive from the runner's supervisor as ``{file name: bytes}``, when the
test cell is run and not before (``runner.py``); the course's own tests pass a folder ``<inputs>/<check>/``.
Output layout: ``/submission/.grader-outputs/<check>/case<i>_out<j>.npy`` for each returned value, or
``case<i>.error.txt`` with the exception the function raised. When the spec says ``"keeps_inputs": true`` (the
notebook's text forbids changing the arguments), also every array argument as it is after the call,
``case<i>_after_arg<j>.npy`` or ``case<i>_after_kw_<name>.npy``: the grader compares them with its inputs.

Plain data (strings, lists, tuples, dicts: what a tokenizer takes and returns) crosses the boundary as JSON in
the tagged form of :func:`to_data`: an argument ``{"data": ...}``, and, when the spec says ``"output": "data"``,
the whole return value in ``case<i>_out.json`` instead of ``.npy`` files.

What counts as an answer
------------------------
A hidden check accepts whatever the visible tests accept; this is the one place that rule is written down, and
:func:`returned_values` (here) and ``compare.py`` (in the grader) apply it:

- When the reference returns ``k > 1`` values, the student's function may return any sequence of ``k`` values
  (a tuple, a list, ...), as the visible tests' ``out, weights = f(...)`` accepts.
- Each value may be anything NumPy reads as an array of numbers: an ndarray, a list, a Python or NumPy scalar,
  a torch tensor. Integer results are compared as numbers with a float reference, as the visible tests'
  ``check_close`` does; where the reference is a boolean mask, the answer must be boolean too (the visible
  tests assert the dtype), and the message names the dtype that came back. Where a problem set states a float64
  contract (``Check.dtype``, ps7), a float32 answer fails in the visible tests and the hidden ones alike, by name.
- Plain data (``"output": "data"``) compares lists and tuples as the same thing.
"""

import io
import json
import os
import traceback

import numpy as np

OUTPUTS = "/submission/.grader-outputs"  # runner.OUTPUTS, in the notebook's folder


def _softmax_rows(scores):
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def _attention(x, w_q, w_k, w_v, w_o, n_heads, causal):
    t, d = x.shape
    dh = d // n_heads
    q, k, v = ((x @ w).reshape(t, n_heads, dh).transpose(1, 0, 2) for w in (w_q, w_k, w_v))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
    if causal:
        scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    heads = _softmax_rows(scores) @ v
    return heads.transpose(1, 0, 2).reshape(t, d) @ w_o


# Functions the grader may pass to a student's function (for example to `equivariance_error`).
CALLABLES = {
    "attention": lambda a: (lambda h: _attention(h, a["w_q"], a["w_k"], a["w_v"], a["w_o"], int(a["n_heads"]), False)),
    "causal_attention": lambda a: (lambda h: _attention(h, a["w_q"], a["w_k"], a["w_v"], a["w_o"], int(a["n_heads"]), True)),
    "cumsum": lambda a: (lambda h: np.cumsum(h, axis=0)),
    "scale": lambda a: (lambda h: float(a["factor"]) * h),
}


def to_data(value):
    """Plain Python data -> JSON that :func:`from_data` turns back into the same value: tuples become
    ``{"tuple": [...]}`` and dicts ``{"dict": [[key, value], ...]}`` (keys of any plain type, order kept);
    NumPy scalars and arrays become numbers and lists. ``to_data({("e", "s"): 9}) == {"dict": [[{"tuple":
    ["e", "s"]}, 9]]}``. Anything else raises TypeError."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, np.ndarray):
        return to_data(value.tolist())
    if isinstance(value, np.generic):
        return to_data(value.item())
    if isinstance(value, tuple):
        return {"tuple": [to_data(v) for v in value]}
    if isinstance(value, list):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[to_data(k), to_data(v)] for k, v in value.items()]}
    for kind in (bool, int, float, str):  # subclasses (IntEnum, str subclasses, ...) as their base value
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"returned a value of type {type(value).__name__}; expected plain data "
                    "(str, int, float, bool, None, list, tuple, dict)")


MAX_SAME_HASH = 64  # distinct plain keys rarely share a hash (hash(-1) == hash(-2)); floods share thousands


def _refuse_colliding_keys(keys):
    """ValueError when many keys share one hash value. Integers, floats and tuples hash the same way in every
    process, so JSON can carry thousands of distinct keys with equal hashes ("hash flooding"), and building a
    dict of n such keys takes O(n^2) time. Sorting the hashes finds that in O(n log n) first."""
    if len(keys) <= MAX_SAME_HASH:
        return
    hashes = np.sort(np.fromiter((hash(k) for k in keys), dtype=np.int64, count=len(keys)))
    boundaries = np.flatnonzero(np.diff(hashes)) + 1
    longest_run = int(np.diff(np.concatenate(([0], boundaries, [len(hashes)]))).max())
    if longest_run > MAX_SAME_HASH:
        raise ValueError(f"{longest_run} dict keys share one hash value")


def from_data(data):
    """The inverse of :func:`to_data`; ValueError or TypeError for JSON that it cannot have written."""
    if isinstance(data, list):
        return [from_data(v) for v in data]
    if isinstance(data, dict):
        if list(data) == ["tuple"] and isinstance(data["tuple"], list):
            return tuple(from_data(v) for v in data["tuple"])
        if list(data) == ["dict"] and isinstance(data["dict"], list):
            if not all(isinstance(kv, list) and len(kv) == 2 for kv in data["dict"]):
                raise ValueError("a tagged dict must hold [key, value] pairs")
            pairs = [(from_data(k), from_data(v)) for k, v in data["dict"]]
            _refuse_colliding_keys([k for k, _ in pairs])
            return dict(pairs)
        raise ValueError("a JSON object must be a tagged tuple or dict")
    return data


def _argument(spec, read):
    if "array" in spec:
        return np.load(io.BytesIO(read(spec["array"])), allow_pickle=False)
    if "value" in spec:
        return spec["value"]
    if "data" in spec:
        return from_data(spec["data"])
    if "rng" in spec:
        return np.random.default_rng(int(spec["rng"]))
    arrays = {name: np.load(io.BytesIO(read(file)), allow_pickle=False) for name, file in spec["arrays"].items()}
    return CALLABLES[spec["callable"]](arrays)


def returned_values(result, count):
    """The ``count`` values of a function's result: the result itself when ``count == 1``, else any sequence
    of exactly ``count`` values, as ``a, b = result`` would unpack it. ``returned_values([1, 2], 2) == [1, 2]``."""
    if count == 1:
        return [result]
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
        raise TypeError(f"returned a {type(result).__name__}; expected {count} values (e.g. a tuple)")
    values = list(result)
    if len(values) != count:
        raise TypeError(f"returned {len(values)} value(s); expected {count}")
    return values


def _as_plain_array(value):
    """Only real numbers cross the boundary: torch tensors, ndarray subclasses and objects that claim to be
    equal to everything become base-class bool, int64, float32 (from any narrower float) or float64 ndarrays,
    or fail here."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    array = np.array(value, copy=True, subok=False)
    if array.dtype == bool:
        return array
    if array.dtype.kind in "iu" and np.all(np.abs(array) < 2**62):
        return array.astype(np.int64)  # kept as integers so that a boolean check can name the dtype
    if array.dtype.kind not in "iuf":
        raise TypeError(f"returned a value of type {type(value).__name__} (dtype {array.dtype}), not an array of numbers")
    if array.dtype.kind == "f" and array.dtype.itemsize < 8:
        return array.astype(np.float32)  # kept narrow, so that the grader can name the dtype (float16 as float32)
    return array.astype(np.float64)


def _reader(check_id, inputs):
    """``read(file name) -> bytes`` for one check's input files: ``inputs`` is ``{name: bytes}`` or a folder
    holding ``<check_id>/<name>``."""
    if isinstance(inputs, dict):
        return lambda name: inputs[name]

    def read(name):
        with open(os.path.join(inputs, check_id, name), "rb") as f:
            return f.read()
    return read


def capture(check_id, namespace=None, inputs=None, outputs=OUTPUTS):
    """Run the student's function on every case of ``check_id`` and save what it returns.

    ``inputs``: the check's files as ``{name: bytes}`` (what the runner's kernel passes) or a folder with
    ``<check_id>/spec.json`` (the course's own tests, which run the same cases in-process). ``namespace`` (a
    dict; default ``__main__``) holds the student's functions; ``outputs`` is where the results go."""
    out = os.path.join(outputs, check_id)
    os.makedirs(out, exist_ok=True)
    read = _reader(check_id, inputs or {})
    spec = json.loads(read("spec.json").decode("utf-8"))
    if namespace is None:
        import __main__

        function = getattr(__main__, spec["function"], None)
    else:
        function = namespace.get(spec["function"])
    for i, case in enumerate(spec["cases"]):
        try:
            if not callable(function):
                raise NameError(f"the notebook defines no function named {spec['function']!r}")
            args = [_argument(a, read) for a in case["args"]]
            kwargs = {k: _argument(a, read) for k, a in case["kwargs"].items()}
            result = function(*args, **kwargs)
            if spec.get("keeps_inputs"):
                named = [(f"arg{j}", a) for j, a in enumerate(args)] + [(f"kw_{k}", a) for k, a in kwargs.items()]
                for key, value in named:
                    if isinstance(value, np.ndarray):
                        np.save(os.path.join(out, f"case{i}_after_{key}.npy"), np.asarray(value), allow_pickle=False)
            if spec.get("output") == "data":
                text = json.dumps(to_data(result))
                with open(os.path.join(out, f"case{i}_out.json"), "w", encoding="utf-8") as f:
                    f.write(text)
                continue
            arrays = [_as_plain_array(v) for v in returned_values(result, case.get("returns", 1))]
            for j, array in enumerate(arrays):
                np.save(os.path.join(out, f"case{i}_out{j}.npy"), array, allow_pickle=False)
        except BaseException as err:  # noqa: BLE001 - a student's exception of any kind is a result to report
            if isinstance(err, KeyboardInterrupt):
                raise
            message = "".join(traceback.format_exception_only(type(err), err)).strip()
            with open(os.path.join(out, f"case{i}.error.txt"), "w", encoding="utf-8") as f:
                f.write(message[:2000])
