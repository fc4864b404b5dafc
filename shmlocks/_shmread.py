"""Reading /dev/shm as untrusted input: the one way every reader of it opens an entry.

/dev/shm is world-writable: any local user can put a FIFO there (an ``open()`` blocks
until a writer comes), a symlink, a directory, or a file that looks like a segment and
shrinks while it is mapped (a read of a mapping past the new end is SIGBUS). So, for the
listing, the deadlock look of every waiter, every CLI command, the pytest plugin's leak
check and the CI's leftover check:

- an entry is opened with ``O_NOFOLLOW|O_NONBLOCK`` (a symlink fails, a FIFO does not
  block) and read only if ``fstat`` of what was opened says it is a regular file owned by
  a trusted user: this process's uid, root, and the uids (or user names) listed in
  ``SHMLOCKS_TRUST_UIDS`` (comma- or space-separated);
- its bytes are read with ``pread`` into a private copy, never mapped: a file that
  shrinks gives a short read (``Shrunk``), never a signal.

Standard library only, so that .ci/run can load this file by path before shmlocks is
built (it does, for its check of the segments a run left behind).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Callable, Container, Iterable, Mapping

TRUST_ENV = "SHMLOCKS_TRUST_UIDS"
# The two facts a reader needs before the compiled core exists (.ci/run loads this file by
# path before the build): shm_layout.h's SHM_MAGIC as it sits on disk, and the directory
# (region.pxi's SHM_DIR). tests/test_layout.py holds both equal to the core's.
MAGIC = b"SHMLOCK1"
SHM_DIR = "/dev/shm"

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class Refused(OSError):
    """An entry that is not read: not a regular file, or owned by an untrusted user.
    ``why`` says which, without the path."""

    why: str = ""


class Shrunk(OSError):
    """A file shorter than what it says it holds: truncated before or while it was read."""


def _refused(path: str, why: str) -> Refused:
    e = Refused(f"{path}: {why}")
    e.why = why
    return e


def trusted_uids() -> frozenset[int]:
    """The owners whose files in /dev/shm are read: this process's real and effective
    uid, root, and those listed in ``SHMLOCKS_TRUST_UIDS`` (uids or user names; an
    unknown name is ignored)."""
    uids = {os.getuid(), os.geteuid(), 0}
    for word in os.environ.get(TRUST_ENV, "").replace(",", " ").split():
        if word.isdigit():
            uids.add(int(word))
            continue
        try:
            uids.add(pwd.getpwnam(word).pw_uid)
        except KeyError:
            pass
    return frozenset(uids)


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check(st: os.stat_result, trusted: frozenset[int] | None = None) -> str | None:
    """Why a file with status ``st`` is not read, or None if it may be."""
    if not stat.S_ISREG(st.st_mode):
        for test, what in _KINDS:
            if test(st.st_mode):
                return f"not a regular file ({what})"
        return "not a regular file"
    if st.st_uid not in (trusted_uids() if trusted is None else trusted):
        return f"owned by uid {st.st_uid}, a user not trusted ({TRUST_ENV} widens it)"
    return None


def open_file(path: str, trusted: frozenset[int] | None = None) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading the safe way: (fd, its fstat). ``Refused`` (with the
    reason) for a symlink, anything not a regular file, or an untrusted owner;
    ``FileNotFoundError`` and other ``OSError`` as the open gives them."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the last component is a symlink (O_NOFOLLOW)
            raise _refused(path, "not a regular file (a symbolic link)") from None
        if e.errno == errno.ENXIO:  # a socket
            raise _refused(path, "not a regular file (a socket)") from None
        raise
    try:
        st = os.fstat(fd)
        why = check(st, trusted)
        if why:
            raise _refused(path, why)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def pread_exact(fd: int, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset``, read with pread (``Shrunk`` if the file ends first)."""
    chunks = []
    got = 0
    while got < n:
        b = os.pread(fd, n - got, offset + got)
        if not b:
            raise Shrunk(f"it ends before byte {offset + n} (shrunk while read?)")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_head(path: str, n: int, trusted: frozenset[int] | None = None) -> bytes:
    """Up to ``n`` bytes from the start of ``path``, read the safe way (``open_file``)."""
    fd, _st = open_file(path, trusted)
    try:
        return os.pread(fd, n, 0)
    finally:
        os.close(fd)


