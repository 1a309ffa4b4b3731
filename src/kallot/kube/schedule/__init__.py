"""The live scheduler's session loop and what it carries out: each session's input from the
pipeline (``kube.state.pipeline``), the core's Decision, evictions (``evictor``), MIG
re-layouts (``migplan``), problem reports (``problems``), then the placements to the binder.
Third in the flow watch -> state -> schedule -> bind."""
