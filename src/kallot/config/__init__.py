"""Edge schemas (pydantic v2): user documents and the wire formats the shells share.

Everything here validates input with errors that name the field, the value and what was
expected, then converts to plain core dataclasses; no pydantic model is passed into the core.
``inventory``: what a node agent publishes about its GPUs. ``device_record``: which devices the
scheduler gave a pod (read by the agent's device plugin).
"""
