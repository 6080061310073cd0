"""``load_runs``: one ``autopar-measured/1`` file into a RunSet (see /work/shared/measured/README.md).

Every field is read through ``autopar.fields``: a bad file raises the one-line ``AutoparError`` naming
``<file>:case <id>.<field>``. Cases autopar cannot estimate are never dropped silently: they become
``Skip`` entries (status inexpressible or suspect, fields the source did not publish, a GPU the
catalogue lacks, a plan the plan rules refuse). ``strict=True`` raises instead for the last two.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autopar.errors import AutoparError
from autopar.fields import Fields, as_list
from autopar.measured.cluster import UnknownGPU, cluster_for_case
from autopar.measured.framework import FLAGS, PUBLISHED_TIES, Framework, case_params, read_framework
from autopar.measured.model import model_from_config
from autopar.measured.plan import build_plan, chunk_sizes, read_shape, stage_sizes
from autopar.measured.runs import Run, RunSet, Skip
from autopar.plan.cost_params import check_state_bytes
from autopar.plan.precision import DEFAULT, NAMES, activation_bytes, precision_params
from autopar.plan.validate import plan_problems

FORMAT = "autopar-measured/1"
STATUSES = ("ok", "failed", "inexpressible", "suspect")
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "none": "1f1b"}  # none: pp = 1, any schedule is the same
UNPUBLISHED = ("micro_batch_size", "num_microbatches", "ckpt")
# torchao's Float8 scaling recipes; the fp8 row of cost_models.precision prices the first (one scale per tensor)
FLOAT8_RECIPES = ("tensorwise", "rowwise")
# case flags (torchtitan) the cost model has no term for unless the file's framework states what they change
# (by_flag; async_tp is the plan's strategy)
NOT_MODELLED = ("compile",)


def _precision(c: Fields, model: Fields) -> tuple[str, list[str]]:
    """(precision, notes) of case ``c``: its ``precision_mode``, else the file's ``model.precision_mode``,
    else the first word of the free-text ``precision`` (the case's, else the file's) when that word names
    a precision (``fp16 mixed precision ...`` -> fp16), else bf16. A free text of the case's own that
    names none gives the note "precision not modelled". A case with ``float8: true`` must be fp8."""
    found = next((f.req_str("precision_mode", choices=NAMES) for f in (c, model) if f.has("precision_mode")), None)
    text = c.raw("precision", None) if c.has("precision") else model.raw("precision", None)
    word = str(text).split(maxsplit=1)[0].strip("'\"(),;:").lower() if text else ""
    mode = found or (word if word in NAMES else DEFAULT)
    unread = c.has("precision") and not found and word not in NAMES
    notes = [f"precision not modelled: {text} ({mode} assumed)"] if unread else []
    if c.raw("float8", False) is True and mode != "fp8":
        raise AutoparError(c.at("precision_mode"), f"is {mode} but the case has float8: true",
                           "set precision_mode: fp8 on the case")
    recipe = c.opt_str("float8_recipe", None, choices=FLOAT8_RECIPES)
    if recipe is not None and mode != "fp8":
        raise AutoparError(c.at("float8_recipe"), f"is set but the case is {mode}", "set precision_mode: fp8, or drop it")
    if recipe not in (None, FLOAT8_RECIPES[0]):
        notes.append(f"{c.at('float8_recipe')} {recipe}: not modelled (priced as the fp8 row, tensorwise scaling)")
    return mode, notes


def _read(path: Path) -> dict:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise AutoparError(str(path), f"cannot be read ({' '.join(str(err).split())})",
                           "give an autopar-measured/1 YAML file") from err
    f = Fields(doc, f"{path.name}:")
    f.req_str("format", choices=(FORMAT,))
    return doc


def _schedule(top: Fields) -> str:
    word = top.req_str("schedule").split()[0].lower()
    if word not in SCHEDULES:
        raise AutoparError(top.at("schedule"), f"unknown schedule {word!r}", "use 1f1b, gpipe or none (pp = 1)")
    return SCHEDULES[word]


def _attention(cfg: object, model: Fields) -> tuple[object, list[str]]:
    """``cfg`` with ``attn_implementation: eager`` when it names none and the file's model text says the runs
    had no flash attention (a file that cannot be edited, e.g. the shared AMP one); else as it is."""
    if not isinstance(cfg, dict) or "attn_implementation" in cfg:
        return cfg, []
    text = " ".join(str(model.raw(k, "")) for k in ("precision", "notes")).lower()
    if "no flash attention" not in text:
        return cfg, []
    return {**cfg, "attn_implementation": "eager"}, ["attention read as eager from the file's text ('no flash attention')"]


def published_memory(c: Fields) -> float | None:
    """The peak GPU memory the source published for case ``c``, in GiB, or None.

    ``published.memory_gib`` (torchtitan's tables: GiB); ``published.mem: 59GB`` (BLOOM's chronicles:
    'max memory used' per GPU as the node tools show it, 1024-based, so read as GiB; 'OOM' or null: none).
    """
    if not c.has("published"):
        return None
    pub = c.sub("published")
    if pub.has("memory_gib"):
        return pub.req_num("memory_gib", gt=0)
    mem = pub.raw("mem", None)
    if isinstance(mem, str) and mem.upper().endswith("GB"):
        try:
            return float(mem[:-2])
        except ValueError:
            raise AutoparError(pub.at("mem"), f"{mem!r} is not a size", "write it as e.g. 59GB") from None
    return None


def _per_case_int(c: Fields, top: Fields, key: str) -> int:
    """A count the case gives, or the file's when the file gives a number (not 'per case ...')."""
    if c.has(key):
        return c.req_int(key, low=1)
    if isinstance(top.raw(key, None), int):
        return top.req_int(key, low=1)
    raise AutoparError(c.at(key), "is missing (the file gives it per case)", f"add '{key}:' to the case")


