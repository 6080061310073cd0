"""argparse as the autopar command line uses it: one-line errors, and help that shows every default."""

from __future__ import annotations

import argparse

from autopar.errors import AutoparError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default after its help, unless the help already says it or there is
    none to show (a flag, or a default the help describes)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with autopar's one-line errors (no usage block): ``autopar: error: search: ...; see --help``,
    and help that shows defaults (every sub-command's parser is this class too)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        cmd = self.prog.split(" ", 1)[1] if " " in self.prog else "arguments"
        raise AutoparError(cmd, message, f"see `{self.prog} --help`")


def positive_float(flag: str):
    """An argparse ``type``: a finite number > 0, else the flag's one-line error."""
    return _number(flag, lambda v: 0 < v < float("inf"), "a positive finite number")


def fraction(flag: str):
    """An argparse ``type``: a number in [0, 1), else the flag's one-line error."""
    return _number(flag, lambda v: 0 <= v < 1, "a fraction in [0, 1)")


def _number(flag: str, ok, what: str):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{flag} must be {what}, got {s}")
        return v
    return parse
