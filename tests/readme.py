"""The README's Python blocks, as tests read them.

A block is a fenced ``python`` code block. One whose first line is ``# file: NAME`` is a
file of a program (``model.py`` ...); any other runs alone, as pasted into a fresh
interpreter, beside those files. A block that cannot run on a CPU is marked on the line
before its fence with ``<!-- not run: REASON -->``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"(?:<!-- not run: (?P<skip>.+?) -->\n)?```python\n(?P<code>.*?)```", re.S)
_FILE = re.compile(r"# file: (\S+)\n")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    code: str
    file: str | None  # the NAME of a ``# file: NAME`` block
    skip: str | None  # why it does not run here


def blocks(text: str | None = None) -> list[Block]:
    text = README.read_text() if text is None else text
    found = []
    for match in _BLOCK.finditer(text):
        code = match["code"]
        name = _FILE.match(code)
        line = text.count("\n", 0, match.start("code"))  # the fence's line
        found.append(Block(line, code, name[1] if name else None, match["skip"]))
    return found


def files() -> dict[str, str]:
    """The ``# file: NAME`` blocks: {NAME: code}."""
    return {b.file: b.code[len(f"# file: {b.file}\n"):] for b in blocks() if b.file}
