"""``autopar calibrate``: fit cost parameters to measured step times, for ``--profile``.

table.py (the fittable CostParams fields, as data), inputs.py (measured files and plan files with a
measured time into runs), fit.py (least squares on log(predicted / measured), identifiability),
score.py (MAPE, Spearman, regret; cross-validation), document.py (the ``autopar-calibration/1`` file
and its summary), command.py (the CLI sub-command).
"""

from autopar.calibrate.fit import Fit, fit, predict
from autopar.calibrate.inputs import CalRun, Inputs, load_inputs
from autopar.calibrate.score import cross_validate, fit_identifiable, scores
from autopar.calibrate.table import FITTABLE, Fittable, choose

__all__ = ["FITTABLE", "CalRun", "Fit", "Fittable", "Inputs", "choose", "cross_validate", "fit", "fit_identifiable",
           "load_inputs", "predict", "scores"]