def _case(c: Fields, top: Fields, strict: bool, cache: dict, framework: Framework) -> Run | Skip:
    cid = c.doc["id"]
    status = c.opt_str("status", "ok", choices=STATUSES)
    if status in ("inexpressible", "suspect"):
        return Skip(cid, status, str(c.raw("note", status)))
    if status == "ok":
        measured = c.req_num("measured_s", gt=0, fix="give the measured seconds per iteration (> 0)")
    elif c.has("measured_s"):
        raise AutoparError(c.at("measured_s"), "is set on a failed case", "leave measured_s null when the run failed")
    else:
        measured = None
    if c.opt_int("cp", 1, low=1) > 1 and c.opt_bool("sequence_parallel", False) and c.opt_int("tp", 1, low=1) > 1:
        return Skip(cid, "inexpressible", "context parallel with sequence parallel (autopar runs cp without sp)")
    missing = [k for k in UNPUBLISHED if not c.has(k)]
    if "virtual_stages" in c.doc and not c.has("virtual_stages"):  # interleaved, with a count left unpublished
        missing.append("virtual_stages")
    if missing:
        return Skip(cid, "unpublished", f"{c.at(missing[0])}: not published by the source ({', '.join(missing)})")
    seq = c.opt_int("seq_len", None, low=1) or top.sub("model").req_int("seq_len", low=1)
    cfg_at, cfg = (c.at("hf_config"), c.raw("hf_config")) if c.has("hf_config") else ("model.hf_config",
                                                                                     top.sub("model").raw("hf_config"))
    precision, notes = _precision(c, top.sub("model"))
    cfg, attn_notes = _attention(cfg, top.sub("model"))
    notes += attn_notes
    model, model_notes = model_from_config(cfg, seq, cfg_at, cache, activation_bytes(precision))
    notes += model_notes
    notes += [f"{c.at(k)}: not modelled" for k in NOT_MODELLED if c.raw(k, False) is True and not framework.states(k)]
    shape = read_shape(c, _per_case_int(c, top, "global_batch_size"), _schedule(top))  # interleaved: v > 1
    world = shape.pp * shape.tp * shape.cp * shape.dp
    if c.has("gpus") and c.req_int("gpus", low=1) != world:
        raise AutoparError(c.at("gpus"), f"is {c.doc['gpus']} but pp x tp x cp x dp = {world}", "fix gpus or the layout")
    sizes = chunk_sizes(c, model, shape, stage_sizes(c, model, shape.pp, notes))
    try:
        own = c.has("cluster")  # a case on other hardware than the file's gives its own cluster block
        cluster, cluster_notes = cluster_for_case((c if own else top).raw("cluster"), world,
                                                  c.at("cluster") if own else f"{c.path} cluster")
    except UnknownGPU as err:
        if strict:
            raise
        return Skip(cid, "unknown GPU", str(err))
    notes += cluster_notes
    try:
        cluster = cluster.at_precision(precision)
    except AutoparError as err:  # the GPU has no peak for it: name the case
        raise AutoparError(c.at("precision_mode"), f"{err.field}: {err.problem}", err.fix) from err
    stated = {**framework.overrides(precision, {k for k in FLAGS if c.raw(k, False) is True}), **case_params(c)}
    cost_params = {**precision_params(precision).to_dict(), **PUBLISHED_TIES, **stated}  # the file's over the defaults
    if stated:
        check_state_bytes(cost_params, top.at("framework"))
    plan = build_plan(shape, sizes, model, cluster, cost_params)
    problems = plan_problems(plan, model)
    if problems:
        if strict:
            raise AutoparError(c.path, f"the plan rules refuse the plan: {problems[0]}",
                               "fix the case, or leave it out")
        return Skip(cid, "refused", problems[0])
    gpus = "+".join(dict.fromkeys(nd.gpu.name for nd in cluster.nodes))
    group = f"{model.num_layers - 2}x{model.hidden}a{model.num_heads} s{model.seq_len} gbs{shape.global_batch_size} on {world}x{gpus}"
    if c.has("container"):  # another software release is another cluster: its runs are not ranked against these
        group += f" ({c.req_str('container')})"
    return Run(cid, plan, model, measured, status, group, c.opt_num("source_predicted_s", None, gt=0), notes,
               published_memory(c))


