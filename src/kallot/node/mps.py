"""Is an MPS control daemon answering on this node? The agent asks before it advertises MPS
shares: without a daemon, a pod given "30% of a GPU" by MPS would get the whole GPU unenforced
(docs/install.md, "MPS").

``nvidia-cuda-mps-control -d`` creates the named pipe ``control`` in its pipe directory
(``CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``) and keeps it open for reading while it
runs. Opening that FIFO for writing without blocking succeeds only while a reader holds it (the
kernel answers ENXIO otherwise), so a stale pipe left by a dead daemon does not count. Nothing
is written to the daemon.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")
CONTROL = "control"


def daemon_answers(pipe_dir: str | os.PathLike[str] = DEFAULT_PIPE_DIR) -> bool:
    """True when a process holds the daemon's control pipe in ``pipe_dir`` open for reading."""
    path = Path(pipe_dir or DEFAULT_PIPE_DIR) / CONTROL
    try:
        if not stat.S_ISFIFO(path.stat().st_mode):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (
            errno.ENXIO,
            errno.ENOENT,
            errno.EACCES,
            errno.EPERM,
            errno.ENOTDIR,
            errno.EROFS,
        ):
            return False
        raise
    os.close(fd)
    return True
