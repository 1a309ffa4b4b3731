"""The plugin framework: extension-point protocols, the per-task Cycle, Registry, Profile and the
Framework that runs one Profile's plugins over the snapshot's arrays (after kube-scheduler)."""
