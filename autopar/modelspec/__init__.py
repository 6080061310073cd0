"""Models as the planner sees them: ModelSpec from the zoo, HF configs, or a traced nn.Module.

torch is imported lazily (tracing only), so the planner and ``autopar list models`` start fast.
"""

from autopar.modelspec.hf import from_hf_config
from autopar.modelspec.load import from_factory, load_model
from autopar.modelspec.spec import CKPT_MODES, LayerSpec, ModelSpec, MoESpec
from autopar.modelspec.zoo import from_zoo, zoo_entry, zoo_names


def _from_module(module, example_input, **kwargs) -> ModelSpec:
    """Trace ``module`` on the meta device into a ModelSpec (autopar.modelspec.trace.spec_from_module)."""
    from autopar.modelspec.trace import spec_from_module

    return spec_from_module(module, example_input, **kwargs)


# The spelling, ModelSpec.from_module(module, example_input); spec.py itself stays torch-free.
ModelSpec.from_module = staticmethod(_from_module)


def __getattr__(name: str):
    if name == "spec_from_module":
        from autopar.modelspec.trace import spec_from_module

        return spec_from_module
    raise AttributeError(f"module 'autopar.modelspec' has no attribute {name!r}")


__all__ = ["CKPT_MODES", "LayerSpec", "ModelSpec", "MoESpec", "from_factory", "from_hf_config", "from_zoo", "load_model",
           "spec_from_module", "zoo_entry", "zoo_names"]
