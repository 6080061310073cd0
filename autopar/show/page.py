"""Self-contained HTML pages: a plan's pictures (``autopar show -o plan.html``) and the search report
(``autopar search --report report.html``): the plan table, why it won against the baselines, the
pictures inline as SVG and the pruning counts. The tables are ``autopar.report``'s text, as printed."""

from __future__ import annotations

import html

from autopar.estimate import PlanEstimate
from autopar.plan.schema import Plan
from autopar.report import baseline_table, figures_line, plan_shape, plan_table
from autopar.show.render import Picture, inline_svg

STYLE = ("body{font-family:sans-serif;max-width:1150px;margin:1.5em auto;color:#222}"
         "pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}"
         "h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.4em}svg{max-width:100%;height:auto}"
         "table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;text-align:right}"
         "td:last-child,th:last-child{text-align:left}")


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def _page(title: str, blocks: list[tuple[str, str]]) -> str:
    body = "\n".join(f"<h2>{html.escape(h)}</h2>\n{b}" if h else b for h, b in blocks)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def _pictures(pictures: list[Picture]) -> list[tuple[str, str]]:
    heads = {"timeline": "Pipeline schedule", "memory": "Memory per device", "cluster": "Cluster map",
             "baselines": "autopar against the baselines"}
    return [(heads.get(p.name, p.name), f"<figure id=\"{p.name}\">{inline_svg(p)}</figure>") for p in pictures]


def plan_page(plan: Plan, est: PlanEstimate, pictures: list[Picture], title: str) -> str:
    """The page of ``autopar show -o plan.html``: the plan table, its figures and the pictures."""
    blocks = [("", f"<p>{html.escape(plan_shape(plan))}, {html.escape(plan.precision)} on "
                   f"{html.escape(plan.cluster.describe())}</p>"),
              ("Plan", _pre(plan_table(plan, est))), ("Predicted", _pre(figures_line(est)))]
    return _page(title, blocks + _pictures(pictures))


def report_page(res, summary: str, seconds_line: str, pictures: list[Picture], describe) -> str:
    """The page of ``search --report``: ``res`` a SearchResult, ``summary`` the search's first line,
    ``seconds_line`` what the search's seconds counted, ``describe(rule)`` a pruning rule's text."""
    est = res.estimate
    blocks = [("", f"<p>{html.escape(summary)}</p>"),
              ("Plan", _pre(f"plan: {plan_shape(res.plan)}\n{plan_table(res.plan, est)}\n"
                            f"predicted: {figures_line(est)}"))]
    if res.baselines:
        fitting = [v[1] for v in res.baselines.values() if v]
        why = "no baseline fits in memory"
        if fitting:
            b = min(fitting, key=lambda e: e.step_time_s)
            why = (f"{b.step_time_s / est.step_time_s:.2f}x the throughput of the best baseline under the cost "
                   f"model, within {est.max_memory_gib:.1f} GiB per device")
        blocks.append(("Why it won", f"<p>{html.escape(why)}</p>" + _pre(baseline_table(est, res.baselines))))
    blocks += _pictures(pictures)
    rows = "".join(f"<tr><td>{count:,}</td><td>{html.escape(rule)}</td><td>{html.escape(describe(rule))}</td></tr>"
                   for rule, count in sorted(res.pruned.items(), key=lambda kv: -kv[1]))
    blocks.append(("Search", f"<p>{html.escape(seconds_line)}; planner {html.escape(res.planner)}</p>"
                             f"<table><tr><th>pruned</th><th>rule</th><th>what it prunes</th></tr>{rows}</table>"))
    return _page(f"autopar search report: {res.plan.model.name}", blocks)
