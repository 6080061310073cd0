"""Pure cost formulas (numpy-friendly): compute, communication, memory and pipeline step time.

Every function takes plain numbers or numpy arrays and returns the same, so the search can score
thousands of candidate strategies in one call. Units: bytes, bytes/s, FLOPs, FLOP/s, seconds.
"""

from cost_models.params import CostParams

__all__ = ["CostParams"]
