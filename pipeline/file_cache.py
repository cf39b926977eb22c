"""Values computed from a file (its parsed content, its sha256, a model loaded from it), kept while the
file's modification time and size stay the same: a worker process that runs many shards reads each file
once, and a file that changes is read again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class FileCache(Generic[T]):
    """At most `max_entries` files' values; when full, the next new file empties it (no bookkeeping on the
    hot path: the sizes used are far above a run's working set, or 1 for a single current file)."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: dict[str, tuple[tuple[int, int], T]] = {}

    def get(self, path: str | Path, compute: Callable[[], T]) -> T:
        """The value of `path` (a FileNotFoundError when it is missing), `compute()` when the file is new
        or changed since. `path` may be a path object of object storage (storage.location), which has
        stat() too. Keyed by the path as given (no resolve() per lookup: lineage reads records by the
        thousand, by paths built from one work dir)."""
        path = Path(path) if isinstance(path, str) else path
        key = str(path)
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == stamp:
            return entry[1]
        value = compute()
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (stamp, value)
        return value
