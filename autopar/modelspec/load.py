"""One entry point for every way to name a model: zoo name, HF config.json, or ``pkg.module:factory``."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autopar.errors import AutoparError
from autopar.modelspec.hf import TRACED, from_hf_config
from autopar.modelspec.spec import ModelSpec
from autopar.modelspec.zoo import from_zoo, unknown_model, zoo_names

if TYPE_CHECKING:
    from torch import nn

# torch is imported only on the pkg.module:factory path: zoo names and HF configs load without it.

FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
SEQ_ATTRS = ("seq_len", "max_seq_len", "block_size", "max_position_embeddings", "n_positions")


def load_model(spec: str, seq_len: int | None = None, dtype_bytes: int | None = None,
               trace: bool = False) -> ModelSpec:
    """The ModelSpec that ``spec`` names, at ``seq_len`` tokens per sample (None: the model's default).

    ``spec`` is a zoo name (``autopar list models``), the path of a HF ``config.json`` (or of a folder
    holding one; ``traced:PATH``, or ``trace``, traces its transformers model even where formulas cover
    the family: ``modelspec.hf.from_hf_config``), or ``pkg.module:factory`` (a callable returning an
    ``nn.Module``, traced on the meta device). The result's ``source`` rebuilds it:
    ``load_model(m.source, m.seq_len)``. Every failure is an AutoparError naming ``model`` (or ``seq_len``,
    ``--trace``) with the fix.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise AutoparError("model", f"expected a model name, got {spec!r}",
                           "give a zoo name (`autopar list models`), a HF config.json path or pkg.module:factory")
    spec = spec.strip()
    field = "--trace"
    if spec.startswith(TRACED):  # a plan's source written by `search --trace`
        spec, trace, field = spec[len(TRACED):], True, "model"
    if spec in zoo_names():
        if trace:
            raise AutoparError(field, f"{spec} is a zoo model, counted by its formulas: there is no transformers "
                               "model to trace", "give the model's HF config.json, or drop --trace")
        return from_zoo(spec, seq_len=seq_len, dtype_bytes=dtype_bytes)
    if spec.endswith(".json") or Path(spec).expanduser().exists():
        return from_hf_config(spec, seq_len=seq_len, dtype_bytes=dtype_bytes, trace=trace)
    if FACTORY.fullmatch(spec):  # a factory's module is always traced: ``trace`` changes nothing
        return from_factory(spec, seq_len=seq_len, dtype_bytes=dtype_bytes)
    raise unknown_model(spec)


def _import(mod_name: str):
    cwd = os.getcwd()
    if cwd not in sys.path:  # like `python -m`: modules of the project the user runs autopar in import
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(mod_name)
    except Exception as err:
        raise AutoparError("model", f"cannot import {mod_name!r} ({type(err).__name__}: {err})",
                           "check the pkg.module part and that the module imports on its own") from err


def _build(spec: str, factory):
    """Call the factory once, under the meta device (no weights allocated); a factory that cannot build
    there is refused (calling it again for real would run its side effects twice and allocate weights)."""
    import torch

    try:
        with torch.device("meta"):
            return factory()
    except Exception as err:
        raise AutoparError("model", f"factory {spec} raised {type(err).__name__}: {err} (built on the meta device)",
                           "make the factory build under `with torch.device('meta')` (no real tensors, no "
                           "data-dependent code at construction)") from err


def _example(spec: str, module, model: nn.Module, seq_len: int | None):
    """forward()'s input: the module's ``example_input()`` if it has one, else token ids [1, seq_len]."""
    import torch
    from torch import nn

    from autopar.modelspec.trace import infer_seq_len

    example = getattr(module, "example_input", None)
    if callable(example):
        takes_len = bool(inspect.signature(example).parameters)
        try:
            inp = example(seq_len) if takes_len else example()
        except Exception as err:
            raise AutoparError("model", f"{module.__name__}.example_input() raised {type(err).__name__}: {err}",
                               "make example_input() return forward()'s input (a tensor, tuple or dict)") from err
        got = infer_seq_len(inp)
        if seq_len is not None and not takes_len and got > 1 and got != seq_len:
            raise AutoparError("seq_len", f"{module.__name__}.example_input() gives {got} tokens, asked {seq_len}",
                               f"drop --seq-len, pass --seq-len {got}, or let example_input(seq_len) take the length")
        return inp
    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if emb is None:
        raise AutoparError("model", f"{spec} has no example_input() and no nn.Embedding to size token ids",
                           f"define example_input() in {module.__name__} returning forward()'s input")
    if seq_len is None:
        holders = (model, getattr(model, "config", None))
        seq_len = next((v for h in holders for a in SEQ_ATTRS if isinstance(v := getattr(h, a, None), int)), None)
    if seq_len is None:
        raise AutoparError("seq_len", f"cannot tell the sequence length of {spec}", "pass --seq-len N")
    return torch.randint(0, emb.num_embeddings, (1, seq_len))


@contextlib.contextmanager
def user_code(spec: str):
    """Run the user's module, factory and forward with their output held back: on success it goes to
    stderr (stdout is autopar's, e.g. ``--json``); an exit or exception of theirs becomes one
    AutoparError naming the factory, with the last line they printed."""
    fix = "make pkg.module:factory import and build without exiting (no sys.exit / argument parsing at import)"
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            yield
    except AutoparError:
        raise
    except SystemExit as err:
        problem = f"{spec} called sys.exit({err.code!r}) while autopar imported, built or traced it"
    except Exception as err:
        problem = f"{spec} raised {type(err).__name__}: {err}"
    else:
        sys.stderr.write(said.getvalue())
        return
    last = [ln for ln in said.getvalue().splitlines() if ln.strip()][-1:]
    raise AutoparError("model", problem + (f" (its last output: {last[0].strip()!r})" if last else ""), fix) from None


def from_factory(spec: str, seq_len: int | None = None, dtype_bytes: int | None = None) -> ModelSpec:
    """Import ``pkg.module``, build ``factory()`` and trace it (see autopar.modelspec.trace)."""
    with user_code(spec):
        return _from_factory(spec, seq_len, dtype_bytes)


def _from_factory(spec: str, seq_len: int | None, dtype_bytes: int | None) -> ModelSpec:
    from torch import nn

    from autopar.modelspec.trace import spec_from_module

    mod_name, attr = spec.split(":", 1)
    module = _import(mod_name)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise AutoparError("model", f"module {mod_name!r} has no {attr!r}",
                               f"name a callable defined in {mod_name} (pkg.module:factory)")
    if not callable(factory):
        raise AutoparError("model", f"{spec} is a {type(factory).__name__}, not a callable",
                           "name a function or class that returns an nn.Module")
    model = _build(spec, factory)
    if not isinstance(model, nn.Module):
        raise AutoparError("model", f"factory {spec} returned a {type(model).__name__}, not an nn.Module",
                           "return a torch.nn.Module from the factory")
    inp = _example(spec, module, model, seq_len)
    return spec_from_module(model, inp, name=spec, seq_len=seq_len, dtype_bytes=dtype_bytes, source=spec)
