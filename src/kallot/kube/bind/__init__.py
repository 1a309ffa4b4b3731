"""The binding cycle: the placements a session decided, bound one pod at a time."""
