"""Which op calls a tool acts on: exact names, regular expressions, a predicate, an exclude list."""

from __future__ import annotations

import re
from typing import Callable, Iterable


def qualified_name(func) -> str:
    """'aten.mm.default' for torch.ops.aten.mm.default."""
    return f"{func.namespace}.{func._schema.name.split('::', 1)[-1]}.{func._overloadname}"


def name_forms(func) -> frozenset[str]:
    """The spellings an exact name may use: mm, mm.default, aten.mm, aten::mm, aten.mm.default."""
    namespace, packet = func.namespace, func._schema.name.split("::", 1)[-1]
    overload = func._overloadname
    return frozenset({
        packet, f"{packet}.{overload}", f"{namespace}.{packet}", f"{namespace}::{packet}",
        f"{namespace}.{packet}.{overload}", f"{namespace}::{packet}.{overload}"
    })


def _names(value: str | Iterable[str] | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        value = value.split(",")
    return frozenset(name.strip() for name in value if name.strip())


def _patterns(value: str | Iterable[str] | None) -> tuple[re.Pattern, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        return tuple(re.compile(pattern) for pattern in value)
    except re.error as error:
        raise ValueError(f"op filter: bad regular expression {error.pattern!r} ({error})") from None


class OpFilter:
    """Selects an op call when it matches `ops` (exact names) or `patterns` (regular expressions,
    searched in the qualified name 'aten.mm.default'); with neither, every op matches. The
    `predicate`, if given, must also hold for the call (an OpCall: name, module path, phase, args).
    Names in `exclude` are never selected."""

    def __init__(self, ops: str | Iterable[str] | None = None, patterns: str | Iterable[str] | None = None,
                 predicate: Callable | None = None, exclude: str | Iterable[str] | None = None):
        self.ops = _names(ops)
        self.patterns = _patterns(patterns)
        self.predicate = predicate
        self.exclude = _names(exclude)
        self._cache: dict = {}

    def matches_op(self, func) -> bool:
        """The name-based part of the decision (cached per op overload)."""
        cached = self._cache.get(func)
        if cached is None:
            forms = name_forms(func)
            if forms & self.exclude:
                cached = False
            elif not self.ops and not self.patterns:
                cached = True
            else:
                name = qualified_name(func)
                cached = bool(forms & self.ops) or any(p.search(name) for p in self.patterns)
            self._cache[func] = cached
        return cached

    def __call__(self, call) -> bool:
        return self.matches_op(call.func) and (self.predicate is None or bool(self.predicate(call)))

    def __repr__(self) -> str:
        parts = [
            f"ops={sorted(self.ops)}" if self.ops else "",
            f"patterns={[p.pattern for p in self.patterns]}" if self.patterns else "",
            "predicate" if self.predicate else "", f"exclude={sorted(self.exclude)}" if self.exclude else ""
        ]
        return f"OpFilter({', '.join(p for p in parts if p) or 'all ops'})"
