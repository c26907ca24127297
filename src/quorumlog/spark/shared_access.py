"""One `ClusterAccess` kept open in a Python worker for the tasks it runs one after another.

Spark reuses a Python worker process for task after task (and the planner's process for
query after query). Opening a `ClusterAccess` for each one started an I/O thread and an
event loop, connected to a node, shook hands and looked the topic up, and closing it
joined the thread again: tens of milliseconds before a task's first fetch was even sent,
on every task, while the 2-core bench machine counted four tasks a query. A task now
borrows the access the previous task of its process left (`borrowed_access`) and gives it
back when it ends well; after an error it is closed, and the next task opens a new one.

At most one idle access is kept (the last one given back; one for other connection options
replaces it, closed), a task that finds it lent out (two readers at once in one process)
opens its own, and a process forked from one that holds an access never uses the
parent's (its I/O thread did not survive the fork). The access belongs to the process:
its thread is a daemon thread and its connections close when Spark ends the worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.options import ConnectionOptions


class IdleAccess:
    """The access given back last, with what it was opened for."""

    __slots__ = ("access", "key", "process_id")

    def __init__(self, key: bytes, access: ClusterAccess) -> None:
        self.key = key
        self.access = access
        self.process_id = os.getpid()


idle_lock = threading.Lock()
idle: IdleAccess | None = None


def connection_key(connection: ConnectionOptions, client_name: str) -> bytes:
    return msgspec.msgpack.encode((connection, client_name))


def take_idle(key: bytes) -> ClusterAccess | None:
    """The idle access if it was opened for `key` in this process; None otherwise (an
    idle access for other options is closed)."""
    global idle
    with idle_lock:
        kept, idle = idle, None
    if kept is None:
        return None
    if kept.process_id != os.getpid():
        return None  # a forked child: the parent's I/O thread is not running here
    if kept.key == key and not kept.access.closed:
        return kept.access
    kept.access.close()
    return None


def give_back(key: bytes, access: ClusterAccess) -> None:
    global idle
    with idle_lock:
        replaced, idle = idle, IdleAccess(key, access)
    if replaced is not None and replaced.process_id == os.getpid():
        replaced.access.close()


@contextmanager
def borrowed_access(connection: ConnectionOptions, client_name: str) -> Iterator[ClusterAccess]:
    """A ClusterAccess for `connection`: the one the process's last task left, or a new
    one; kept for the next task if the block ends without an error, closed if not."""
    key = connection_key(connection, client_name)
    access = take_idle(key) or ClusterAccess(connection, client_name)
    try:
        yield access
    except BaseException:
        access.close()
        raise
    give_back(key, access)


def close_idle_access() -> None:
    """Close the idle access, if any (tests; a process about to stop reading)."""
    global idle
    with idle_lock:
        kept, idle = idle, None
    if kept is not None and kept.process_id == os.getpid():
        kept.access.close()
