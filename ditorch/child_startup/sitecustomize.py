"""Start-up hook of the Python processes a ditorch launcher starts (`python -m ditorch`, `ditorch run`):
the launcher puts this folder first on PYTHONPATH, so every Python process of the launched program's
tree (torchrun's workers, multiprocessing's spawned children) imports ditorch before its own code, as
the launched program did. A sitecustomize this one shadows still runs after it."""

import importlib.machinery
import importlib.util
import os
import sys

import ditorch  # noqa: F401  the mapping, as in the launched program

_HERE = os.path.dirname(os.path.abspath(__file__))
_shadowed = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE])
if _shadowed is not None and _shadowed.loader is not None:
    _shadowed.loader.exec_module(importlib.util.module_from_spec(_shadowed))
