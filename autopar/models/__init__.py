"""Runnable models in plain torch (GPT, Llama) and Hugging Face adapters, with TP plans as data.

Each model states its own TP tables (``tp_plans``, ``tp_divisors``): the runtime reads them through
the unit contract in ``autopar/units.py``.
"""

from autopar.models.gpt import GPT, GPTConfig
from autopar.models.hf import from_transformers
from autopar.models.llama import Llama, LlamaConfig
from autopar.models.tp_plans import GPT_TP_PLAN, LLAMA_TP_PLAN, TP_PLANS

__all__ = ["GPT", "GPTConfig", "GPT_TP_PLAN", "LLAMA_TP_PLAN", "TP_PLANS", "Llama", "LlamaConfig",
           "from_transformers"]
