"""A seeded, byte-level simulated disk: the `FileSystem` the simulator gives the file stores.

The stores that ship (`SegmentLogStore`, `HardStateFile`, `SnapshotStore`) run on it
unchanged, so what a crash does to their real files is what gets tested. It keeps the
durability contract of storage/filesystem.py to the letter, and no more:

- Every file has its current contents (what reads return) and its durable contents (what a
  power loss keeps). `sync` / `sync_data` make the current contents durable. Between syncs a
  file keeps the list of its unsynced writes and truncations, in order.
- Every directory has its current names and its durable names. Creating a file, making a
  directory, renaming and unlinking change the current names at once and the durable ones
  only at `sync_directory` of that directory.
- `crash(rng)` is a power loss. Each directory keeps a seeded prefix of its unsynced name
  changes (so a created file may vanish, a rename revert, an unlinked file come back); each
  file keeps a seeded prefix of its unsynced writes, the last one kept torn at a seeded byte,
  and the torn write may leave zeros where its lost bytes were (the size reached the disk,
  the data did not). Files left without a name are gone.
- `process_crash()`: the process dies and the OS does not. Nothing is lost and nothing
  becomes durable; every unsynced write is still readable and can still be lost by a later
  `crash`.
- `halt_after(operations)`: the process dies just before its next change past the given
  count (a write, truncate, sync, create, rename, unlink, directory sync). That change and
  every later call raise `SimulatedCrash`; follow with `crash` or `process_crash`. Counting
  the operations of a scripted run and halting after each one gives every crash point.
- `read_bit_flip_probability`: each read flips one bit of what it returns with this
  probability (0 by default). The bytes stored are not changed.
- `bytes_max`: the space the disk has. A write that would grow the files past it writes what
  fits and raises the ENOSPC path (`DiskFullError`); freeing space (a truncate, an unlink,
  a larger `bytes_max`) lets writes go on.
- One seed, one outcome: every choice comes from the `random.Random` given, and nothing is
  ordered by hashing or read from a clock.

`sync` and `sync_data` do the same here (the size counts as data). The files' model and the
crash arithmetic are in filesystem_state.

Paths are absolute POSIX paths inside the simulated disk (`/node-1/log`); nothing touches
the real file system. Renames must stay within one directory (all the stores need).

Example: a node's log on the simulated disk, a power loss, a restart.

    import random
    from pathlib import Path
    from quorumlog.storage import LogEntry, SegmentLogStore
    from quorumlog.testing.sim.filesystem import SimFileSystem

    disk = SimFileSystem(random.Random(7))
    store = SegmentLogStore.open(Path("/node-1/log"), file_system=disk)
    store.append([LogEntry(index=1, term=1, data=b"a")])
    store.sync()  # entry 1 is durable
    store.append([LogEntry(index=2, term=1, data=b"b")])  # entry 2 is only readable
    disk.crash(random.Random(1))  # power loss: the old store object is dead
    store = SegmentLogStore.open(Path("/node-1/log"), file_system=disk)
    assert store.last_index in (1, 2)  # 2 only if the crash kept its bytes
"""

from __future__ import annotations

import errno
import functools
import os
import random
from pathlib import Path, PurePosixPath

import msgspec

from quorumlog.errors import DirectoryInUseError
from quorumlog.storage.files import storage_error
from quorumlog.storage.filesystem import DirectoryLock, FileHandle
from quorumlog.testing.sim.checks import SimulationError
from quorumlog.testing.sim.filesystem_state import (
    CrashCounts,
    Link,
    Rename,
    SimDirectory,
    SimFile,
    Truncate,
    Unlink,
    Write,
    settle_directory,
)


class SimulatedCrash(BaseException):
    """The simulated process died here (see `SimFileSystem.halt_after`).

    A BaseException, like KeyboardInterrupt, so that no `except Exception` (nor the stores'
    `except StorageError`) can handle it: a dead process runs no recovery code.
    """


class DiskCrashReport(msgspec.Struct, frozen=True):
    """What one `SimFileSystem.crash` took away."""

    file_changes_lost: int = 0
    """Unsynced writes and truncations dropped, whole."""
    writes_torn: int = 0
    """Kept writes cut short at a byte (with or without zeros after the cut)."""
    directory_changes_lost: int = 0
    """Unsynced creations, renames and unlinks undone."""


# --- the file system ---------------------------------------------------------------------


