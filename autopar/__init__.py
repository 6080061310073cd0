"""autopar: search the fastest hybrid-parallel training plan for a model on a GPU cluster, then run it."""

from autopar.errors import AutoparError
from autopar.version import __version__


def wrap(model, plan, **kwargs):
    """Turn a plain ``nn.Module`` into the parallel model ``plan`` describes (see autopar.runtime.wrap)."""
    from autopar.runtime import wrap as _wrap

    return _wrap(model, plan, **kwargs)


def init_reference(model, seed=0, init_fn=None):
    """The single-device weights ``wrap`` gives a meta-built ``model`` (see autopar.runtime.materialize.init_weights)."""
    from autopar.runtime import init_weights

    return init_weights(model, seed, init_fn)


__all__ = ["AutoparError", "__version__", "init_reference", "wrap"]
