"""``autopar export PLAN --to torchtitan|megatron|deepspeed|accelerate [-o FILE] [--profile P] [--exact]``.

Writes the target's configuration of the plan (stdout without ``-o``) and prints, on stderr when the
export goes to stdout, whether it is the plan as searched or the closest plan the target expresses,
with each change and the predicted step time of both (the same cost model).
"""

from __future__ import annotations

import sys

from autopar.export.caps import TARGETS


def add_parser(sub) -> None:
    """Add ``export`` to the CLI's subparsers ``sub``."""
    x = sub.add_parser("export", help="write a plan as torchtitan / Megatron-LM / DeepSpeed / accelerate configuration")
    x.add_argument("plan", help="a plan file (autopar search -o)")
    x.add_argument("--to", required=True, choices=TARGETS, help="the tool to configure")
    x.add_argument("-o", "--output", metavar="FILE", help="file to write (default: stdout; the changes then go to stderr)")
    x.add_argument("--profile", metavar="FILE", help="estimate with this profile's measured numbers")
    x.add_argument("--exact", action="store_true",
                   help="refuse a plan the tool cannot express as it is (default: export the closest, changes listed)")
    x.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """Run ``autopar export``; 0 on success, AutoparError (exit 2) on bad input or an inexpressible plan."""
    from autopar.export import prepare, render
    from autopar.fileio import write_text_atomic

    ex = prepare(args.plan, args.to, args.profile, exact=args.exact)
    text = render(ex)
    out = None if args.output is None else write_text_atomic(args.output, text, "export -o",
                                                             executable=ex.caps.suffix == ".sh")
    for line in ex.header_lines():  # stderr when the export itself goes to stdout
        print(f"autopar export: {line}", file=sys.stderr if out is None else sys.stdout)
    if out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {out}")
    return 0
