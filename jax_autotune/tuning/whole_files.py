"""Files that many processes share on a network filesystem (NFS, Lustre), each seen whole
or not at all: written to a temporary name, fsynced, renamed into place; created once
with a hard link; removed only after a check made on the file itself.

    >>> from jax_autotune.tuning.whole_files import create_once, read_whole, replace_whole
    >>> create_once(folder / "a.claim", b'{"owner": "me"}')        # True: this call made it
    True
    >>> create_once(folder / "a.claim", b'{"owner": "you"}')       # it exists: not replaced
    False
    >>> replace_whole(folder / "a.json", b"{}"); read_whole(folder / "a.json", 2**20, print)
    b'{}'

The names a temporary or set-aside file takes start with a dot, beside the file they stand
for: a reader of the folder skips dot files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import Callable

from jax_autotune.errors import NotARegularFileError
from jax_autotune.files import open_regular

__all__ = ["DENIED", "create_once", "read_whole", "remove_if", "replace_whole", "sync_folder"]

DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)  # what a write into a read-only folder raises
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)


def read_whole(path: Path, limit: int, unreadable: Callable[[Path, OSError], None]) -> bytes | None:
    """At most ``limit`` + 1 bytes of ``path``; None when it is missing (or was replaced by
    another host while it was opened: ESTALE); b'' after ``unreadable(path, error)`` when
    it is no regular file (never waiting on a FIFO) or this process may not read it."""
    try:
        with open_regular(path) as f:
            return f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ESTALE:
            return None
        if isinstance(err, NotARegularFileError) or err.errno in DENIED + (errno.EISDIR,):
            unreadable(path, err)
            return b""
        raise


def sync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable; some filesystems cannot, which is fine."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temporary(path: Path, data: bytes) -> Path:
    """A new file beside ``path`` holding ``data``, on disk (fsynced)."""
    temporary = path.with_name(f".{path.stem}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temporary)
        raise
    os.close(fd)
    return temporary


def replace_whole(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` whole: a temporary file, then a rename."""
    temporary = _temporary(path, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def create_once(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` whole unless it exists: whether this call made it.
    A hard link fails on an existing name; after a lost NFS reply the retried link says
    EEXIST for the link it made, which the temporary file's link count tells apart."""
    temporary = _temporary(path, data)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return os.stat(temporary).st_nlink == 2
    except OSError as err:
        if err.errno not in _NO_LINKS:
            raise
        try:  # a filesystem without hard links: exclusive, but seen before it is whole
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def remove_if(path: Path, judge: Callable[[bytes], bool], read: Callable[[Path], bytes | None]) -> bool:
    """Remove ``path`` when ``judge(its bytes)`` says so, safely against others doing the
    same: renamed aside first (one process wins), read there with ``read``, judged, and put
    back when it is not the file judged (a newer one made meanwhile stands). Whether it
    was removed.

        >>> remove_if(claim, lambda data: data == stale, read)   # take over a lapsed claim
        True
    """
    aside = path.with_name(f".{path.name}.{secrets.token_hex(6)}.aside")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        data = read(aside) or b""
        if judge(data):
            return True
        create_once(path, data)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(aside)
