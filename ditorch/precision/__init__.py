"""Precision alignment above the op level: loss-curve diff against a reference run
(`ditorch precision-diff`), module-by-module comparison of one training step on two devices,
and the emulated reproduction of the H2 paper's Table 1.

Depends on ditorch.op_tools (comparison metrics, autocompare); must not import h2.
"""
