"""Writing files safely when innet runs as root in a folder others can write.

The rule, for every file innet writes where a user will look (results, tables, plots, --json, --save-topology):

- an output folder is one innet makes new (``os.mkdir``; the default ``results/<timestamp>`` takes the next free
  name, ``-2``, ``-3``, ... on a clash), or an existing one named by the user that is a real folder (not a link),
  owned by the caller (the effective uid) and writable by no one else;
- a file is written to a new temporary name in its folder (created exclusively, ``O_EXCL|O_NOFOLLOW``), then
  renamed over the final name (atomic: a reader sees the old file or the new, never half of one). A rename
  replaces the name, never what a link points to or a file's other hard links; a link, folder or device already
  at the name is refused. The folder is opened once without following a link at its last step and everything
  happens relative to that descriptor, so swapping the folder's path midway redirects nothing;
- a private folder (run records, locks, captures) is 0700 and owned by the caller, or refused.

Every failure is one ``UserError`` line naming the path.
"""

from __future__ import annotations

import os
import pwd
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import IO

from innet.errors import UserError

TAKEN = 1000  # the default folder's suffixes tried (-2 .. -999) before giving up


class NewFolder(str):
    """An output folder name that must be made new: on a clash the next free name is taken (the default
    ``results/<timestamp>``, which another user can predict and plant). It remembers the folder made for it,
    so a run that writes more than once writes into the same one."""

    made: str = ""


def make_output_folder(path: str) -> str:
    """The output folder ``path``, made new, or if it exists and the user named it, checked to be the caller's
    own; a ``NewFolder`` takes ``path-2``, ``path-3``, ... on a clash (once: later calls give the folder made).
    Returns the folder's path."""
    if isinstance(path, NewFolder) and path.made:
        _check_own(path.made)
        return path.made
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot make folder {parent}: {exc.strerror}") from None
    for n in range(1, TAKEN if isinstance(path, NewFolder) else 2):
        candidate = str(path) if n == 1 else f"{path}-{n}"
        try:
            os.mkdir(candidate, 0o755)
        except FileExistsError:
            if isinstance(path, NewFolder):
                continue
        except OSError as exc:
            raise UserError(f"cannot make folder {candidate}: {exc.strerror}") from None
        _check_own(candidate)  # the one made, too: another user may have swapped it already
        if isinstance(path, NewFolder):
            path.made = candidate
        return candidate
    raise UserError(f"cannot make a new folder {path}: it and {path}-2 .. {path}-{TAKEN - 1} all exist")


def make_private_folder(path: str) -> str:
    """Folder ``path`` as 0700, owned by the caller: made so, or an existing one of the caller's tightened to
    0700; one of anyone else's, or a link, is refused."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"cannot make folder {path}: {exc.strerror}") from None
    fd = _open_folder(path, path)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UserError(f"{path} belongs to {_user(st.st_uid)}, not {_user(os.geteuid())}: innet keeps its "
                            "private files only in a folder of its own; remove it or have its owner remove it")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


@contextmanager
def writing(path: str, mode: int = 0o666) -> Iterator[IO[bytes]]:
    """A binary file to write ``path``'s new content into: a new temporary file beside it, renamed to ``path``
    when the block ends without an error (removed when it raises). ``mode`` before the umask."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write {path}: cannot make folder {folder}: {exc.strerror}") from None
    dir_fd = _open_folder(folder, path)
    try:
        _check_target(dir_fd, name, path)
        tmp, fd = _new_temp(dir_fd, name, mode)
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)


def write_bytes_atomic(path: str, data: bytes, mode: int = 0o666) -> None:
    """``data`` as file ``path``, atomically (see ``writing``)."""
    with writing(path, mode) as fh:
        fh.write(data)


def write_text_atomic(path: str, text: str, mode: int = 0o666) -> None:
    """``text`` (UTF-8) as file ``path``, atomically (see ``writing``)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode)


def save_figure(fig: object, path: str, **kwargs: object) -> None:
    """A matplotlib figure saved as ``path`` (format from its extension), atomically: savefig into the
    temporary file, then the rename."""
    with writing(path) as fh:
        fig.savefig(fh, format=os.path.splitext(path)[1].lstrip(".") or "png", **kwargs)  # type: ignore[attr-defined]


def open_new(path: str, mode: int = 0o600) -> IO[bytes]:
    """A new file ``path`` opened for binary writing: created exclusively, never through a link; an existing
    file or link at ``path`` is refused."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise UserError(f"cannot write {path}: it exists already (innet makes its files new)") from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    return os.fdopen(fd, "wb")


def _open_folder(folder: str, path: str) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(folder):
            raise UserError(f"cannot write {path}: {folder} is a symbolic link; innet does not write through "
                            "links: name the folder itself") from None
        if os.path.exists(folder):
            raise UserError(f"cannot write {path}: {folder} is not a folder") from None
        raise UserError(f"cannot write {path}: {folder}: {exc.strerror}") from None


def check_outputs(folders: Iterable[str], files: Iterable[str]) -> None:
    """Before a run: each output folder in ``folders`` and file in ``files`` can be written by the rules above,
    or a UserError says why not, before any work rather than after it. Nothing is made."""
    for out in folders:
        if out and not isinstance(out, NewFolder) and os.path.lexists(out):
            _check_own(out)
    for path in files:
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.islink(folder):
            raise UserError(f"cannot write {path}: {folder} is a symbolic link; innet does not write through "
                            "links: name the folder itself")
        if os.path.lexists(path):
            _check_kind(os.lstat(path), path)


def _check_target(dir_fd: int, name: str, path: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    _check_kind(st, path)


def _check_kind(st: os.stat_result, path: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"cannot write {path}: it is a symbolic link; innet does not write through links: "
                        "remove it or name another file")
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"cannot write {path}: it is a folder; name a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"cannot write {path}: it is not a regular file (a device, FIFO or socket); name a file")


def _new_temp(dir_fd: int, name: str, mode: int) -> tuple[str, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return tmp, os.open(tmp, flags, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
    raise FileExistsError(17, "no free temporary name")


def _check_own(path: str) -> None:
    """``path`` is a real folder of the caller's that no one else can write, or a UserError says why not."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"{path} is a symbolic link; innet writes only into a real folder: name the folder itself")
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path} exists and is not a folder: name a new folder")
    if st.st_uid != os.geteuid():
        raise UserError(f"{path} belongs to {_user(st.st_uid)}, not {_user(os.geteuid())}: innet writes only into "
                        "a folder it makes or one of your own; name a new folder")
    if st.st_mode & 0o022:
        raise UserError(f"{path} can be written by others (mode {stat.S_IMODE(st.st_mode):o}): innet writes only "
                        "into a folder no one else can write; chmod go-w it or name a new folder")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
