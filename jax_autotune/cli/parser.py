"""Every command's arguments, and the checks they share; nothing heavy is imported here.

    >>> args = build_parser().parse_args(["keys", "1024T", "--dtype", "bfloat16"])
    >>> args.handler
    ('keys', 'run')

``--help`` and ``--version`` answer from this module alone (jax is not imported). A
command's handler, ``(module, function)`` of ``jax_autotune.cli``, is imported only when
the command runs. A shape or dtype argument is checked by the same function in every
command, so the same bad argument is the same usage error (exit status 2, one line).
"""

from __future__ import annotations

import argparse
import re
from importlib import metadata

from jax_autotune._version import __version__
from jax_autotune.columns import LINE_WIDTH
from jax_autotune.key import Level

SHOW_HELP = f"""One line per tuned decision, a block per device:
  id        the decision's id (`jax-autotune explain ID` prints all of it)
  key       its key: sizes bucketed (one key serves every shape of its bucket),
            dtypes, layouts (N/T), precision, grouping, epilogue
  winner    the kernel that runs the key
  time      the winner's time; xla_dot: XLA's own op's (its dot; for a grouped
            matmul its ragged_dot); speedup: xla_dot / time
  roofline  the roofline limit over the winner's time. The limit is the time the
            key's operations and bytes take at the device's measured peaks, over
            the tuning level's threshold, plus the launch overhead; 1.00x or more
            is within it, and a small key, whose limit is mostly launch overhead,
            reads far above 1
  samples   the winner's kept timings (--wide)
  outcomes  every candidate's outcome, counted (--wide)
Lines are cut to {LINE_WIDTH} characters (the winner, then the key, ending in …)."""

EXIT_STATUS = ("exit status: 0 done, 1 the store cannot be used (clear: or the deletion was not "
               "confirmed), 2 a bad argument")

_SHAPE = re.compile(r"^(\d+)(?:x(\d+)x(\d+)(?:x(\d+))?)?(T?)$")


