"""The launch directory: written only when new, empty, or written by autopar launch before (its manifest).

``autopar launch -o DIR`` writes ``DIR/autopar-launch.txt``, one file name per line, naming every file it
wrote there. A later launch into the same DIR replaces those files and removes the ones the new plan
does not need (``node3.sh`` of an earlier 4-node plan), so no stale script is left to run by mistake;
anything else in DIR (logs, the user's own notes) is left alone. A directory that holds files but no
manifest was not written by autopar launch and is refused, as is a manifest naming anything but the
files autopar launch writes (so a hand-edited manifest cannot make it delete other files).

The order survives an interruption: the manifest first lists the old and the new files, the scripts
are written, the stale ones removed, then the manifest is rewritten with the new files alone.
"""

from __future__ import annotations

import re
from pathlib import Path

from autopar.errors import AutoparError
from autopar.fileio import write_text_atomic

MANIFEST = "autopar-launch.txt"
_OURS = re.compile(r"plan\.yaml|node\d{1,6}\.sh|run_local\.sh|autopar\.sbatch")
_HEADER = "# Files written here by autopar launch; the next autopar launch -o into this directory replaces them.\n"


def previous_files(out: Path) -> list[str]:
    """The files an earlier ``autopar launch`` wrote into ``out`` (empty for a new or empty directory).

    Refuses a non-empty directory without a manifest, and a manifest naming a file launch never writes."""
    if not out.is_dir():
        return []  # a file or nothing: creating the directory says what is wrong
    if not any(out.iterdir()):
        return []
    manifest = out / MANIFEST
    if not manifest.is_file():
        raise AutoparError("out_dir", f"{out} is not empty and has no {MANIFEST}, so autopar launch did not write it",
                           "choose a new or empty directory (-o), or empty this one")
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AutoparError("out_dir", f"cannot read {manifest}: {e}", "remove the directory or choose another") from e
    names = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    for name in names:
        if not _OURS.fullmatch(name):
            raise AutoparError("out_dir", f"{manifest} names {name[:60]!r}, not a file autopar launch writes",
                               "remove that line or the directory, or choose another directory (-o)")
    return names


def write_manifest(out: Path, names: list[str]) -> Path:
    """``out/autopar-launch.txt`` listing ``names`` (in order, each once)."""
    unique = list(dict.fromkeys(names))
    return write_text_atomic(out / MANIFEST, _HEADER + "".join(f"{n}\n" for n in unique), "out_dir")


def remove_stale(out: Path, old: list[str], new: list[str]) -> None:
    """Remove the files of ``old`` that ``new`` does not write again (a missing one is fine)."""
    for name in old:
        if name in new:
            continue
        path = out / name
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
        except OSError as e:
            raise AutoparError("out_dir", f"cannot remove the stale {path}: {e.strerror or e}",
                               "remove it by hand, or choose a new directory (-o)") from e
