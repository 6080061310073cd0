"""Plans to export, searched by the real CLI once per session: the README example (llama2-7b on
2x8xA100-80G), two heterogeneous FlashFlex mixes (benchmarks/hetero.py), a small gpt3-1.3b plan and exactly expressible plans
built from a ``Shape`` (uniform, one with an uneven pipeline split)."""

from __future__ import annotations

import contextlib
import io

import pytest

from autopar.cli import main
from autopar.export.shape import Shape, build_plan, even_split
from autopar.plan.io import save_plan
from autopar.planned import load_planned

SEARCHES = {
    "readme": ["--model", "llama2-7b", "--cluster", "2x8xA100-80G", "--global-batch-size", "512", "--seq-len", "4096"],
    "hetero": ["--model", "llama2-7b", "--cluster", "8x3090+8x4090+8xA100", "--global-batch-size", "64",
               "--seq-len", "4096"],
    "hetero-13b": ["--model", "llama2-13b", "--cluster", "8x3080Ti+8x3090+24x4090", "--global-batch-size", "256",
                   "--seq-len", "4096"],  # benchmarks/hetero.py: a 7-stage asymmetric pipeline over 40 GPUs
    "small": ["--model", "gpt3-1.3b", "--cluster", "2x4xA100-80G", "--global-batch-size", "16", "--seq-len", "512"],
}


def search(path, argv) -> str:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["search", *argv, "--no-baselines", "-o", str(path)])
    assert rc == 0, err.getvalue()
    return str(path)


def uniform(base: str, path, pp: int, tp: int, zero: int, ckpt: str, sp: bool, m: int, uneven: bool = False,
            schedule: str = "1f1b", reshard: bool = True, overlap: bool = False) -> str:
    """A plan every target could express (``uneven``: one block moved from the last stage to the first),
    built on ``base``'s cluster and batch, with its predicted figures."""
    from autopar.estimate import estimate_plan

    planned = load_planned(base)
    split = even_split(planned.model, pp)
    if uneven:
        split = (split[0] + (split[1][0],), split[1][1:], *split[2:])
    shape = Shape(pp, tp, zero, ckpt, sp, m, split, schedule=schedule, reshard=reshard, overlap=overlap)
    plan = build_plan(planned.plan, planned.model, shape)
    plan.predicted = estimate_plan(plan, planned.model, planned.params).predicted()
    save_plan(plan, path)
    return str(path)


@pytest.fixture(scope="session")
def plans(tmp_path_factory) -> dict[str, str]:
    """name -> plan path: the searched plans and built ones (``exact-*`` are expressible as they are)."""
    d = tmp_path_factory.mktemp("export-plans")
    out = {name: search(d / f"{name}.yaml", argv) for name, argv in SEARCHES.items()}
    out["exact-pp2"] = uniform(out["small"], d / "pp2.yaml", 2, 2, 0, "full", True, 4)
    out["exact-dp"] = uniform(out["small"], d / "dp.yaml", 1, 1, 3, "none", False, 2)
    out["gpipe-pp2"] = uniform(out["small"], d / "gpipe.yaml", 2, 1, 0, "none", False, 4, schedule="gpipe")
    out["uneven-pp2"] = uniform(out["small"], d / "uneven.yaml", 2, 2, 0, "full", False, 4, uneven=True)
    out["no-reshard"] = uniform(out["small"], d / "nr.yaml", 1, 1, 3, "none", False, 2, reshard=False)
    out["overlap-pp2"] = uniform(out["small"], d / "ov.yaml", 2, 2, 1, "full", True, 4, overlap=True)
    out["zero2-dp"] = uniform(out["small"], d / "z2.yaml", 1, 1, 2, "none", False, 2)
    return out