class PlainHelpFormatter(argparse.HelpFormatter):
    """Help texts come from docstrings: show them without reStructuredText's double backticks."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(text.replace("``", ""))

    def _expand_help(self, action) -> str:
        return super()._expand_help(action).replace("``", "")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help is plain text (its sub-parsers' too)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)


# ---------------------------------------------------------------- shared argument types

def parse_shape(text: str) -> tuple[int, int, int, int, bool]:
    """``'1024T'`` -> (batch, m, n, k, transpose_b); a ValueError names the bad text."""
    match = _SHAPE.match(text.strip())
    if not match:
        raise ValueError(f"shape {text!r}: expected S, MxNxK or BxMxNxK, optionally ending in T")
    a, b, c, d, t = match.groups()
    numbers = [int(x) for x in (a, b, c, d) if x is not None]
    if len(numbers) == 1:
        batch, (m, n, k) = 1, numbers * 3
    elif len(numbers) == 3:
        batch, (m, n, k) = 1, numbers
    else:
        batch, m, n, k = numbers
    if min(batch, m, n, k) < 1:
        raise ValueError(f"shape {text!r}: sizes must be >= 1")
    return batch, m, n, k, bool(t)


def shape_arg(text: str) -> str:
    """An argparse ``type``: ``text`` if it is a shape (see ``parse_shape``), else a usage error."""
    try:
        parse_shape(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def dtype_arg(text: str) -> str:
    """An argparse ``type``: the dtype's name (``'bf16'`` is not one, ``'bfloat16'`` is),
    checked as ``warmup(dtype=...)`` checks it."""
    from jax_autotune.problem import dtype_named  # jax: only when a command takes --dtype
    try:
        return dtype_named(text)
    except TypeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _shape_arguments(parser) -> None:
    """The positional shapes and ``--dtype`` that ``keys`` and ``shapes`` both take."""
    parser.add_argument("shapes", nargs="+", type=shape_arg,
                        help="S, MxNxK or BxMxNxK, with T for a transposed rhs")
    parser.add_argument("--dtype", default="float32", type=dtype_arg,
                        help="element type (default float32)")


def _device_argument(parser, what: str) -> None:
    """``--device FP``: checked against the store and this process when the command runs
    (``table.unknown_device``), the same way for every command."""
    parser.add_argument("--device", default=None, metavar="FP",
                        help=f"{what} (a fingerprint as show prints it)")


def _version() -> str:
    try:
        jax = f" (jax {metadata.version('jax')})"
    except metadata.PackageNotFoundError:
        jax = ""
    return f"jax-autotune {__version__}{jax}"


# ---------------------------------------------------------------- the commands

def build_parser() -> argparse.ArgumentParser:
    """The ``jax-autotune`` parser; each command sets ``handler`` = (module, function)."""
    parser = Parser(prog="jax-autotune",
                    description="The jax-autotune command line (also python -m jax_autotune).")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    keys = commands.add_parser("keys", help="print the tune keys of some shapes",
                               description="Print tune keys the way the reference page does.")
    _shape_arguments(keys)
    keys.add_argument("--level", choices=[lv.value for lv in Level], default=None,
                      help="bucketing level (default: the configured level)")
    keys.add_argument("--all-fields", action="store_true", help="print every key field")
    keys.set_defaults(handler=("keys", "run"))

    shapes = commands.add_parser("shapes", help="the reference's cold/warm experiment",
                                 description="The reference's cold/warm experiment, on this "
                                             "machine: two fresh processes sharing one new store.")
    _shape_arguments(shapes)
    shapes.add_argument("--cache-dir", default=None,
                        help="folder in which a new, empty subfolder holds the experiment's "
                             "store; nothing else in it is touched (default: a new temp folder)")
    shapes.add_argument("--json", default=None, help="also write the measurements to this file")
    shapes.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    shapes.set_defaults(handler=("shapes", "run"))

    show = commands.add_parser(
        "show", epilog=EXIT_STATUS, help="list tuned decisions", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=SHOW_HELP)
    _device_argument(show, "only this device's decisions")
    show.add_argument("--key", default=None, help="only keys containing this text (or this id)")
    show.add_argument("--wide", action="store_true",
                      help=f"every column, nothing cut (default: lines of {LINE_WIDTH} characters at most)")
    show.set_defaults(handler=("table", "run_show"))

    explain = commands.add_parser("explain", epilog=EXIT_STATUS, help="every candidate of one decision")
    explain.add_argument("key", help="an id or key from `show`, a canonical key, or a unique "
                                     "substring of one")
    _device_argument(explain, "only this device's decisions")
    explain.set_defaults(handler=("table", "run_explain"))

    export = commands.add_parser("export", epilog=EXIT_STATUS, help="write the tune table to a JSON file",
                                 description="Write the tune table to a new JSON file, with the "
                                             "permissions the umask gives; its folder must exist.")
    export.add_argument("path", help="output file, e.g. tune_table.json")
    export.add_argument("--force", action="store_true", help="replace the file if it exists")
    _device_argument(export, "only this device's decisions")
    export.set_defaults(handler=("table", "run_export"))

    imported = commands.add_parser("import", epilog=EXIT_STATUS, help="load a JSON tune table into the store")
    imported.add_argument("path", help="a file written by `export` or TuneTable.save")
    imported.set_defaults(handler=("table", "run_import"))

    clear = commands.add_parser("clear", epilog=EXIT_STATUS, help="delete stored decisions (probes stay)",
                                description="Delete stored decisions; the throughput probes stay. "
                                            "On a terminal it asks first; otherwise it needs --yes.")
    _device_argument(clear, "only this device's decisions")
    clear.add_argument("--compilation-cache", action="store_true",
                       help="also delete the compiled executables kept beside the store")
    clear.add_argument("-y", "--yes", action="store_true", help="delete without asking")
    clear.set_defaults(handler=("table", "run_clear"))
    return parser
