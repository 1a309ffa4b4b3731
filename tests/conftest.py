"""Test-tree-wide pytest setup: registers fixture plugins shared by every test directory.

Registered here (once, at the root) rather than imported into each directory's conftest.py,
so session-scoped fixtures such as ``control_plane`` exist once per run: an imported copy
per directory would start one cluster per directory.
"""

pytest_plugins = ["kallot.testing.controlplane"]
