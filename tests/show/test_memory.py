"""Memory bars add up to the estimate's per-device peak, and split the model states as ZeRO does."""

from __future__ import annotations

import pytest

from autopar.show.memory import _state_split, stage_memory
from cost_models import CostParams


def test_parts_sum_to_the_estimates_peak_per_device(drawn):
    mems = stage_memory(drawn.plan, drawn.model, drawn.est, drawn.params)
    assert len(mems) == len(drawn.plan.stages)
    for m in mems:
        assert m.summed_gib == pytest.approx(m.total_gib, rel=1e-9)
        assert all(v >= 0 for v in m.parts.values())
        for d in m.devices:
            assert drawn.est.memory_gib[d] == m.total_gib
            assert drawn.est.budget_gib[d] >= m.budget_gib
    assert max(m.total_gib for m in mems) == drawn.est.max_memory_gib


@pytest.mark.parametrize("zero, per_param", [(0, (2, 4, 12)), (1, (2, 4, 3)), (2, (2, 1, 3)), (3, (0.5, 1, 3))])
def test_model_states_split_as_zero_shards_them(zero, per_param):
    """Mixed-precision Adam with an fp32 gradient buffer, 18 bytes per parameter (Megatron-LM's table),
    over 4 data-parallel ranks, sharded as Rajbhandari et al. shard them."""
    got = _state_split(1000.0, zero, 4, CostParams())
    assert got == pytest.approx(tuple(1000.0 * b for b in per_param))
