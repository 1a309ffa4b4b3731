"""The scheduling core: pure, vectorized, deterministic.

``core`` turns ``(Snapshot, pending tasks, now, rng)`` into a ``Decision``. It does no I/O, reads
no clock and logs nothing; the shells (``sim``, ``kube``, ``node``) feed it and act on what it
decides. See docs/design/001-core.md for the model and its vocabulary.
"""
