"""Tenant queues: the quota hierarchy (``queue_tree``), fair-share arithmetic (``fair_share``),
what one task costs a queue (``charge``), a session's per-queue usage (``ledger``) and the
fair-share order of pending work (``order``). Pure: numpy and stdlib only.
"""
