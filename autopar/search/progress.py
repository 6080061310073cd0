"""Progress bars of long searches: tqdm on stderr when ``SearchOptions.progress`` (the CLI turns it on
when stderr is a terminal and not under ``--json``), else nothing. Each phase has its own bar:
``configs`` (the homogeneous planner's (pp, micro-batch) settings), ``shapes`` (the heterogeneous
planner's start shapes), ``baselines`` (the baseline families scored after the plan)."""

from __future__ import annotations


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool, desc: str, unit: str):
    """A tqdm bar of ``total`` steps on stderr (removed when closed), or one that does nothing."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False)
