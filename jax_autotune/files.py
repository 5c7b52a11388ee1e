"""Reading a file the user names: only a regular file, and never blocking on anything else.

``open()`` on a FIFO waits for a writer forever, and a device such as ``/dev/zero`` never
ends; a tune table, a checkpoint's table or a config file is only ever read from a
regular file. The file is opened without blocking and checked on that descriptor, so
nothing can be swapped in between the check and the read.

    >>> from jax_autotune.files import open_regular
    >>> with open_regular("tune_table.json") as f:
    ...     text = f.read()
    >>> open_regular("/tmp/a_fifo")
    NotARegularFileError: /tmp/a_fifo: not a regular file (a FIFO)
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO
from jax_autotune.errors import NotARegularFileError

__all__ = ["NotARegularFileError", "check_regular", "open_regular"]

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading in binary mode when it is a regular file (a link to one is
    followed); ``NotARegularFileError`` otherwise, without waiting on a FIFO. Other
    failures (missing, no permission) raise as ``open`` raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _refuse_other(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike) -> None:
    """``NotARegularFileError`` when ``path`` exists and is not a regular file: for a file
    another library opens by name (SQLite), which would block on a FIFO.

        >>> check_regular("/home/me/.cache/jax_autotune/default.db")    # None: fine or missing
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    _refuse_other(path, mode)


def _refuse_other(path: str | os.PathLike, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise NotARegularFileError(f"{os.fspath(path)}: not a regular file ({kind})")