def scan(directory: str = SHM_DIR, head: int = len(MAGIC)) -> tuple[dict[str, bytes], list[str]]:
    """Every shmlocks segment in ``directory``: ({name: its first ``head`` bytes}, notes).
    See ``entries``."""
    found, notes = entries(directory, head)
    return {name: data for name, (data, _st) in found.items()}, notes


def entries(
    directory: str = SHM_DIR, head: int = len(MAGIC)
) -> tuple[dict[str, tuple[bytes, os.stat_result]], list[str]]:
    """Every shmlocks segment in ``directory``: ({name: (its first ``head`` bytes, the
    fstat of the file read)}, notes). See ``walk``."""
    found: dict[str, tuple[bytes, os.stat_result]] = {}

    def keep(name: str, fd: int, st: os.stat_result, data: bytes) -> None:
        found[name] = (data, st)

    notes = walk(keep, directory, head)
    return found, notes


def listing(directory: str = SHM_DIR) -> list[str]:
    """The names of the entries of ``directory`` that readdir says are regular files (a
    FIFO, a symlink, a directory never are), sorted: the entries ``walk`` opens. [] if
    the directory cannot be read."""
    names = []
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        names.append(e.name)
                except OSError:
                    continue  # gone since (a file system whose readdir gives no type)
    except OSError:
        return []
    names.sort()
    return names


def walk(
    visit: Callable[[str, int, os.stat_result, bytes], None],
    directory: str = SHM_DIR,
    head: int = len(MAGIC),
    skip: Container[str] = (),
    names: Iterable[str] | None = None,
    heads: Mapping[str, int] | None = None,
) -> list[str]:
    """Call ``visit(name, fd, st, data)`` for every shmlocks segment in ``directory``, in
    name order, while its file is open: ``fd`` read-only (``visit`` may pread it; it is
    closed after), ``st`` its fstat, ``data`` its first ``head`` bytes (fewer if the file
    is shorter; the magic checked). One open per entry, so a command that reads the
    segments reads each through this one open (the machine-wide commands at 10,000
    segments). Returns the notes.

    An entry is opened only if readdir says it is a regular file (``listing``: a FIFO
    never is), with ``O_NOFOLLOW|O_NONBLOCK`` (replaced meanwhile by a symlink or a FIFO:
    it fails, or does not block), and read only if its fstat says it is a regular file
    owned by a trusted user (``check``); a segment (the shmlocks magic at its start) of an
    untrusted user is left out with a note saying so (its first 8 bytes read by pread to
    tell: nothing else). Nothing else is reported: /dev/shm holds other programs' files
    too. What ``visit`` raises is the caller's. The names in ``skip`` are not opened (the
    caller read them already). ``names``: the entries to open, from an earlier
    ``listing`` of ``directory`` that the caller knows to be current (``shmlocks top``:
    the directory unchanged since), instead of listing it again. ``heads``: how much to
    read of the named entries, instead of ``head`` (what the caller read of each
    before)."""
    trusted = trusted_uids()
    notes: list[str] = []
    prefix = os.path.join(directory, "")
    magic, nmagic = MAGIC, len(MAGIC)
    for name in listing(directory) if names is None else names:
        if name in skip:
            continue
        try:
            fd = os.open(prefix + name, _OPEN_FLAGS)
        except OSError:
            continue  # gone, unreadable, or replaced by a symlink or a socket since
        try:
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                ok = st.st_uid in trusted
                # an untrusted owner's file is read only to tell a segment from other
                # files (for the note): its first 8 bytes, by pread
                n = head if heads is None else heads.get(name, head)
                data = os.pread(fd, n if ok else nmagic, 0)
            except OSError:
                continue
            if not data.startswith(magic):
                continue
            if ok:
                visit(name, fd, st, data)
            else:
                notes.append(f"skipped {name}: {check(st, trusted)}")
        finally:
            os.close(fd)
    return notes
