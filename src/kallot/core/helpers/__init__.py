"""Plugin helpers: what two or more plugins share, moved below them so that no plugin imports
another (after kube-scheduler's ``framework/plugins/helper``). Above the framework, below every
plugin (docs/design/001-core.md, "Layers")."""
