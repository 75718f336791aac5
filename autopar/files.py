"""Files autopar writes: whole or not at all, where the user said, checked before the work.

``check_output`` is what a command runs on its ``-o FILE`` when it parses it (before a solve, a trace, a
calibration), ``write_atomic`` / ``replace_atomic`` what writes it afterwards (they check again, for the API):

- a regular file, or a new one in a folder that exists and can be written: written to a temporary file in the
  same folder and renamed over it, so no reader sees half a file; the result has the mode ``open(path, "w")``
  would give it (an existing file keeps its mode, a new one gets 0666 less the umask);
- a symbolic link: followed, its target written as above (the link stays);
- a folder, a device, a pipe or a socket (/dev/full, /dev/null), a missing folder (never created silently), a
  folder that cannot be written (/proc, a read-only mount) or a read-only file: one line, AutoparError.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from autopar.errors import AutoparError

IMAGE_FORMATS = ("png", "svg", "pdf")  # what the figures (autopar plot, sweep -o) are written as, by file name


def check_output(path: str | Path, flag: str = "-o") -> Path:
    """The file that writing ``path`` will replace (a symlink's target), checked as the module docstring says;
    raises AutoparError naming ``flag`` and what to do."""
    given = Path(path)
    target = Path(os.path.realpath(given))  # every link followed; a dangling one gives the file it would create
    where = (f"{flag} {given}" if flag else str(given)) + (f" (a link to {target})" if given.is_symlink() else "")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:  # a loop of links, a component that is not a folder
        raise AutoparError(f"{where}: cannot write there ({err.strerror}); choose another path") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise AutoparError(f"{where} is a folder: name a file in it (e.g. {given / 'out.json'})")
    if mode is not None and not stat.S_ISREG(mode):
        raise AutoparError(f"{where} is not a regular file (a device, pipe or socket): name a file to write")
    folder = target.parent
    if not folder.is_dir():
        raise AutoparError(f"{where}: folder {folder} does not exist; create it first or choose another path")
    try:  # os.access says yes to root everywhere, and /proc refuses new files even to root: try one
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
    except OSError as err:
        raise AutoparError(f"{where}: cannot write in folder {folder} ({err.strerror}); choose another path") from None
    os.close(fd)
    os.unlink(probe)
    if mode is not None and not os.access(target, os.W_OK):
        raise AutoparError(f"{where} is read-only: make it writable or choose another path")
    return target


def check_folder(path: str | Path, flag: str) -> Path:
    """A folder autopar will write into (``flag``: the option naming it, e.g. --checkpoint-dir), checked before
    the work: an existing folder that can be written, or a new one (made when first written) under the nearest
    existing folder, which must be writable. AutoparError, one line, for a file or a device in its place, a
    file on its way, or a place that cannot be written."""
    given = Path(path)
    target = Path(os.path.realpath(given))
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    where = f"{flag} {given}"
    if existing is None:  # only a broken root: nothing exists
        raise AutoparError(f"{where}: no part of it exists; choose another folder")
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "a device, pipe or socket"
        subject = where if existing == target else f"{where}: {existing}"
        raise AutoparError(f"{subject} is {what}, not a folder: name a folder (it is created when missing)")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".autopar-", suffix=".probe")
    except OSError as err:
        raise AutoparError(f"{where}: cannot write in {existing} ({err.strerror}); choose another folder") from None
    os.close(fd)
    os.unlink(probe)
    return target


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (threads may be creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_atomic(path: str | Path, write: Callable[[str], None], *, suffix: str = ".tmp",
                   flag: str = "") -> Path:
    """``write(temporary_path)`` fills a temporary file beside ``path``'s target, which then replaces it (see the
    module docstring); returns the file written. ``suffix``: the temporary file's, for writers that read it."""
    target = check_output(path, flag)
    mode = stat.S_IMODE(os.stat(target).st_mode) if target.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # mkstemp makes the file private (0600); a plan or a figure is not
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_atomic(path: str | Path, text: str, *, flag: str = "") -> Path:
    """Write ``text`` to ``path`` whole or not at all (replace_atomic)."""
    return replace_atomic(path, lambda tmp: Path(tmp).write_text(text), flag=flag)


def read_json(path: str | Path, what: str, *, max_bytes: int, hint: str) -> object:
    """The JSON document in the file ``path`` (a ``what``: "plan", "profile"), read only when it is a regular text
    file of at most ``max_bytes``; AutoparError, one line ending with ``hint`` (where such a file comes from),
    for a missing file, a folder, a device, a binary or oversized file, or text that is not JSON."""
    path = Path(path)
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise AutoparError(f"{what} file not found: {path}") from None
    except OSError as err:
        raise AutoparError(f"{path}: cannot read the {what} ({err.strerror})") from None
    mode, size = found.st_mode, found.st_size
    if stat.S_ISDIR(mode):
        raise AutoparError(f"{path} is a folder, not a {what} file: {hint}")
    if not stat.S_ISREG(mode):
        raise AutoparError(f"{path} is not a regular file (a device, pipe or socket): {hint}")
    if size > max_bytes:
        raise AutoparError(f"{path} is {size / 2**20:.1f} MiB, more than a {what} file holds ({max_bytes / 2**20:.0f} "
                           f"MiB at most): {hint}")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise AutoparError(f"{path}: cannot read the {what} ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise AutoparError(f"{path} is not a text file (binary data at byte {err.start}): {hint}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise AutoparError(f"{path}:{err.lineno}: not valid JSON ({err.msg}): {hint}") from None
    except RecursionError:
        raise AutoparError(f"{path}: JSON nested too deeply for a {what}: {hint}") from None
