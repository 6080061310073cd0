"""Pictures of a plan (``autopar show``) and the search report (``autopar search --report``).

From the same cost-model figures as ``autopar estimate``: ``timeline`` (the pipeline schedule per stage,
as data), ``memory`` (per-device peak by part), ``figures`` and ``cluster_map`` (drawing, matplotlib),
``render`` (files and inline SVG), ``page`` (HTML pages), ``command`` (the CLI's ``show`` and ``--report``).
matplotlib is the ``show`` extra: only ``render``, ``figures`` and ``cluster_map`` import it, lazily.
"""
