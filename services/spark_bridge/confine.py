"""What a request may name on the bridge host: inputs under the input roots, outputs under the state dir.

The bridge reads files on behalf of whoever may call ``spark.*``; without this, a caller reads any file
the bridge user can (``/etc/passwd``), exhausts memory (``/dev/zero``), blocks a worker (a FIFO) or makes
Spark list the whole file system (``/``). So every path is resolved (``..`` and symlinks followed) and
must land under a configured input root; it must be a regular file, or a directory that holds Parquet
files and nothing but regular files and directories. Outputs are a *name*, never a path.

Errors are ``InputRefused`` with a stable id. Their messages echo only what the caller sent (its path
string), never file contents, and say the same for "missing" and "not allowed" outside the roots so
that nothing is learnt about what exists there.

The checks run at submit time and Spark opens the files later: a file swapped between the two (a time
of check to time of use race) is out of reach of this module; input roots must be writable only by
whoever is trusted to publish inputs (docs/security.md).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_PATH_CHARS = 4096
# A Parquet directory with more entries than this is refused rather than walked (a caller could name a
# huge tree inside a root to make the check itself expensive).
MAX_PARQUET_ENTRIES = 10_000
OUTPUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class InputRefused(ValueError):
    """A path the bridge will not use; ``id`` is the error id the caller sees (status ``fail``)."""

    def __init__(self, error_id: str, message: str) -> None:
        super().__init__(message)
        self.id = error_id
        self.message = message


def _shown(raw: str) -> str:
    """The caller's own path string, shortened: echoing it back tells the caller nothing new."""
    return repr(raw if len(raw) <= 200 else raw[:200] + "...")


@dataclass(frozen=True)
class InputRoots:
    """The directories inputs may come from (resolved once, at start)."""

    roots: tuple[Path, ...]

    @classmethod
    def of(cls, roots: Sequence[Path | str]) -> InputRoots:
        if not roots:
            raise ValueError("at least one input root is required")
        resolved = []
        for root in roots:
            path = Path(root).resolve()
            if not path.is_dir():
                raise ValueError(f"input root {root} is not a directory")
            if path == Path(path.anchor):
                # "/" as a root would undo the whole point of roots.
                raise ValueError("the file system root cannot be an input root")
            resolved.append(path)
        return cls(tuple(resolved))

    def _inside(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def resolve(self, raw: str) -> Path:
        """``raw`` resolved; it must name something inside a root. Relative paths are taken from the first root.

        Raises InputRefused ``input_not_allowed`` (outside every root, including through ``..`` or a
        symlink) or ``no_such_input`` (inside a root, missing). Outside the roots both cases answer the
        same, so a caller cannot probe for files.
        """
        if not raw or len(raw) > MAX_PATH_CHARS or "\x00" in raw:
            raise InputRefused("input_not_allowed", f"{_shown(raw)} is not a usable path")
        candidate = Path(raw)
        if not candidate.is_absolute():
            candidate = self.roots[0] / candidate
        # Lexical check first: an absolute path outside the roots is refused without touching the file
        # system at all, so no stat of a foreign path happens on a caller's behalf.
        lexical = Path(os.path.normpath(candidate))
        if not self._inside(lexical):
            raise InputRefused("input_not_allowed", f"{_shown(raw)} is outside the bridge's input roots")
        try:
            # Not strict: a symlink to a missing file outside is followed to its target all the same, so
            # it is refused as outside, like one to an existing file (a planted link probes nothing).
            resolved = candidate.resolve()
        except (OSError, RuntimeError):  # permission denied on a component, symlink loop
            raise InputRefused("input_not_allowed", f"{_shown(raw)} cannot be used") from None
        if not self._inside(resolved):
            # A symlink (or ..) inside a root pointing out of it.
            raise InputRefused("input_not_allowed", f"{_shown(raw)} is outside the bridge's input roots")
        try:
            found = resolved.exists()
        except OSError:  # permission denied inside a root
            raise InputRefused("input_not_allowed", f"{_shown(raw)} cannot be used") from None
        if not found:
            raise InputRefused("no_such_input", f"{_shown(raw)}: no such file in the input roots")
        return resolved

    def regular_file(self, raw: str) -> Path:
        path = self.resolve(raw)
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise InputRefused("bad_input_type", f"{_shown(raw)} is not a regular file")
        return path

    def file_or_parquet_dir(self, raw: str) -> Path:
        """A regular file, or a directory of Parquet files (Spark reads such a directory as one table)."""
        path = self.resolve(raw)
        mode = path.stat().st_mode
        if stat.S_ISREG(mode):
            return path
        if stat.S_ISDIR(mode):
            _check_parquet_dir(path, raw)
            return path
        raise InputRefused("bad_input_type", f"{_shown(raw)} is neither a regular file nor a Parquet directory")


def _check_parquet_dir(path: Path, raw: str) -> None:
    parquet_files = 0
    entries = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in [*dirnames, *filenames]:
            entries += 1
            if entries > MAX_PARQUET_ENTRIES:
                raise InputRefused("bad_input_type", f"{_shown(raw)}: more than {MAX_PARQUET_ENTRIES} entries")
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            # Symlinks are refused outright (Spark would follow them out of the root); so are devices,
            # FIFOs and sockets, which Spark would try to read as data files.
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise InputRefused("bad_input_type", f"{_shown(raw)}: holds something other than files and directories")
            if stat.S_ISREG(mode) and name.endswith(".parquet"):
                parquet_files += 1
    if parquet_files == 0:
        raise InputRefused("bad_input_type", f"{_shown(raw)} is a directory without Parquet files")


def output_dir(outputs_root: Path, name: str) -> Path:
    """``<outputs_root>/<name>``; ``name`` is one plain path component (no separators, no ``..``)."""
    if not OUTPUT_NAME.fullmatch(name) or name in (".", ".."):
        raise InputRefused(
            "bad_output_name",
            f"output_dir {_shown(name)} must be a name (letters, digits, '.', '_', '-'; at most 64), not a path",
        )
    outputs_root.mkdir(parents=True, exist_ok=True)
    target = outputs_root / name
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise InputRefused("bad_output_name", f"output_dir {_shown(name)} is not a directory the bridge made")
    return target
