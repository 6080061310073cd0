"""The one error type users see: it names the bad field and the fix, and the CLI turns it into exit code 2."""

from __future__ import annotations


class AutoparError(ValueError):
    """Bad input or an impossible request.

    ``str(err)`` is one line: ``<field>: <problem>; <fix>``. The CLI prints exactly that on stderr
    and exits with code 2, so every raise site must name the field a user can change.
    """

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}"
        if fix:
            msg += f"; {fix}"
        super().__init__(" ".join(msg.split()))
