"""docs/models.md lists exactly the model types autopar reads or runs, each with the reader the code uses."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and cells[0] not in ("model_type", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_the_models_page_lists_every_family_with_its_reader():
    from autopar.models.hf import TRACED_OTHERS
    from autopar.models.hf_llama import LLAMA_LIKE, MOE, OWN_ATTENTION
    from autopar.modelspec.hf import HF_TYPES

    rows = _rows()
    traced = set(LLAMA_LIKE) | set(TRACED_OTHERS)
    assert set(rows) == set(HF_TYPES) | traced | {"gpt2", "bert", "t5"}
    for kind, (reads, runs, _tp, cp, ep) in rows.items():
        assert reads == ("formulas" if kind in HF_TYPES else "traced" if kind in traced else "-"), kind
        assert (runs != "-") == (kind in traced or kind in ("gpt2", "bert", "t5")), kind
        assert (ep == "yes") == (kind in MOE), kind
        assert cp.startswith("yes") == (kind in LLAMA_LIKE and kind not in OWN_ATTENTION), kind


def test_the_tp_column_says_which_llama_like_families_run_tensor_parallel():
    from autopar.models.hf_llama import DENSE
    from tests.runtime.test_hf_families_train import FAMILIES, TP_FAMILIES, VARIANTS

    rows = _rows()
    turned_off = {kind for kind, _ in VARIANTS.values()}  # TP also with a setting off
    for kind in set(DENSE) & set(FAMILIES):
        assert rows[kind][2].startswith("yes") == (kind in TP_FAMILIES or kind in turned_off), kind


def test_the_tp_column_says_which_moe_families_run_tensor_parallel():
    from autopar.models.hf_llama import MOE
    from tests.runtime.test_hf_families_train import MOE_TP_FAMILIES

    rows = _rows()
    for kind in MOE:
        assert rows[kind][2].startswith("yes (sp only") == (kind in MOE_TP_FAMILIES), kind
