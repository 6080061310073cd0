"""The one field reader (autopar/fields.py): typed getters, ranges, choices, unknown keys, field paths."""

from __future__ import annotations

import math

import pytest

from autopar.errors import AutoparError
from autopar.fields import Fields, as_int, as_matrix, as_num, as_str, join


def _err(fn, *args, **kwargs) -> AutoparError:
    with pytest.raises(AutoparError) as e:
        fn(*args, **kwargs)
    assert "\n" not in str(e.value) and e.value.fix
    return e.value


def test_paths_join_keys_and_file_prefixes():
    assert join("", "a") == "a" and join("a.b", 3) == "a.b.3" and join("c.yaml:", "nodes") == "c.yaml:nodes"
    assert join("preset x: ", "spec") == "preset x: spec"
    f = Fields({"n": {"m": "x"}}, "c.yaml:")
    assert f.sub("n").at("m") == "c.yaml:n.m"


def test_typed_getters_return_values_and_defaults():
    f = Fields({"i": 3, "x": 2, "s": "a", "b": False, "l": [1], "m": {}, "none": None}, "top")
    assert f.req_int("i", low=1) == 3 and f.opt_int("absent", 7) == 7 and f.opt_int("none", 5) == 5
    assert f.req_num("x", gt=0) == 2.0 and type(f.req_num("x")) is float
    assert f.req_str("s", choices=("a", "b")) == "a" and f.opt_bool("b", True) is False
    assert f.req_list("l", nonempty=True) == [1] and f.req_mapping("m") == {}
    assert f.opt_mapping("absent", None) is None


@pytest.mark.parametrize("doc,call,field,words", [
    ({"n": "8"}, lambda f: f.req_int("n"), "top.n", "is a string ('8'), expected an integer"),
    ({"n": True}, lambda f: f.req_int("n"), "top.n", "is a boolean (True), expected an integer"),
    ({"n": 0}, lambda f: f.req_int("n", low=1), "top.n", "must be at least 1, got 0"),
    ({"n": 9}, lambda f: f.opt_int("n", 1, high=3), "top.n", "must be at most 3, got 9"),
    ({"x": 0}, lambda f: f.req_num("x", gt=0), "top.x", "must be > 0, got 0"),
    ({"x": -1.5}, lambda f: f.opt_num("x", 0.0, ge=0), "top.x", "must be >= 0, got -1.5"),
    ({"x": math.nan}, lambda f: f.req_num("x"), "top.x", "is NaN"),
    ({"x": "fast"}, lambda f: f.req_num("x"), "top.x", "expected a number"),
    ({"s": "zb"}, lambda f: f.req_str("s", choices=("1f1b", "gpipe")), "top.s", "unknown s 'zb'; use one of 1f1b"),
    ({"b": "yes"}, lambda f: f.opt_bool("b", False), "top.b", "expected true or false"),
    ({"l": []}, lambda f: f.req_list("l", nonempty=True), "top.l", "is empty"),
    ({"m": [1]}, lambda f: f.req_mapping("m"), "top.m", "is a list ([1]), expected a mapping"),
    ({}, lambda f: f.req_int("gone"), "top.gone", "is missing; add 'gone:' with an integer"),
    ({"l": "x" * 200}, lambda f: f.req_list("l"), "top.l", "..."),  # long values are cut short
])
def test_bad_values_name_the_field_and_a_fix(doc, call, field, words):
    e = _err(call, Fields(doc, "top"))
    assert e.field == field and words in str(e)
    assert len(str(e)) < 200


def test_unknown_keys_up_front_with_a_suggestion():
    e = _err(Fields, {"inter_bw": 1}, "c.yaml:", kind="cluster", keys=("inter_bw_gbps", "nodes"))
    assert str(e) == "c.yaml:inter_bw: is not a cluster field; did you mean inter_bw_gbps? use inter_bw_gbps, nodes"
    assert Fields({"anything": 1}, "profile").req_int("anything") == 1  # keys=None: free-form


def test_one_fix_for_a_whole_document():
    f = Fields({"sub": {"x": -1}}, "profile", fix="write it again")
    e = _err(f.sub("sub").req_num, "x", ge=0)
    assert str(e) == "profile.sub.x: must be >= 0, got -1; write it again"
    assert str(_err(f.req_int, "gone")) == "profile.gone: is missing; write it again"


def test_value_checkers():
    assert as_int(3, "f", low=0) == 3 and as_num(1, "f") == 1.0 and as_str("a", "f") == "a"
    assert as_matrix([[0, 2], [3, 0]], "m", 2, gt=0) == [[0.0, 2.0], [3.0, 0.0]]
    assert _err(as_matrix, [[0, 2]], "m", 2, gt=0).problem.startswith("must be 2x2")
    assert _err(as_matrix, [[0, 0], [1, 0]], "m", 2, gt=0).field == "m[0][1]"
    assert _err(as_matrix, [[-1, 1], [1, 0]], "m", 2, gt=0).field == "m[0][0]"  # the diagonal is >= 0
    assert _err(Fields, [1, 2], "c.yaml:").field == "c.yaml"
