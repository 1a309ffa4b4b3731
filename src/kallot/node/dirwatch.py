"""Directory events for the device plugin's kubelet-restart watch (Linux inotify, via ctypes).

The kubelet's own plugin watcher learns about sockets from fsnotify events; comparing inode
numbers instead misses restarts, because filesystems reuse inode numbers (ext4 hands the freed
inode of a deleted ``kubelet.sock`` straight to the new one). ``DirWatch`` reports every name
created, deleted or moved in one directory through an asyncio callback on the loop; it needs no
extra dependency (libc's ``inotify_init1`` / ``inotify_add_watch``). Where inotify is not
available (not Linux, watch limit reached) ``DirWatch.open`` returns None and the caller relies
on its periodic check alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

# One event: (name, mask). The name is "" for events on the directory itself (deleted, moved,
# queue overflow): the caller should then check everything.
Callback = Callable[[str, int], None]


class DirWatch:
    def __init__(self, fd: int, wd: int, directory: Path, callback: Callback) -> None:
        self.fd = fd
        self.wd = wd
        self.directory = directory
        self.callback = callback
        self.alive = True  # False once the directory itself is gone (watch removed)
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def open(cls, directory: Path, callback: Callback) -> DirWatch | None:
        """Watch ``directory`` from the running loop; None where inotify is not available."""
        libc_name = ctypes.util.find_library("c")
        if libc_name is None:
            return None
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            log.debug("inotify_init1: %s", os.strerror(ctypes.get_errno()))
            return None
        wd = libc.inotify_add_watch(fd, os.fsencode(directory), _MASK)
        if wd < 0:
            log.debug("inotify_add_watch %s: %s", directory, os.strerror(ctypes.get_errno()))
            os.close(fd)
            return None
        watch = cls(fd, wd, directory, callback)
        watch._loop = asyncio.get_running_loop()
        watch._loop.add_reader(fd, watch._read)
        return watch

    def drain(self) -> None:
        """Deliver the events queued so far now. A caller that drains before it looks at a file
        has seen every event about that file's creation: the kernel queues the event before
        the file can be seen."""
        self._read()

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:  # the fd was closed under us
            log.warning("inotify read: %s", exc)
            return
        offset = 0
        while offset + _HEADER.size <= len(data):
            _wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                self.alive = False
                name = ""
            if mask & IN_Q_OVERFLOW:
                name = ""
            self.callback(name, mask)

    def close(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.fd)
            self._loop = None
        with contextlib.suppress(OSError):
            os.close(self.fd)
