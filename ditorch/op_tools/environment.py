"""Switching op tools on from environment variables, so an unmodified script can be inspected:
`import ditorch` calls activate_from_environment() when one of TOOL_VARIABLES is set (and only
then imports the tools), or run the script with `python -m ditorch.op_tools.run script.py`.

    DITORCH_AUTOCOMPARE=1        compare every selected op with the CPU  -> autocompare_<pid>.csv
    DITORCH_OP_CAPTURE=DIR       save selected calls for `ditorch replay`
    DITORCH_OVERFLOW_CHECK=1     name the first op producing NaN/Inf (=float16: also values beyond float16)
    DITORCH_OP_TIME=1            per-op device-synchronised wall time    -> op_time_<pid>.csv
    DITORCH_OP_FALLBACK=1        selected ops run on the CPU
    DITORCH_OP_DTYPE_CAST=1      selected ops run widened (=bfloat16:float32,float16:float32 to choose)
    DITORCH_OP_OBSERVE=1         log of op calls                         -> op_observe_<pid>.log

Op selection, for all tools: DITORCH_OP_FILTER (comma-separated exact names), DITORCH_OP_PATTERN
(a regular expression), DITORCH_OP_EXCLUDE (comma-separated names); a tool-specific form
(DITORCH_AUTOCOMPARE_OP_FILTER, DITORCH_OP_FALLBACK_OP_FILTER, ...) takes precedence.
Files go to DITORCH_OP_TOOLS_DIR (default ./ditorch_op_tools). Tools stop, and print their
summaries, when the process exits.
"""

from __future__ import annotations

import atexit
import os

TOOL_VARIABLES = ("DITORCH_OP_FALLBACK", "DITORCH_OP_DTYPE_CAST", "DITORCH_OVERFLOW_CHECK", "DITORCH_AUTOCOMPARE",
                  "DITORCH_OP_CAPTURE", "DITORCH_OP_TIME", "DITORCH_OP_OBSERVE")
_OFF = ("", "0", "false", "no", "off")

_active: list = []


def _enabled(environ, name: str) -> str | None:
    value = environ.get(name, "").strip()
    return None if value.lower() in _OFF else value


def requested(environ=os.environ) -> bool:
    return any(_enabled(environ, name) for name in TOOL_VARIABLES)


def _filters(environ, variable: str) -> dict:

    def pick(suffix: str) -> str | None:
        return environ.get(f"{variable}_{suffix}") or environ.get(f"DITORCH_{suffix}") or None

    return {"ops": pick("OP_FILTER"), "patterns": pick("OP_PATTERN"), "exclude": pick("OP_EXCLUDE")}


def build_tools(environ=os.environ) -> list:
    """The tools the environment asks for, in the order they are started (transformations first,
    so that inspecting tools see each call as the program made it)."""
    import torch

    from ditorch.op_tools.autocompare import OpAutoCompare
    from ditorch.op_tools.capture import OpCapture
    from ditorch.op_tools.dtype_cast import OpDtypeCast, parse_casts
    from ditorch.op_tools.fallback import OpFallback
    from ditorch.op_tools.observe import OpObserve
    from ditorch.op_tools.overflow import OpOverflowCheck
    from ditorch.op_tools.timing import OpTimeMeasure

    out_dir = environ.get("DITORCH_OP_TOOLS_DIR", "ditorch_op_tools")
    pid = os.getpid()
    tools = []
    for variable in TOOL_VARIABLES:
        value = _enabled(environ, variable)
        if value is None:
            continue
        filters = _filters(environ, variable)
        if variable == "DITORCH_OP_FALLBACK":
            tools.append(OpFallback(**filters))
        elif variable == "DITORCH_OP_DTYPE_CAST":
            casts = parse_casts(value) if ":" in value else None
            tools.append(OpDtypeCast(casts=casts, **filters))
        elif variable == "DITORCH_OVERFLOW_CHECK":
            range_dtype = getattr(torch, value) if value not in ("1", "true", "yes", "on") else None
            if range_dtype is not None and not isinstance(range_dtype, torch.dtype):
                raise ValueError(f"DITORCH_OVERFLOW_CHECK={value}: expected 1 or a dtype name such as float16")
            tools.append(OpOverflowCheck(range_dtype=range_dtype, **filters))
        elif variable == "DITORCH_AUTOCOMPARE":
            tools.append(OpAutoCompare(csv_path=os.path.join(out_dir, f"autocompare_{pid}.csv"), **filters))
        elif variable == "DITORCH_OP_CAPTURE":
            folder = value if value not in ("1", "true", "yes", "on") else os.path.join(out_dir, f"capture_{pid}")
            tools.append(OpCapture(folder, **filters))
        elif variable == "DITORCH_OP_TIME":
            tools.append(OpTimeMeasure(csv_path=os.path.join(out_dir, f"op_time_{pid}.csv"), **filters))
        elif variable == "DITORCH_OP_OBSERVE":
            tools.append(
                OpObserve(log_path=os.path.join(out_dir, f"op_observe_{pid}.log"), keep_records=False, **filters))
    return tools


def activate_from_environment(environ=os.environ) -> list:
    """Start the requested tools (once per process); they stop at exit. Returns the active tools."""
    if _active or not requested(environ):
        return list(_active)
    for tool in build_tools(environ):
        tool.start()
        _active.append(tool)
    atexit.register(stop_environment_tools)
    return list(_active)


def stop_environment_tools() -> None:
    while _active:
        tool = _active.pop()
        try:
            tool.stop()
        except RuntimeError as error:  # the program left other dispatch modes active
            print(f"ditorch op tools: could not stop {tool.tool_name}: {error}")
