"""Plain-data results (a tokenizer's strings, tuples and dicts) on their way from the sandbox to the judge:
the JSON encoding keeps tuples and tuple keys, hostile files count as no result, and compare_data names the
first difference."""

from __future__ import annotations

import json
import math

import pytest

from autograder.capture import from_data, to_data
from autograder.checks import MAX_DATA_BYTES, load_data_output
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


@pytest.mark.parametrize("text", [
    '{"tuple": [1], "extra": 2}',   # an object that is not a tagged tuple or dict
    '{"dict": [[1, 2, 3]]}',       # a pair that is not [key, value]
    '{"dict": [[[1], 2]]}',        # an unhashable key
    '{"not": "tagged"}',
])
def test_malformed_results_count_as_missing(tmp_path, text):
    (tmp_path / "out.json").write_text(text)
    assert load_data_output(tmp_path, "out.json") == (False, None)


def test_hostile_result_files_count_as_missing(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)  # json recursion
    (tmp_path / "big.json").write_text("[" + "1," * (MAX_DATA_BYTES // 2) + "1]")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "link.json").symlink_to("/etc/passwd")
    for name in ("deep.json", "big.json", "binary.json", "link.json", "absent.json"):
        assert load_data_output(tmp_path, name) == (False, None), name


def test_good_result_file_is_read(tmp_path):
    (tmp_path / "out.json").write_text(json.dumps(to_data([("e", "s"), ("es", "t")])))
    assert load_data_output(tmp_path, "out.json") == (True, [("e", "s"), ("es", "t")])


def test_compare_data_accepts_equal_values_and_names_the_first_difference():
    expected = [("e", "s"), ("es", "t"), ("l", "o")]
    assert compare_data([["e", "s"], ["es", "t"], ["l", "o"]], expected, "case 0", 0, 0) is None  # list ~ tuple
    message = compare_data([("e", "s"), ("s", "t"), ("l", "o")], expected, "case 0", 0, 0)
    assert message.startswith("case 0: item 1: expected ('es', 't'), got ('s', 't')")
    assert "expected 3 item(s)" in compare_data(expected[:2], expected, "case 0", 0, 0)


def test_compare_data_on_dicts_numbers_and_several_returned_values():
    assert compare_data({"b": 1, "a": 2}, {"a": 2, "b": 1}, "c", 0, 0) is None  # key order does not matter
    assert "1 expected key(s) missing, e.g. 'b'" in compare_data({"a": 2}, {"a": 2, "b": 1}, "c", 0, 0)
    assert "key 'a': expected 2, got 3" in compare_data({"a": 3, "b": 1}, {"a": 2, "b": 1}, "c", 0, 0)
    assert compare_data(1.0 + 1e-9, 1.0, "c", 1e-6, 0) is None
    assert compare_data(math.nan, 1.0, "c", 1e-6, 1e-6) is not None  # NaN never equals
    assert compare_data(-math.inf, -math.inf, "c", 1e-6, 0) is None
    assert "expected a number" in compare_data(True, 1, "c", 0, 0)  # a bool is not a number
    message = compare_data([["a", "b"], -2.0], (["a", "b"], -1.5), "c", 1e-9, 1e-9)
    assert message == "c: returned value 2: expected -1.5, got -2.0"
    assert "could not be compared" in compare_data(10**400, 1.0, "c", 0, 0)