class SimFileSystem:
    """A simulated disk with a crash model; see the module docs. Implements `FileSystem`."""

    def __init__(
        self,
        rng: random.Random,
        *,
        read_bit_flip_probability: float = 0.0,
        bytes_max: int | None = None,
    ) -> None:
        if not 0.0 <= read_bit_flip_probability <= 1.0:
            raise ValueError(
                f"read_bit_flip_probability must be in [0, 1], got {read_bit_flip_probability}"
            )
        self.rng = rng
        """Draws the bit flips on reads."""
        self.read_bit_flip_probability = read_bit_flip_probability
        self.bytes_max = bytes_max
        """Room on the disk for file contents, or None for no limit. May be changed any time."""
        self.root = SimDirectory()
        self.generation = 0
        """Counts process lives: handles and locks of an earlier life are dead."""
        self.operation_count = 0
        """Changes made so far (writes, truncates, syncs, name changes), over all lives."""
        self.bit_flips = 0
        self._halt_countdown: int | None = None
        self._halted = False
        self._locks: dict[str, int] = {}
        """Locked directory to the generation that holds it."""

    # --- crashes --------------------------------------------------------------------------

    def halt_after(self, operations: int | None) -> None:
        """Let `operations` more changes happen, then kill the process (None: never)."""
        if operations is not None and operations < 0:
            raise ValueError(f"operations must not be negative, got {operations}")
        self._halt_countdown = operations

    @property
    def halted(self) -> bool:
        return self._halted

    def process_crash(self) -> None:
        """The process dies, the OS lives on: nothing is lost, nothing becomes durable."""
        self._new_life()

    def crash(self, rng: random.Random, *, keep_unsynced: bool = True) -> DiskCrashReport:
        """Power loss: keep what is durable and a seeded prefix of the rest (module docs).

        With `keep_unsynced=False` nothing unsynced survives (the harshest loss, no draws).
        """
        counts = CrashCounts()
        settle_directory(self.root, rng, keep_unsynced, counts)
        self._new_life()
        return DiskCrashReport(
            file_changes_lost=counts.file_changes_lost,
            writes_torn=counts.writes_torn,
            directory_changes_lost=counts.directory_changes_lost,
        )

    def _new_life(self) -> None:
        self.generation += 1
        self._locks = {}
        self._halted = False
        self._halt_countdown = None

    # --- the FileSystem interface ---------------------------------------------------------

    def open_file(self, path: Path, *, writable: bool = False) -> FileHandle:
        self.check_alive()
        node = self._lookup(path)
        if node is None:
            raise _error(path, errno.ENOENT)
        if isinstance(node, SimDirectory):
            raise _error(path, errno.EISDIR)
        return SimFileHandle(self, node, path, writable)

    def create_file(self, path: Path, *, exclusive: bool = True) -> FileHandle:
        self._step("create %s", path)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if isinstance(node, SimDirectory):
            raise _error(path, errno.EISDIR)
        if node is not None:
            if exclusive:
                raise _error(path, errno.EEXIST)
            if node.current:
                node.change(Truncate(0))
            return SimFileHandle(self, node, path, writable=True)
        created = SimFile()
        parent.change(Link(name, created))
        return SimFileHandle(self, created, path, writable=True)

    def read_file(self, path: Path) -> bytes:
        self.check_alive()
        node = self._lookup(path)
        if node is None:
            raise _error(path, errno.ENOENT)
        if isinstance(node, SimDirectory):
            raise _error(path, errno.EISDIR)
        return self._flip_maybe(bytes(node.current))

    def list_directory(self, path: Path) -> list[str]:
        self.check_alive()
        return sorted(self._directory(path).entries)

    def exists(self, path: Path) -> bool:
        self.check_alive()
        return self._lookup(path) is not None

    def make_directory(self, path: Path) -> None:
        self._step("make directory %s", path)
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _error(path, errno.EEXIST)
        parent.change(Link(name, SimDirectory()))

    def rename(self, source: Path, target: Path) -> None:
        self._step("rename %s to %s", source, target)
        parent, source_name = self._parent(source)
        target_parent, target_name = self._parent(target)
        if target_parent is not parent:
            raise SimulationError(f"rename across directories ({source} to {target})")
        node = parent.entries.get(source_name)
        if node is None:
            raise _error(source, errno.ENOENT)
        if isinstance(node, SimDirectory) or isinstance(
            parent.entries.get(target_name), SimDirectory
        ):
            raise SimulationError(f"renaming directories is not simulated ({source} to {target})")
        if source_name != target_name:
            parent.change(Rename(source_name, target_name))

    def unlink(self, path: Path) -> None:
        self._step("unlink %s", path)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise _error(path, errno.ENOENT)
        if isinstance(node, SimDirectory):
            raise _error(path, errno.EISDIR)
        parent.change(Unlink(name))

    def sync_directory(self, path: Path) -> None:
        self._step("sync directory %s", path)
        self._directory(path).sync()

    def lock_directory(self, path: Path) -> DirectoryLock:
        self.check_alive()
        self._directory(path)
        key = str(_normal(path))
        if self._locks.get(key) == self.generation:
            raise DirectoryInUseError(f"{path} is in use by another open store")
        self._locks[key] = self.generation
        return SimDirectoryLock(self, key, self.generation)

    # --- for tests ------------------------------------------------------------------------

    @property
    def bytes_used(self) -> int:
        """Bytes of current contents of every file that has a name."""
        return sum(len(node.current) for _, node in self._files(self.root, PurePosixPath("/")))

    def file_contents(self) -> dict[str, bytes]:
        """Every file's current contents by path, in path order."""
        return {
            str(path): bytes(node.current)
            for path, node in self._files(self.root, PurePosixPath("/"))
        }

    def durable_file_contents(self) -> dict[str, bytes]:
        """What a crash that keeps nothing unsynced would leave, by path (changes nothing)."""
        found: dict[str, bytes] = {}
        self._durable_files(self.root, PurePosixPath("/"), found)
        return found

    def _files(
        self, directory: SimDirectory, path: PurePosixPath
    ) -> list[tuple[PurePosixPath, SimFile]]:
        found: list[tuple[PurePosixPath, SimFile]] = []
        for name in sorted(directory.entries):
            node = directory.entries[name]
            if isinstance(node, SimDirectory):
                found.extend(self._files(node, path / name))
            else:
                found.append((path / name, node))
        return found

    def _durable_files(
        self, directory: SimDirectory, path: PurePosixPath, found: dict[str, bytes]
    ) -> None:
        for name in sorted(directory.durable_entries):
            node = directory.durable_entries[name]
            if isinstance(node, SimDirectory):
                self._durable_files(node, path / name, found)
            else:
                found[str(path / name)] = bytes(node.durable)

    # --- the machinery --------------------------------------------------------------------

    def check_alive(self) -> None:
        if self._halted:
            raise SimulatedCrash("the simulated process has halted")

    def _step(self, what: str, *arguments: object) -> None:
        """Every change passes here: count it, or halt the process just before it.

        `what % arguments` names the change; formatted only for a halt, since every write
        and sync comes this way."""
        self.check_alive()
        if self._halt_countdown is not None:
            if self._halt_countdown == 0:
                self._halted = True
                raise SimulatedCrash(f"the simulated process halted before: {what % arguments}")
            self._halt_countdown -= 1
        self.operation_count += 1

    def _flip_maybe(self, data: bytes) -> bytes:
        probability = self.read_bit_flip_probability
        if not data or probability == 0.0 or self.rng.random() >= probability:
            return data
        flipped = bytearray(data)
        position = self.rng.randrange(len(flipped) * 8)
        flipped[position // 8] ^= 1 << (position % 8)
        self.bit_flips += 1
        return bytes(flipped)

    def _room_for(self, node: SimFile, end: int) -> int:
        """How far (an offset) the file may extend, given `bytes_max`."""
        if self.bytes_max is None:
            return end
        free = self.bytes_max - self.bytes_used
        return min(end, len(node.current) + max(0, free))

    def write(self, node: SimFile, path: Path, data: bytes, offset: int) -> None:
        self._step("write %d bytes at %d of %s", len(data), offset, path)
        end = offset + len(data)
        room = self._room_for(node, end)
        if room >= end:
            node.change(Write(offset, data))
            return
        if room > offset:
            node.change(Write(offset, data[: room - offset]))
        raise _error(path, errno.ENOSPC)

    def truncate(self, node: SimFile, path: Path, size: int) -> None:
        self._step("truncate %s to %d", path, size)
        if self._room_for(node, size) < size:
            raise _error(path, errno.ENOSPC)
        node.change(Truncate(size))

    def sync_file(self, node: SimFile, path: Path) -> None:
        self._step("sync %s", path)
        node.sync()

    def read(self, node: SimFile, size: int, offset: int) -> bytes:
        self.check_alive()
        return self._flip_maybe(bytes(node.current[offset : offset + size]))

    def _lookup(self, path: Path) -> SimFile | SimDirectory | None:
        return self._lookup_parts(_names(path))

    def _lookup_parts(self, names: tuple[str, ...]) -> SimFile | SimDirectory | None:
        node: SimFile | SimDirectory = self.root
        for name in names:
            if not isinstance(node, SimDirectory):
                return None
            child = node.entries.get(name)
            if child is None:
                return None
            node = child
        return node

    def _directory(self, path: Path) -> SimDirectory:
        node = self._lookup(path)
        if node is None:
            raise _error(path, errno.ENOENT)
        if not isinstance(node, SimDirectory):
            raise _error(path, errno.ENOTDIR)
        return node

    def _parent(self, path: Path) -> tuple[SimDirectory, str]:
        names = _names(path)
        if not names:
            raise _error(path, errno.EEXIST)
        node = self._lookup_parts(names[:-1])
        if node is None:
            raise _error(path, errno.ENOENT)
        if not isinstance(node, SimDirectory):
            raise _error(path, errno.ENOTDIR)
        return node, names[-1]

    def release_lock(self, key: str, generation: int) -> None:
        if self._locks.get(key) == generation:
            del self._locks[key]

    def __repr__(self) -> str:
        return (
            f"SimFileSystem(generation={self.generation}, operations={self.operation_count}, "
            f"bytes_used={self.bytes_used})"
        )


class SimFileHandle:
    """An open file of a `SimFileSystem`; dead once its process life ends."""

    __slots__ = ("_closed", "_file_system", "_generation", "_node", "_path", "_writable")

    def __init__(
        self, file_system: SimFileSystem, node: SimFile, path: Path, writable: bool
    ) -> None:
        self._file_system = file_system
        self._node = node
        self._path = path
        self._writable = writable
        self._generation = file_system.generation
        self._closed = False

    @property
    def path(self) -> Path:
        return self._path

    def read_at(self, size: int, offset: int) -> bytes:
        self._check_usable()
        return self._file_system.read(self._node, size, offset)

    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._check_usable()
        if not self._writable:
            raise _error(self._path, errno.EBADF)
        self._file_system.write(self._node, self._path, bytes(data), offset)

    def size(self) -> int:
        self._check_usable()
        return len(self._node.current)

    def truncate(self, size: int) -> None:
        self._check_usable()
        if not self._writable:
            raise _error(self._path, errno.EINVAL)
        self._file_system.truncate(self._node, self._path, size)

    def sync(self) -> None:
        self._check_usable()
        self._file_system.sync_file(self._node, self._path)

    def sync_data(self) -> None:
        self.sync()

    def close(self) -> None:
        """Never fails: closing loses nothing, even for a process that has died."""
        self._closed = True

    def _check_usable(self) -> None:
        if self._generation != self._file_system.generation:
            raise SimulationError(f"{self._path} was opened by a process that has crashed")
        self._file_system.check_alive()
        if self._closed:
            raise _error(self._path, errno.EBADF)

    def __repr__(self) -> str:
        return f"SimFileHandle({str(self._path)!r})"


class SimDirectoryLock:
    __slots__ = ("_file_system", "_generation", "_key")

    def __init__(self, file_system: SimFileSystem, key: str, generation: int) -> None:
        self._file_system = file_system
        self._key = key
        self._generation = generation

    def release(self) -> None:
        self._file_system.release_lock(self._key, self._generation)


# --- helpers -----------------------------------------------------------------------------


def _names(path: Path | PurePosixPath) -> tuple[str, ...]:
    """The names from the root down to `path` (a relative path counts from the root).

    Read from the path's own parts, which a path parses once: `_normal` would build two
    more paths for every new name (each snapshot and temporary file has one)."""
    parts = path.parts
    names = parts[1:] if path.anchor else parts
    if ".." in names:
        raise SimulationError(f"paths with '..' are not simulated: {path}")
    return names


@functools.lru_cache(maxsize=4096)
def _normal(path: Path | PurePosixPath) -> PurePosixPath:
    """The absolute path (cached: a store names the same few files again and again, and
    parsing a path costs more than the simulated write it names)."""
    normal = PurePosixPath("/") / PurePosixPath(path)
    if ".." in normal.parts:
        raise SimulationError(f"paths with '..' are not simulated: {path}")
    return normal


def _error(path: Path, code: int) -> Exception:
    """The typed error the OS file system raises for errno `code` on `path`."""
    return storage_error(path, OSError(code, os.strerror(code)))
