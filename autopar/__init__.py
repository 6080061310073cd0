"""autopar: search the fastest hybrid-parallel training plan for a model on a GPU cluster, then run it."""

from autopar.errors import AutoparError
from autopar.version import __version__


def wrap(model, plan, **kwargs):
    """Turn a plain ``nn.Module`` into the parallel model ``plan`` describes (see autopar.runtime.wrap)."""
    from autopar.runtime import wrap as _wrap

    return _wrap(model, plan, **kwargs)


__all__ = ["AutoparError", "__version__", "wrap"]
