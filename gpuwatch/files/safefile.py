"""Opening files where someone else may have put something: never follow a link, never block, never read forever.

The agent runs as root on many nodes. One that follows a symbolic link creates a file wherever the link points (a
lock file at /etc/nologin); one that opens a FIFO waits forever for a writer; one that reads /dev/zero reads until
memory runs out. Every open here refuses a link as the last path component (O_NOFOLLOW) unless told otherwise,
never blocks on a FIFO (O_NONBLOCK), checks with fstat that it got a regular file, and reads a bounded number of
bytes. A refusal is an UnsafeFileError (an OSError) whose message names the path and what it is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_ALWAYS = os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFileError(OSError):
    """The path is a link, not a regular file, or larger than allowed; str() says which."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def describe_mode(mode: int) -> str:
    """What kind of file a mode is, in words, for messages."""
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"


def open_regular(path: Path | str, flags: int, mode: int = 0o644, *, follow_links: bool = False) -> int:
    """A descriptor of the regular file at ``path`` (created with ``mode`` when ``flags`` has O_CREAT).

    The path is looked at before it is opened (so a device is never opened at all) and the descriptor after (so a
    swap in between is caught); a link is never followed unless ``follow_links``."""
    try:
        before = os.stat(path, follow_symlinks=follow_links)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(before.st_mode):
            raise _not_regular(path, before.st_mode)
    try:
        fd = os.open(path, flags | _ALWAYS | (0 if follow_links else os.O_NOFOLLOW), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise _not_regular(path, stat.S_IFLNK) from None
        raise
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode):
            raise _not_regular(path, after.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: Path | str, *, max_bytes: int, follow_links: bool = False) -> bytes:
    """The whole content of a regular file of at most ``max_bytes``; UnsafeFileError for anything else."""
    fd = open_regular(path, os.O_RDONLY, follow_links=follow_links)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise _too_large(path, max_bytes)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # it grew while being read
                raise _too_large(path, max_bytes)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _not_regular(path: Path | str, mode: int) -> UnsafeFileError:
    kind = describe_mode(mode)
    code = errno.ELOOP if stat.S_ISLNK(mode) else errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    hint = ", which is never followed" if stat.S_ISLNK(mode) else ", not a regular file"
    return UnsafeFileError(code, f"{path} is a {kind}{hint}")


def _too_large(path: Path | str, max_bytes: int) -> UnsafeFileError:
    return UnsafeFileError(errno.EFBIG, f"{path} is larger than {max_bytes:,} bytes, more than such a file ever holds")
