"""Choosing the vendor library: by name (libdipu_vendor_<name>.so next to the shim) or by path."""
import ctypes
import os
from pathlib import Path

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError, VendorNotFound

_LIBRARY_DIR = Path(_C.__file__).resolve().parent


def available_vendors() -> list[str]:
    """Names of the vendor libraries installed next to the shim."""
    prefix, suffix = "libdipu_vendor_", ".so"
    return sorted(p.name[len(prefix):-len(suffix)] for p in _LIBRARY_DIR.glob(f"{prefix}*{suffix}"))


def resolve_vendor(name_or_path: str) -> str:
    """The library path for a vendor name ("host") or a path to a vendor shared library."""
    if os.sep in name_or_path or name_or_path.endswith(".so"):
        path = Path(name_or_path).expanduser().resolve()
        if not path.is_file():
            raise VendorNotFound(f"DIPU vendor library {name_or_path} does not exist")
        return str(path)
    path = _LIBRARY_DIR / f"libdipu_vendor_{name_or_path}.so"
    if not path.is_file():
        raise VendorNotFound(
            f"no DIPU vendor named '{name_or_path}' (installed: {', '.join(available_vendors()) or 'none'})")
    return str(path)


def use_vendor(name_or_path: str) -> None:
    """Choose the vendor the device will open at its first use; an error once another is open."""
    path = resolve_vendor(name_or_path)
    try:
        _C._set_vendor_path(path)
    except RuntimeError as exc:
        raise DipuError(str(exc).splitlines()[0]) from None


def vendor_name() -> str:
    """The loaded vendor's own name (opens the vendor if needed)."""
    return _C._vendor_name()


def device_description(index: int) -> str | None:
    """The vendor's one-line description of device `index` (platform, device, driver), or None when
    the vendor does not describe its devices (the optional dipuGetDeviceDescription)."""
    library = ctypes.CDLL(_C._vendor_path())
    describe = getattr(library, "dipuGetDeviceDescription", None)
    if describe is None:
        return None
    text = ctypes.create_string_buffer(512)
    if describe(ctypes.c_int32(index), text, ctypes.c_size_t(len(text))) != 0:
        return None
    return text.value.decode(errors="replace")