def load_runs(path: str | Path, *, strict: bool = False) -> RunSet:
    """The RunSet of the measured file at ``path``: runs, failed runs and skipped cases (see module doc)."""
    path = Path(path)
    top = Fields(_read(path), f"{path.name}:")
    src = top.sub("source")
    rs = RunSet(name=top.req_str("name"), path=str(path),
                source=" ".join(str(src.raw(k)) for k in ("repo", "path", "commit") if src.has(k)))
    model = top.sub("model")
    cases = as_list(top.raw("cases"), top.at("cases"), nonempty=True)
    if not model.has("precision_mode") and any(not (isinstance(r, dict) and {"precision", "precision_mode"} & set(r))
                                               for r in cases):  # say once what the cases that state none assume
        rs.notes += _precision(model, Fields({}, model.path))[1]
    framework = read_framework(top)
    rs.notes += framework.note()
    cache: dict = {}
    seen: set[str] = set()
    for i, raw in enumerate(cases):
        cid = Fields(raw, f"{top.at('cases')}[{i}]").req_str("id")
        if cid in seen:
            raise AutoparError(f"{top.at('cases')}[{i}].id", f"duplicate case id {cid!r}", "give every case its own id")
        seen.add(cid)
        out = _case(Fields(raw, f"{path.name}:case {cid}"), top, strict, cache, framework)
        if isinstance(out, Skip):
            rs.skipped.append(out)
        else:
            (rs.runs if out.status == "ok" else rs.failed).append(out)
    return rs
