"""Stage 1: an Apache Beam + tf.Transform job that turns image files into a dataset directory.

Entry point: `python -m preprocess --help` (see preprocess/pipeline.py). The tree: docs/development.md;
the design notes of the modules: docs/internals.md.
"""

import importlib


def lazy_entry(package: str, modules: dict[str, tuple[str, ...]]):
    """A folder's entry: ({its names}, the module `__getattr__` that imports each on first use), from
    {module of the folder: the names it gives the entry} (a module may give itself). A light caller of one
    module (the command line's checks, a listing worker) must not load the folder's Beam and TensorFlow
    steps by importing the folder (launch/command.py)."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f"{package}.{where[name]}")
        return module if where[name] == name else getattr(module, name)

    return sorted(where), __getattr__
