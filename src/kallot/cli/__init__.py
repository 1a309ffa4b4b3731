"""The command line, and kallot's composition root: builds registries and profiles explicitly."""
