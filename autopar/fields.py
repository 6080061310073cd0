"""One field reader for every input file: plans, cluster files and presets, the GPU catalogue, profiles.

Every value read from a file goes through a checker here, which returns it typed or raises the one-line
``AutoparError`` ``<field>: <problem>; <fix>`` naming the field's path as written in the file
(``pipelines[0].stages[1].layers[2].tp``, ``c.yaml:nodes[0].count``, ``profile.compute.hbm_gbps``).

* ``as_int`` / ``as_num`` / ``as_str`` / ``as_bool`` / ``as_list`` / ``as_mapping`` / ``as_matrix`` check
  one value (a list item, a matrix cell);
* ``Fields`` wraps one mapping of the file: ``req_*`` (must be there) and ``opt_*`` (a default when
  absent) getters for the same types, ``sub`` for a nested mapping, and unknown-key detection up front
  when the mapping's keys are declared.

A key whose value is empty (``key:`` in YAML, None) counts as absent. Booleans are never numbers
(YAML reads ``yes`` as true, which must not pass for a count). Paths: a path ending in ``:`` or a
space is a file prefix (``c.yaml:``) and is joined to its keys without a dot.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence

from autopar.errors import AutoparError

_REQUIRED = object()  # "no default": the key must be present
_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
          dict: "a mapping"}


def kind_of(x: object) -> str:
    """What ``x`` is, in the words of an error message (``a mapping``, ``an integer``, ``empty``)."""
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "empty"}.get(type(x), type(x).__name__)


def join(path: str, key: object) -> str:
    """The field path of ``key`` inside ``path``: ``a.b`` (``b`` at top level, ``c.yaml:b`` after a prefix)."""
    if not path:
        return str(key)
    return f"{path}{key}" if path.endswith((":", " ")) else f"{path}.{key}"


def _show(x: object) -> str:
    """``repr`` cut to one short line (a whole mapping would drown the message)."""
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _wrong_type(value: object, field: str, kind: type, fix: str | None) -> AutoparError:
    word = _WORDS[kind]
    return AutoparError(field, f"is {kind_of(value)} ({_show(value)}), expected {word}",
                        fix or f"write {field.rsplit('.', 1)[-1].rsplit(':', 1)[-1]} as {word}")


def as_int(value: object, field: str, *, low: int | None = None, high: int | None = None,
           fix: str | None = None) -> int:
    """``value`` if it is an integer (not a boolean) within ``low..high``; else AutoparError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(value, field, int, fix)
    if low is not None and value < low:
        raise AutoparError(field, f"must be at least {low}, got {value}", fix or f"give an integer >= {low}")
    if high is not None and value > high:
        raise AutoparError(field, f"must be at most {high}, got {value}", fix or f"give an integer <= {high}")
    return value


def as_num(value: object, field: str, *, gt: float | None = None, ge: float | None = None,
           fix: str | None = None) -> float:
    """``float(value)`` for an int or float (not a boolean, not NaN) that is ``> gt`` / ``>= ge`` when given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(value, field, float, fix)
    if math.isnan(value) or math.isinf(value):
        raise AutoparError(field, "is NaN" if math.isnan(value) else f"is {value}", fix or "give a plain finite number")
    if gt is not None and not value > gt:
        raise AutoparError(field, f"must be > {gt:g}, got {value}", fix or f"give a number > {gt:g}")
    if ge is not None and not value >= ge:
        raise AutoparError(field, f"must be >= {ge:g}, got {value}", fix or f"give a number >= {ge:g}")
    return float(value)


def as_str(value: object, field: str, *, choices: Sequence[str] | None = None, fix: str | None = None) -> str:
    """``value`` if it is a string (one of ``choices`` when given); else AutoparError naming ``field``."""
    if not isinstance(value, str):
        raise _wrong_type(value, field, str, fix)
    if choices is not None and value not in choices:
        noun = field.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
        raise AutoparError(field, f"unknown {noun} {value!r}", fix or f"use one of {', '.join(choices)}")
    return value


NAME_CHARS = "letters, digits, space and _ . + @ / : , ( ) -"
_NAME = re.compile(r"[A-Za-z0-9 _.+@/:,()-]{1,128}")


def as_name(value: object, field: str, *, free: bool = False, empty: bool = False) -> str:
    """A name that goes into launch scripts and reports (GPU, node, zone, cluster): a string of at most
    128 safe characters (``NAME_CHARS``); ``free``: any printable text (a cluster named by its file
    path), never a control character such as a newline. ``empty``: the empty string is allowed."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # `name: 4090` reads as a number in YAML
    text = as_str(value, field)
    if text == "" and empty:
        return text
    if free and text and text.isprintable():
        return text
    if not free and _NAME.fullmatch(text):
        return text
    allowed = "printable characters only" if free else f"at most 128 of: {NAME_CHARS}"
    raise AutoparError(field, f"{_show(text)} is not a safe name", f"use {allowed}")


