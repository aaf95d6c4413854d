"""Phase 1 of grading, inside the sandbox: call the student's functions on the grader's inputs, save the results.

This file is copied read-only into every sandbox (as ``/grader/capture.py``) and runs in the student's kernel,
so it decides nothing and trusts nothing: it only turns what the student's functions return into plain
``.npy`` files (no pickle) that the trusted grader compares with the reference in phase 2. Anything a
submission does to this module (monkeypatching, deleting it) can only spoil its own outputs.

Input layout (written by the grader, mounted read-only): ``/grader/inputs/<check>/spec.json`` with
``{"function": name, "cases": [{"args": [...], "kwargs": {...}}, ...]}`` where each argument is
``{"array": "case0_arg1.npy"}``, ``{"value": <json>}`` or ``{"callable": name, "arrays": {...}}``.
Output layout: ``/submission/.grader-outputs/<check>/case<i>_out<j>.npy`` for each returned value, or
``case<i>.error.txt`` with the exception the function raised.

Plain data (strings, lists, tuples, dicts: what a tokenizer takes and returns) crosses the boundary as JSON in
the tagged form of :func:`to_data`: an argument ``{"data": ...}``, and, when the spec says ``"output": "data"``,
the whole return value in ``case<i>_out.json`` instead of ``.npy`` files.
"""

import json
import os
import traceback

import numpy as np

INPUTS = "/grader/inputs"
OUTPUTS = "/submission/.grader-outputs"


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
            return {from_data(k): from_data(v) for k, v in data["dict"]}
        raise ValueError("a JSON object must be a tagged tuple or dict")
    return data


def _argument(spec, folder):
    if "array" in spec:
        return np.load(os.path.join(folder, spec["array"]), allow_pickle=False)
    if "value" in spec:
        return spec["value"]
    if "data" in spec:
        return from_data(spec["data"])
    arrays = {name: np.load(os.path.join(folder, file), allow_pickle=False) for name, file in spec["arrays"].items()}
    return CALLABLES[spec["callable"]](arrays)


def _as_plain_array(value):
    """Only real numbers cross the boundary: torch tensors, ndarray subclasses and objects that claim to be
    equal to everything become base-class float/bool ndarrays, or fail here."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    array = np.array(value, copy=True, subok=False)
    if array.dtype == bool:
        return array
    if array.dtype.kind not in "iuf":
        raise TypeError(f"returned a value of type {type(value).__name__} (dtype {array.dtype}), not an array of numbers")
    return array.astype(np.float64)


def capture(check_id):
    """Run the student's function on every case of ``check_id`` and save what it returns."""
    folder = os.path.join(INPUTS, check_id)
    out = os.path.join(OUTPUTS, check_id)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(folder, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    import __main__

    function = getattr(__main__, spec["function"], None)
    for i, case in enumerate(spec["cases"]):
        try:
            if not callable(function):
                raise NameError(f"the notebook defines no function named {spec['function']!r}")
            args = [_argument(a, folder) for a in case["args"]]
            kwargs = {k: _argument(a, folder) for k, a in case["kwargs"].items()}
            result = function(*args, **kwargs)
            if spec.get("output") == "data":
                text = json.dumps(to_data(result))
                with open(os.path.join(out, f"case{i}_out.json"), "w", encoding="utf-8") as f:
                    f.write(text)
                continue
            values = result if isinstance(result, tuple) else (result,)
            arrays = [_as_plain_array(v) for v in values]
            for j, array in enumerate(arrays):
                np.save(os.path.join(out, f"case{i}_out{j}.npy"), array, allow_pickle=False)
        except BaseException as err:  # noqa: BLE001 - a student's exception of any kind is a result to report
            if isinstance(err, KeyboardInterrupt):
                raise
            message = "".join(traceback.format_exception_only(type(err), err)).strip()
            with open(os.path.join(out, f"case{i}.error.txt"), "w", encoding="utf-8") as f:
                f.write(message[:2000])
