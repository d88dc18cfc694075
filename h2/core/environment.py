"""The project's switch variables (set to 1 to turn something on): an unset or empty variable is off,
`0` off, `1` on, anything else a one-line `UserError` naming the variable, because a misspelt value
(`true`, `yes`, `off`) would otherwise be read as on or off by accident."""

from __future__ import annotations

import os

from h2.core.errors import UserError

SWITCH_VALUES = {"": False, "0": False, "1": True}


def switch(name: str) -> bool:
    value = os.environ.get(name, "")
    if value not in SWITCH_VALUES:
        raise UserError(f"{name}={value!r}: expected 0 or 1")
    return SWITCH_VALUES[value]
