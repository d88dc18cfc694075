"""DiTorch: the device abstraction that lets a CUDA-written PyTorch script run on any vendor's chip.

Owns: vendor detection and adapters, the DIPU device ("dipu", PrivateUse1) bindings, op-level
precision tools and the loss-curve precision diff. Must not import h2, heteropp or dicomm.

Importing ditorch registers nothing: `import ditorch.dipu` registers the dipu device (see
ditorch.dipu), and the `ditorch` command lives in ditorch.cli.
"""

from ditorch.op_tools import environment as _op_tools_environment  # cheap: no torch import

# Op tools switched on by environment variables (DITORCH_AUTOCOMPARE=1, ...; see
# ditorch/op_tools/environment.py). Without them nothing is imported and nothing is hooked.
if _op_tools_environment.requested():
    _op_tools_environment.activate_from_environment()
