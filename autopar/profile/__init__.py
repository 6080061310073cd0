"""``autopar profile``: measure the machine, calibrate the cost model, and prove it against real runs.

compute.py (layer units, matmul peak, copy bandwidth, optimizer), comm.py (collectives over message
and group sizes), runs.py (a plan under ``autopar.wrap``: step time, model-state and saved-activation
bytes), memory.py (calibration runs for the memory model), charged.py (the communication the cost
model adds to a measured unit call, which the compute fit takes off), fit.py, profiler.py (``run_profile``),
io.py (the versioned file), apply.py (measured numbers into Cluster / CostParams / ModelSpec).
"""

from autopar.profile.apply import apply_profile, apply_profile_model, model_from_record, profile_record
from autopar.profile.io import PROFILE_VERSION, Profile, check_profile, load_profile, save_profile

__all__ = ["PROFILE_VERSION", "Profile", "apply_profile", "apply_profile_model", "check_profile", "load_profile",
           "model_from_record", "profile_record", "run_profile", "save_profile"]


def run_profile(*args, **kwargs) -> dict:
    """See autopar.profile.profiler.run_profile (imported lazily: it pulls in torch.distributed)."""
    from autopar.profile.profiler import run_profile as run

    return run(*args, **kwargs)