def as_bool(value: object, field: str, *, fix: str | None = None) -> bool:
    """``value`` if it is a boolean; else AutoparError naming ``field``."""
    if not isinstance(value, bool):
        raise _wrong_type(value, field, bool, fix)
    return value


def as_list(value: object, field: str, *, nonempty: bool = False, fix: str | None = None) -> list:
    """``value`` if it is a list (with at least one item when ``nonempty``); else AutoparError."""
    if not isinstance(value, list):
        raise _wrong_type(value, field, list, fix)
    if nonempty and not value:
        raise AutoparError(field, "is empty", fix or "give at least one entry")
    return value


def as_mapping(value: object, field: str, *, fix: str | None = None) -> dict:
    """``value`` if it is a mapping; else AutoparError naming ``field``."""
    if not isinstance(value, dict):
        raise _wrong_type(value, field, dict, fix or "write key: value pairs here")
    return value


def as_matrix(value: object, field: str, n: int, *, gt: float | None = None, ge: float | None = None,
              fix: str | None = None, symmetric: bool = False) -> list[list[float]]:
    """An ``n x n`` matrix of numbers; off-diagonal cells ``> gt`` / ``>= ge``, diagonal cells ``>= 0``;
    ``symmetric``: cell [i][j] must equal [j][i] (links between nodes go both ways alike)."""
    if not isinstance(value, list) or len(value) != n or any(not isinstance(r, list) or len(r) != n for r in value):
        shape = f"{len(value)} rows" if isinstance(value, list) else kind_of(value)
        raise AutoparError(field, f"must be {n}x{n} (one row and column per node), got {shape}",
                           fix or "give one value per node pair, nodes in file order (repeats expanded)")
    out = [[as_num(x, f"{field}[{i}][{j}]", gt=gt if i != j else None, ge=ge if i != j else 0.0, fix=fix)
            for j, x in enumerate(row)] for i, row in enumerate(value)]
    for i in range(n):
        for j in range(i + 1, n):
            if symmetric and out[i][j] != out[j][i]:
                raise AutoparError(f"{field}[{j}][{i}]", f"is {out[j][i]:g} but {field}[{i}][{j}] is {out[i][j]:g}: "
                                   "the matrix must be symmetric", fix or "give each node pair one value, both ways")
    return out


def unknown_key(field: str, kind: str, key: object, known: Iterable[str], fix: str | None = None) -> AutoparError:
    """The error for a key that is not a field of a ``kind`` mapping, suggesting the closest known key."""
    known = [str(k) for k in known]
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return AutoparError(join(field, key), f"is not a {kind} field" if kind else "is not a known field",
                        fix or f"{hint}use {', '.join(known)}")


