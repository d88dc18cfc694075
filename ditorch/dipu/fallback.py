"""Observing and steering the CPU fallback."""
from ditorch.dipu import _C


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


def force_fallback(operators: list[str]) -> None:
    """Send these operators to the CPU even when the vendor implements them ("mm" or "add.Tensor");
    replaces the list from DIPU_FORCE_FALLBACK_OPS."""
    _C._set_forced_fallback(list(operators))


def forced_fallback() -> list[str]:
    return list(_C._forced_fallback())
