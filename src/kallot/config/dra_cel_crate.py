"""The CEL crate's extension module (``cel.cel``: ``compile``, ``Context``, ``OptionalValue``),
loaded on first use without running its package's ``__init__``.

Where it sits: below every ``config.dra_cel*`` module, which reach the library through ``load``
only. The package ``cel`` (common-expression-language) imports its interactive shell in its
``__init__`` (``cel.cli``: typer, prompt_toolkit, pygments), about 0.2 s of CPU that the live
scheduler paid between listing the DeviceClasses and its first session on any cluster whose
classes have a CEL selector; kallot uses only the extension module, whose functions are the
same objects the package re-exports. A process that imports ``cel`` itself afterwards gets this
same extension module (it is registered as ``cel.cel``; an extension module is initialised
once per process).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import ModuleType

NAME = "cel.cel"


def load() -> ModuleType:
    """The extension module, loaded once (from ``sys.modules`` afterwards)."""
    module = sys.modules.get(NAME)
    if module is not None:
        return module
    package = importlib.util.find_spec("cel")  # finds the package without importing it
    spec = None
    if package is not None and package.submodule_search_locations:
        spec = importlib.machinery.PathFinder.find_spec(
            "cel", list(package.submodule_search_locations)
        )
    if spec is None or spec.origin is None:
        # Not installed as a package directory with the extension inside: the usual way.
        return importlib.import_module(NAME)
    ext = importlib.util.spec_from_file_location(NAME, spec.origin)
    assert ext is not None and ext.loader is not None  # a file location always has a loader
    module = importlib.util.module_from_spec(ext)
    sys.modules[NAME] = module
    ext.loader.exec_module(module)
    return module
