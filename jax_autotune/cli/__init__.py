"""The ``jax-autotune`` command line (also ``python -m jax_autotune``).

    $ jax-autotune keys 512 768 1000 1024 1025 2048 1024T
    $ jax-autotune shapes 1024 768 1000 2048
    $ jax-autotune show | explain KEY | export PATH | import PATH | clear

Each command module (``keys``, ``shapes``, ``table``) registers its sub-parser with
``register(subparsers)`` and sets ``func(args) -> int`` as the handler.
"""

from __future__ import annotations

import argparse
import sys

from jax_autotune.cli import keys, shapes, table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax-autotune", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (keys, shapes, table):
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
