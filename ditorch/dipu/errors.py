"""Errors the dipu package raises for users: one line saying what is wrong."""


class DipuError(RuntimeError):
    pass
