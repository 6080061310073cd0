"""Writing files whole or not at all (plans, profiles): a reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autopar.errors import AutoparError


def write_text_atomic(path: str | os.PathLike, text: str, field: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename; parents are created.

    Errors are AutoparError naming ``field`` (e.g. ``plan``, ``profile``).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        raise AutoparError(field, f"cannot write {path}: {e.strerror or e}", "choose a writable path (-o)") from e
    return path
