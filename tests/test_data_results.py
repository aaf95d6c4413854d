"""Plain-data results (a tokenizer's strings, tuples and dicts) on their way from the sandbox to the judge:
the JSON encoding keeps tuples and tuple keys, hostile files count as no result, and compare_data names the
first difference."""

from __future__ import annotations

import json
import math

import pytest

from autograder.capture import from_data, to_data
from autograder.checks import MAX_DATA_BYTES, decode_data
from autograder.sandbox import read_result_file
from autograder.compare import compare_data


@pytest.mark.parametrize("value", [
    {("l", "o"): 7, ("o", "w</w>"): 5},
    [("es", "t"), ("e", "s")],
    (["a", "##b"], -3.25),
    {"nested": {1: [True, None, ("x",)]}},
    "naïve 🙂 text",
])
def test_to_data_round_trips_through_json(value):
    assert from_data(json.loads(json.dumps(to_data(value)))) == value
    assert type(from_data(json.loads(json.dumps(to_data(value))))) is type(value)


def test_to_data_refuses_what_is_not_plain_data():
    with pytest.raises(TypeError, match="expected plain data"):
        to_data({1, 2})
    with pytest.raises(TypeError, match="expected plain data"):
        to_data([object()])


def load(folder, name):
    """How the grader reads a captured JSON result: without following links, bounded, then decoded."""
    return decode_data(read_result_file(folder, name, MAX_DATA_BYTES))


@pytest.mark.parametrize("text", [
    '{"tuple": [1], "extra": 2}',   # an object that is not a tagged tuple or dict
    '{"dict": [[1, 2, 3]]}',       # a pair that is not [key, value]
    '{"dict": [[[1], 2]]}',        # an unhashable key
    '{"not": "tagged"}',
])
def test_malformed_results_count_as_missing(tmp_path, text):
    (tmp_path / "out.json").write_text(text)
    assert load(tmp_path, "out.json") == (False, None)


def test_hostile_result_files_count_as_missing(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)  # json recursion
    (tmp_path / "big.json").write_text("[" + "1," * (MAX_DATA_BYTES // 2) + "1]")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "link.json").symlink_to("/etc/passwd")
    for name in ("deep.json", "big.json", "binary.json", "link.json", "absent.json"):
        assert load(tmp_path, name) == (False, None), name


def test_good_result_file_is_read(tmp_path):
    (tmp_path / "out.json").write_text(json.dumps(to_data([("e", "s"), ("es", "t")])))
    assert load(tmp_path, "out.json") == (True, [("e", "s"), ("es", "t")])


def test_compare_data_accepts_equal_values_and_names_the_first_difference():
    expected = [("e", "s"), ("es", "t"), ("l", "o")]
    assert compare_data([["e", "s"], ["es", "t"], ["l", "o"]], expected, "case 0", 0, 0) is None  # list ~ tuple
    message = compare_data([("e", "s"), ("s", "t"), ("l", "o")], expected, "case 0", 0, 0)
    assert message == "case 0: item 1 is wrong: got ('s', 't')"
    assert "expected 3 item(s), got 2" in compare_data(expected[:2], expected, "case 0", 0, 0)


def test_compare_data_on_dicts_numbers_and_several_returned_values():
    assert compare_data({"b": 1, "a": 2}, {"a": 2, "b": 1}, "c", 0, 0) is None  # key order does not matter
    assert compare_data({"a": 2}, {"a": 2, "b": 1}, "c", 0, 0) == "c: 1 expected key(s) missing"
    assert compare_data({"a": 3, "b": 1}, {"a": 2, "b": 1}, "c", 0, 0) == "c: key 'a': got 3, off by 1"
    assert compare_data(1.0 + 1e-9, 1.0, "c", 1e-6, 0) is None
    assert compare_data(math.nan, 1.0, "c", 1e-6, 1e-6) is not None  # NaN never equals
    assert compare_data(-math.inf, -math.inf, "c", 1e-6, 0) is None
    assert "expected a number" in compare_data(True, 1, "c", 0, 0)  # a bool is not a number
    message = compare_data([["a", "b"], -2.0], (["a", "b"], -1.5), "c", 1e-9, 1e-9)
    assert message == "c: the 2nd of 2 returned values: got -2.0, off by 0.5"
    assert "could not be compared" in compare_data(10**400, 1.0, "c", 0, 0)


def test_hash_flooding_keys_are_refused_in_linear_time():
    """Integers hash the same in every process: 100,000 multiples of 2**61 - 1 all hash to 0, and a dict of them
    would take O(n^2) to build. Refused after one sort; ordinary integer keys are fine."""
    import time

    flood = {"dict": [[k * (2**61 - 1), 1] for k in range(1, 100_001)]}
    start = time.process_time()
    with pytest.raises(ValueError, match="share one hash"):
        from_data(flood)
    assert time.process_time() - start < 5  # the unguarded dict would take minutes
    assert len(from_data({"dict": [[k, k] for k in range(100_000)]})) == 100_000


def test_npy_headers_are_checked_before_anything_is_allocated():
    import io

    import numpy as np

    from autograder.checks import parse_npy

    def npy(array, **kwargs):
        buffer = io.BytesIO()
        np.save(buffer, array, **kwargs)
        return buffer.getvalue()

    for array in (np.arange(6.0).reshape(2, 3), np.ones((2, 2), bool), np.arange(4), np.zeros((0, 5)),
                  np.asfortranarray(np.arange(6.0).reshape(2, 3))):
        parsed = parse_npy(npy(array))
        assert parsed.dtype == array.dtype and parsed.shape == array.shape and (parsed == array).all()
    good = npy(np.arange(3.0))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**15,)})
    assert parse_npy(header.getvalue() + good[-24:]) is None  # declares 8 PB, holds 24 bytes: nothing allocated
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (3,)})
    assert (parse_npy(header.getvalue() + good[-24:]) == np.arange(3.0)).all()  # the same header, honest
    assert parse_npy(npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)) is None
    assert parse_npy(npy(np.arange(3, dtype=">f8"))) is None  # not what capture writes
    assert parse_npy(npy(np.arange(3, dtype=np.complex128))) is None
    assert parse_npy(good[:-4]) is None and parse_npy(good + b"xx") is None and parse_npy(b"garbage") is None
