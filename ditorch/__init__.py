"""DiTorch: `import ditorch` makes a CUDA-written PyTorch script run on whatever accelerator the node has.

On import it detects the vendor (cuda, npu, mlu, musa, xpu, then H2's own dipu device; override with
`DITORCH_VENDOR` or `ditorch.use(name)`) and, unless the vendor is CUDA, maps the CUDA surface
(`torch.cuda.*`, "cuda" device arguments, autocast/GradScaler, backend "nccl") onto it. With CUDA
present nothing changes; `DITORCH_DISABLE=1` turns the switch off. The import is idempotent.
Op tools are switched on here only by their environment variables (DITORCH_AUTOCOMPARE=1, ...;
ditorch/op_tools/environment.py); without them nothing is hooked.

Owns: vendor adapters (`vendors`), the mappings (`cuda_surface`, `device_args`, `distributed`),
the DIPU device bindings (`ditorch.dipu`), op-level precision tools (`ditorch.op_tools`), the
loss-curve precision diff (`ditorch.precision`) and the no-edit launcher (`python -m ditorch`). Imports
only h2.core beside torch: never dicomm (which collective backend serves a device is asked of
h2.core.devices), heteropp or the rest of h2. The `ditorch` command lives in h2.cli.ditorch.
"""

from ditorch.switch import activate, deactivate, info, use

__all__ = ["activate", "deactivate", "info", "use", "vendor"]


def vendor():
    """The active vendor adapter, or None when no accelerator was found (or ditorch is disabled)."""
    from ditorch.switch import STATE
    return STATE.vendor


activate()


def _activate_op_tools_from_environment() -> None:
    from ditorch.op_tools import environment
    if environment.requested():
        environment.activate_from_environment()


_activate_op_tools_from_environment()
