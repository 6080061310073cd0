"""autopar: search the fastest hybrid-parallel training plan for a model on a GPU cluster, then run it."""

__version__ = "0.1.0"

from autopar.errors import AutoparError  # noqa: E402


def wrap(model, plan, **kwargs):
    """Turn a plain ``nn.Module`` into the parallel model ``plan`` describes (see autopar.runtime.wrap)."""
    from autopar.runtime import wrap as _wrap

    return _wrap(model, plan, **kwargs)


__all__ = ["AutoparError", "__version__", "wrap"]
