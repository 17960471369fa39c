"""Files in and out of a task: a directory as one tar, an output read safely, an input
placed in the task's input dir.

A directory travels as one blob: a tar with sorted entries, no owners and no times, so
the same tree gives the same bytes and the same hash (one name in the signed spec; the
blob store dedups it). Only directories and regular files go in; extraction takes only
those, under the target, with fixed modes (tarfile's ``data`` filter first, then ours).

An output is read from a work dir that the task controls, by a daemon that may be root:
each path component is opened with ``O_NOFOLLOW`` relative to the one above, so a
symlink anywhere in the path is refused, not followed; a regular file with more than
one link is refused too (a hard link to a file the task could not read itself). All of
this is blocking file work, run in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # imported where a tar is made or read: a node that moves none
    import tarfile  # does not hold the module (idle RSS)

__all__ = [
    "ENTRIES_MAX",
    "OutputError",
    "extract_tar",
    "open_output",
    "pack_dir",
    "place_file",
]

#: Entries one directory blob may hold at most (packing and extracting).
ENTRIES_MAX: Final = 100_000
#: Levels of directories below the top at most.
DEPTH_MAX: Final = 32
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputError(ValueError):
    """An output or input that cannot be taken as it is (one line)."""


def _info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    import tarfile

    info = tarfile.TarInfo(name)
    if stat.S_ISDIR(st.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _walk(fd: int, prefix: str, depth: int, count: list[int]) -> Iterator[tuple[str, int]]:
    """(name in the tar, open fd) of every entry below the directory `fd`, sorted;
    each fd is the caller's to close. Refuses links and special files (one line)."""
    if depth > DEPTH_MAX:
        raise OutputError(f"{prefix}: more than {DEPTH_MAX} levels of directories")
    for name in sorted(os.listdir(fd)):
        count[0] += 1
        if count[0] > ENTRIES_MAX:
            raise OutputError(f"more than {ENTRIES_MAX} entries in one directory blob")
        child = _open_entry(fd, name, f"{prefix}{name}")
        st = os.fstat(child)
        yield f"{prefix}{name}", child
        if stat.S_ISDIR(st.st_mode):
            try:
                yield from _walk(child, f"{prefix}{name}/", depth + 1, count)
            finally:
                os.close(child)


def _open_entry(dir_fd: int, name: str, shown: str) -> int:
    """Open `name` below `dir_fd` without following a link: a directory or a regular
    file with one link, else `OutputError`."""
    try:
        fd = os.open(name, _OPEN | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(f"{shown} is a symbolic link: links are not followed") from None
        if exc.errno == errno.ENOENT:
            raise OutputError(f"{shown} does not exist") from None
        raise OutputError(f"{shown}: {exc.strerror}") from None
    st = os.fstat(fd)
    if (stat.S_ISREG(st.st_mode) and st.st_nlink == 1) or stat.S_ISDIR(st.st_mode):
        return fd
    os.close(fd)
    if stat.S_ISREG(st.st_mode):
        raise OutputError(f"{shown} has {st.st_nlink} hard links: only a file with one is taken")
    raise OutputError(f"{shown} is not a regular file or a directory")


def _pack_fd(top: int, out: io.BufferedWriter) -> None:
    import tarfile

    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, fd in _walk(top, "", 0, [0]):
            st = os.fstat(fd)
            info = _info(name, st)
            if info.isdir():
                tar.addfile(info)  # its fd is closed by `_walk` after its children
                continue
            with os.fdopen(fd, "rb") as f:
                tar.addfile(info, f)


def pack_dir(source: Path, dest: Path) -> None:
    """Write `source` (a directory the caller names) as a reproducible tar to `dest`."""
    top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with open(dest, "wb") as out:
            _pack_fd(top, out)
    finally:
        os.close(top)


@contextlib.contextmanager
def open_output(work: Path, path: str, tmp: Path) -> Iterator[tuple[Path, bool]]:
    """The output `path` below `work`, without following any link: yields (a file to
    add to the blob store, whether it is a directory's tar). A regular file is yielded
    as ``/proc/self/fd/N`` of the fd opened safely; a directory is packed into `tmp`.

    Raises:
        OutputError: missing, a link, a hard-linked file, a special file (one line).
    """
    fds: list[int] = []
    try:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds.append(fd)
        parts = path.split("/")
        for i, part in enumerate(parts):
            fd = _open_entry(fd, part, "/".join(parts[: i + 1]))
            fds.append(fd)
            if i < len(parts) - 1 and not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OutputError(f"{'/'.join(parts[: i + 1])} is not a directory")
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            with open(tmp, "wb") as out:
                _pack_fd(fd, out)
            yield tmp, True
        else:
            yield Path(f"/proc/self/fd/{fd}"), False
    finally:
        for fd in fds:
            os.close(fd)
        tmp.unlink(missing_ok=True)


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    import tarfile

    for count, member in enumerate(tar):
        if count >= ENTRIES_MAX:
            raise OutputError(f"more than {ENTRIES_MAX} entries in one directory blob")
        if not (member.isfile() or member.isdir()):
            raise OutputError(f"{member.name}: only files and directories are unpacked")
        checked = tarfile.data_filter(member, "")  # absolute paths, `..`: refused
        yield checked.replace(mode=0o755 if member.isdir() or member.mode & 0o111 else 0o644,
                              uid=0, gid=0, uname="", gname="", deep=False)  # fmt: skip


def extract_tar(blob: Path, dest: Path) -> None:
    """Unpack a directory blob into `dest` (made here): files and directories only,
    nothing outside `dest`, modes 0644/0755.

    Raises:
        OutputError: a member that is not a file or directory, or that points outside.
    """
    import tarfile

    dest.mkdir(mode=0o755)
    try:
        with tarfile.open(blob, mode="r:") as tar:
            for member in _members(tar):
                tar.extract(member, dest, set_attrs=False, filter="fully_trusted")
                target = dest / member.name
                os.chmod(target, member.mode, follow_symlinks=False)
    except (tarfile.TarError, tarfile.FilterError) as exc:
        raise OutputError(f"not a directory blob: {exc}") from None


def place_file(blob: Path, dest: Path) -> None:
    """Put a file blob at `dest`: a hard link (made readable to all: the store's
    directory stays the daemon's), or a copy across file systems."""
    os.chmod(blob, 0o444)
    try:
        os.link(blob, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(blob, dest)
        os.chmod(dest, 0o444)
