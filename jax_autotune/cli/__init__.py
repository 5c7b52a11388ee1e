"""The ``jax-autotune`` command line (also ``python -m jax_autotune``).

    $ jax-autotune keys 512 768 1000 1024 1025 2048 1024T
    $ jax-autotune shapes 1024 768 1000 2048
    $ jax-autotune show | explain KEY | export PATH [--force] | import PATH | clear [--yes]
    $ jax-autotune --version

``parser`` holds every command's arguments and their shared checks and imports nothing
heavy, so ``--help`` and ``--version`` answer without jax; a command's module (``keys``,
``shapes``, ``table``) is imported when it runs. A bad argument or setting is an error (exit
status 2, one line); warnings print as one line each; a reader that closes the pipe early
(``show | head -1``) ends the output quietly.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

from jax_autotune.cli.parser import build_parser
from jax_autotune.errors import ConfigError

__all__ = ["build_parser", "main"]


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).removeprefix("jax_autotune: ")
    print(f"jax-autotune: warning: {text}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, function = args.handler
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            run = getattr(importlib.import_module(f"jax_autotune.cli.{module}"), function)
            code = int(run(args) or 0)
            sys.stdout.flush()
        except ConfigError as err:  # a bad setting (JAX_AUTOTUNE_*): what is wrong, not a traceback
            print(f"jax-autotune: error: {err}", file=sys.stderr)
            return 2
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
