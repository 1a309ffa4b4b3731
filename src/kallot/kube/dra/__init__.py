"""DRA state in the live shell: classes, slices and claims from the watch, and what kallot holds in flight."""
