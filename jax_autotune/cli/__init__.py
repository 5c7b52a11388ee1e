"""The ``jax-autotune`` command line (also ``python -m jax_autotune``).

    $ jax-autotune keys 512 768 1000 1024 1025 2048 1024T
    $ jax-autotune shapes 1024 768 1000 2048
    $ jax-autotune show | explain KEY | export PATH | import PATH | clear

Each command module (``keys``, ``shapes``, ``table``) registers its sub-parser with
``register(subparsers)`` and sets ``func(args) -> int`` as the handler. A bad argument is
a usage error (exit status 2, one line); warnings print as one line each; a reader that
closes the pipe early (``show | head -1``) ends the output quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from jax_autotune.cli import keys, shapes, table


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


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="jax-autotune", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in (keys, shapes, table):
        module.register(subparsers)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).removeprefix("jax_autotune: ")
    print(f"jax-autotune: warning: {text}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            code = int(args.func(args) or 0)
            sys.stdout.flush()
        except BrokenPipeError:
            # the reader stopped reading: send what is left to /dev/null, so the interpreter's
            # final flush cannot fail again
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
