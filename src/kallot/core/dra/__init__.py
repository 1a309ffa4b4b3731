"""Dynamic Resource Allocation in the core: the model (``model``), the allocator
(``allocator``) and kallot's policy among valid allocations (``policy``). Pure: CEL selectors
arrive compiled (``kallot.config.dra_cel``), JSON is parsed and written in ``kallot.config.dra``.
Design: docs/design/009-dra-allocator.md."""
