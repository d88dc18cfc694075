"""Errors the dipu package raises for users: one line saying what is wrong.

A DipuError is a UserError (the command lines print it as one line, exit 2) and, for callers that
catch the runtime's failures, also a RuntimeError.
"""

from h2.core.errors import UserError


class DipuError(UserError, RuntimeError):
    pass


class VendorNotFound(DipuError):
    """The vendor library named (by DIPU_VENDOR, use_vendor) is not installed."""

    vendor_missing = True  # for detection, which cannot import this module when the import failed
