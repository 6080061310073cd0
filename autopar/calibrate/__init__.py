"""``autopar calibrate``: fit cost parameters to measured step times, for ``--profile``.

table.py (the fittable CostParams fields, as data), inputs.py (measured files and plan files with a
measured time into runs), fit.py (least squares on log(predicted / measured), identifiability),
score.py (MAPE, Spearman, regret; cross-validation), noise.py (the noise ceiling of a ranking from
re-measured configurations), document.py (the ``autopar-calibration/1`` file
and its summary), command.py (the CLI sub-command); ``--nccl-tests``: nccl_tests.py (the reader of
nccl-tests output), nccl_fit.py (alpha-beta, comm_fit rows and links), nccl_doc.py (reference, summary).
"""

import importlib

# Imported on first use: every `autopar` command builds calibrate's parser (command.py, table.py),
# and fit / score pull in scipy.optimize and scipy.stats, half a second no other command needs.
_WHERE = {"Fit": "fit", "fit": "fit", "predict": "fit", "CalRun": "inputs", "Inputs": "inputs",
          "load_inputs": "inputs", "cross_validate": "score", "fit_identifiable": "score", "scores": "score",
          "FITTABLE": "table", "Fittable": "table", "choose": "table"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'autopar.calibrate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autopar.calibrate.{_WHERE[name]}"), name)
