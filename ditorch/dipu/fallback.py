"""Observing and steering the CPU fallback."""
import torch

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError

EXAMPLE_NAMES = "names such as 'mm' (every overload) or 'add.Tensor'"


def fallback_counts() -> dict[str, int]:
    """How many times each ATen operator (name.overload) ran through the CPU fallback."""
    return dict(_C._fallback_counts())


def reset_fallback_counts() -> None:
    _C._reset_fallback_counts()


def set_fallback_logging(enabled: bool) -> None:
    """Log every fallback to stderr (also enabled by DIPU_LOG_FALLBACK=1)."""
    _C._set_fallback_logging(bool(enabled))


def fallback_logging() -> bool:
    return _C._fallback_logging()


def unknown_operators(names: list[str]) -> list[str]:
    """The names that are no ATen operator or overload ("mm" and "add.Tensor" are known)."""
    unknown = []
    for name in names:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base, None) if base else None
        if packet is None or (overload and overload not in packet.overloads()):
            unknown.append(name)
    return unknown


def operator_list(text: str) -> list[str]:
    """DIPU_FORCE_FALLBACK_OPS's comma-separated names, as the runtime reads them."""
    return [name.strip() for name in text.split(",") if name.strip()]


def check_operators(names: list[str], source: str) -> None:
    unknown = unknown_operators(names)
    if unknown:
        raise DipuError(f"{source}: no ATen operator named {', '.join(repr(n) for n in unknown)} "
                        f"(expected {EXAMPLE_NAMES})")


def force_fallback(operators: list[str]) -> None:
    """Send these operators to the CPU even when the vendor implements them ("mm" or "add.Tensor");
    replaces the list from DIPU_FORCE_FALLBACK_OPS. An unknown name is refused and the list kept."""
    check_operators(list(operators), "force_fallback")
    _C._set_forced_fallback(list(operators))


def forced_fallback() -> list[str]:
    return list(_C._forced_fallback())
