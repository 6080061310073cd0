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


class NoFitError(AutoparError):
    """No plan fits in memory (field ``memory``). ``need_gib``: what the closest setting tried needs per device
    (inf when not known), so a search over several settings (context-parallel degrees) names the closest."""

    def __init__(self, problem: str, fix: str, need_gib: float = float("inf")) -> None:
        super().__init__("memory", problem, fix)
        self.need_gib = need_gib