class Fields:
    """Typed access to one mapping of an input file; every error names ``path.key`` and a fix.

    ``kind`` names the mapping in unknown-key errors (``is not a node field``). ``keys``: the keys
    it may hold, checked at once (None: any key, as for a profile's free-form sections). ``fix``:
    one fix for every error of this mapping and the ones below it (profiles: "write it again").
    """

    def __init__(self, doc: object, path: str, *, kind: str = "", keys: Iterable[str] | None = None,
                 fix: str | None = None) -> None:
        self.doc = as_mapping(doc, path.rstrip(": ") or kind or "document", fix=fix)
        self.path, self.kind, self.fix = path, kind, fix
        self.keys = list(keys) if keys is not None else None
        if self.keys is not None:
            for k in self.doc:
                if k not in self.keys:
                    raise unknown_key(path, kind, k, self.keys, fix)

    def at(self, key: object) -> str:
        """The field path of ``key``."""
        return join(self.path, key)

    def has(self, key: object) -> bool:
        """Whether ``key`` is present with a value."""
        return self.doc.get(key) is not None

    def raw(self, key: object, default: object = _REQUIRED, what: str = "a value") -> object:
        """The value of ``key`` unchecked (``default`` when absent; AutoparError when required)."""
        if self.has(key):
            return self.doc[key]
        if default is _REQUIRED:
            raise AutoparError(self.at(key), "is missing", self.fix or f"add '{key}:' with {what}")
        return default

    # -- required / optional typed getters: ``fix`` replaces the default fix (the mapping's own comes first)
    def _read(self, key: object, default: object, check, kind: type, fix: str | None, **limits):
        if default is not _REQUIRED and not self.has(key):
            return default
        return check(self.raw(key, what=_WORDS[kind]), self.at(key), fix=self.fix or fix, **limits)

    def req_int(self, key: str, *, low: int | None = None, high: int | None = None, fix: str | None = None) -> int:
        return self._read(key, _REQUIRED, as_int, int, fix, low=low, high=high)

    def opt_int(self, key: str, default: int | None, *, low: int | None = None, high: int | None = None,
                fix: str | None = None) -> int | None:
        return self._read(key, default, as_int, int, fix, low=low, high=high)

    def req_num(self, key: str, *, gt: float | None = None, ge: float | None = None, fix: str | None = None) -> float:
        return self._read(key, _REQUIRED, as_num, float, fix, gt=gt, ge=ge)

    def opt_num(self, key: str, default: float | None, *, gt: float | None = None, ge: float | None = None,
                fix: str | None = None) -> float | None:
        return self._read(key, default, as_num, float, fix, gt=gt, ge=ge)

    def req_str(self, key: str, *, choices: Sequence[str] | None = None, fix: str | None = None) -> str:
        return self._read(key, _REQUIRED, as_str, str, fix, choices=choices)

    def opt_str(self, key: str, default: str | None, *, choices: Sequence[str] | None = None,
                fix: str | None = None) -> str | None:
        return self._read(key, default, as_str, str, fix, choices=choices)

    def opt_bool(self, key: str, default: bool | None, *, fix: str | None = None) -> bool | None:
        return self._read(key, default, as_bool, bool, fix)

    def req_list(self, key: str, *, nonempty: bool = False, fix: str | None = None) -> list:
        return self._read(key, _REQUIRED, as_list, list, fix, nonempty=nonempty)

    def opt_list(self, key: str, default: list | None, *, nonempty: bool = False, fix: str | None = None) -> list | None:
        return self._read(key, default, as_list, list, fix, nonempty=nonempty)

    def req_mapping(self, key: object, *, fix: str | None = None) -> dict:
        return self._read(key, _REQUIRED, as_mapping, dict, fix)

    def opt_mapping(self, key: object, default: dict | None, *, fix: str | None = None) -> dict | None:
        return self._read(key, default, as_mapping, dict, fix)

    def sub(self, key: object, *, kind: str = "", keys: Iterable[str] | None = None) -> Fields:
        """The nested mapping at ``key`` (required), read with the same fix."""
        return Fields(self.req_mapping(key), self.at(key), kind=kind, keys=keys, fix=self.fix)


def int_at_least(option: str, low: int = 1):
    """An argparse ``type`` for ``option``: a whole number >= ``low``, else argparse's one-line error."""
    import argparse

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number, got {s!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{option} must be at least {low}, got {v}")
        return v
    return parse
