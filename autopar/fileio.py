"""Writing files whole or not at all (plans, profiles, launch scripts): a reader never sees half a file.

``write_text_atomic`` writes regular files only: a path naming a directory, a device (``/dev/full``),
a FIFO or a socket is refused; a symbolic link is written through (its target is replaced, the link
stays). A new file gets the permissions the umask leaves (0666, or 0777 for ``executable``), a
replaced file keeps its own. The temporary file next to the target is removed on any exit the
process survives (an error, Ctrl-C, SIGTERM through the CLI); only SIGKILL can leave one behind.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from autopar.errors import AutoparError


def _umask() -> int:
    """The process umask: read from /proc on Linux (no change, safe beside other threads), else set and reset."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _target(path: Path, field: str) -> tuple[Path, int | None]:
    """The regular file to replace (a symlink's target) and its permission bits (None: a new file)."""
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, None
    except OSError as e:
        raise AutoparError(field, f"cannot write {path}: {e.strerror or e}", "choose a writable path (-o)") from e
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        via = f" (a symlink to {real})" if real != path.absolute() else ""
        raise AutoparError(field, f"{path}{via} is {kind}; only regular files are written",
                           "give the path of a file to create or replace (-o)")
    return real, stat.S_IMODE(st.st_mode)


def write_text_atomic(path: str | os.PathLike, text: str | bytes, field: str, executable: bool = False) -> Path:
    """Write ``text`` (UTF-8; bytes as they are: a picture) to ``path`` through a temporary file and a
    rename; parents are created.

    Returns ``path`` as given. Errors are AutoparError naming ``field`` (e.g. ``plan``, ``profile``).
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        real, mode = _target(path, field)
        if mode is None:
            mode = (0o777 if executable else 0o666) & ~_umask()
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8")) as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, real)
        tmp = None
    except OSError as e:
        raise AutoparError(field, f"cannot write {path}: {e.strerror or e}", "choose a writable path (-o)") from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path
