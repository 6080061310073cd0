"""``autopar export``: a plan as torchtitan, Megatron-LM, DeepSpeed or accelerate configuration.

``common.prepare`` finds the closest plan the target expresses (``closest``, ``shape``, ``caps``);
one module per target renders it; ``command`` is the CLI.
"""

from autopar.export.caps import TARGETS
from autopar.export.common import Export, prepare

__all__ = ["TARGETS", "Export", "prepare", "render"]


def render(ex: Export) -> str:
    """The export's file text in its target's format."""
    from importlib import import_module

    return import_module(f"autopar.export.{ex.caps.name}").render(ex)
