"""Attribute replacements that can be undone: the one record the CUDA mappings keep of what they
replaced (torch.cuda names, device-argument wrappers, torch.distributed entry points)."""

from __future__ import annotations

import contextlib

_ABSENT = object()


class Patches:

    def __init__(self):
        self._originals: dict[tuple[object, str], object] = {}

    def replace(self, owner, name: str, value) -> None:
        """Set `owner.name = value`, remembering the first original (a class's own attribute only, so
        that undoing restores inheritance)."""
        key = (owner, name)
        if key not in self._originals:
            own = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name, _ABSENT)
            self._originals[key] = own
        setattr(owner, name, value)

    def undo(self) -> None:
        for (owner, name), original in reversed(list(self._originals.items())):
            if original is _ABSENT:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._originals.clear()
