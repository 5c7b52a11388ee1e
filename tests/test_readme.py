"""Every Python block of the README runs as pasted, so the README stays true.

Each block that is not a ``# file:`` block runs alone in a fresh namespace (what a fresh
interpreter gives it), in a folder that holds the README's ``# file:`` modules (so
``from model import ...`` works) and nothing else (a table a block loads, it makes), with
a fresh tune store and a short tuning budget. The
``# file:`` blocks are one program, which ``test_checkpoint.py`` runs end to end in fresh
processes. A block marked ``<!-- not run: REASON -->`` is skipped with that reason.
"""

import sys

import pytest

from jax_autotune import config

import readme

BLOCKS = [b for b in readme.blocks() if b.file is None]


def test_the_readme_has_its_blocks_and_its_program():
    assert len(BLOCKS) >= 8
    assert set(readme.files()) == {"model.py", "train_and_save.py", "serve.py"}


@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{b.line}" for b in BLOCKS])
def test_a_readme_block_runs_as_pasted(block, fresh_tuning, tmp_path, monkeypatch, capsys):
    if block.skip:
        pytest.skip(block.skip)
    folder = tmp_path / "reader"
    folder.mkdir()
    for name, code in readme.files().items():
        (folder / name).write_text(code)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    for name in readme.files():  # a module of the README's program, imported fresh here
        monkeypatch.delitem(sys.modules, name.removesuffix(".py"), raising=False)
    config.update("budget_seconds", 0.1)
    try:
        exec(compile(block.code, f"README.md:{block.line}", "exec"), {"__name__": "__main__"})
    finally:
        for name in readme.files():
            sys.modules.pop(name.removesuffix(".py"), None)


def test_a_block_marked_not_run_carries_its_reason_and_files_are_named():
    text = ("<!-- not run: needs a CUDA GPU -->\n```python\nimport a\n```\n"
            "```python\n# file: b.py\nB = 1\n```\n```python\nprint(2)\n```\n")
    marked, program, plain = readme.blocks(text)
    assert (marked.skip, marked.file, marked.line) == ("needs a CUDA GPU", None, 2)
    assert (program.file, program.skip) == ("b.py", None)
    assert (plain.skip, plain.file, plain.code) == (None, None, "print(2)\n")
