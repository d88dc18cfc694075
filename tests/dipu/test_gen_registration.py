"""The DIOPI table generator refuses entries it cannot turn into correct kernels, naming them."""
from pathlib import Path

import pytest

GENERATOR = Path(__file__).resolve().parents[2] / "csrc" / "dipu" / "codegen" / "gen_registration.py"


@pytest.fixture(scope="module")
def generator(import_file):
    return import_file(GENERATOR)


def generate_from(generator, tmp_path, text: str) -> str:
    table = tmp_path / "table.yaml"
    table.write_text(text)
    return generator.generate(str(table))


def test_an_entry_becomes_a_registered_kernel_with_a_cpp_meta_function(generator, tmp_path, monkeypatch):
    monkeypatch.setattr(generator, "exported_meta_functions", lambda: {"mm"})  # skip scanning libtorch_cpu
    source = generate_from(generator, tmp_path, "- aten: mm\n  diopi: diopiMm(ctx, out, self, mat2)\n")
    assert 'm.impl("mm", TORCH_FN(diopi_mm));' in source
    assert "at::meta::mm(meta_self, meta_mat2)" in source
    assert "function(call.context(), call.output(out), call.input(self), call.input(mat2))" in source


def test_an_operator_torch_gives_no_meta_kernel_takes_the_shims_shape_function(generator, tmp_path):
    source = generate_from(
        generator, tmp_path, "- aten: _thnn_fused_gru_cell\n"
        "  diopi: diopiGruCell(ctx, out0, out1, input_gates, hidden_gates, hx, input_bias, hidden_bias)\n"
        "  meta: shim\n")
    assert "dipu::aten::meta::_thnn_fused_gru_cell(meta_input_gates, meta_hidden_gates, meta_hx" in source


def test_a_string_argument_reaches_the_vendor_as_text(generator, tmp_path):
    source = generate_from(generator, tmp_path, "- aten: gelu\n  diopi: diopiGelu(ctx, out, self, approximate)\n")
    assert "call.input(self), call.string(approximate))" in source


@pytest.mark.parametrize("entry, message", [
    ("- aten: no_such_op\n  diopi: diopiFoo(ctx, out, self)\n", "does not exist"),
    ("- aten: _thnn_fused_gru_cell\n  diopi: diopiGruCell(ctx, out0, out1, input_gates, hidden_gates, hx)\n",
     "has no Meta kernel"),
    ("- aten: mm\n  diopi: diopiMm(ctx, out, self, mat2)\n  meta: cpu\n", "meta: 'cpu' is not understood"),
    ("- aten: linear\n  diopi: diopiLinear(ctx, out, input, weight)\n", "is CompositeImplicitAutograd"),
    ("- aten: mm\n  diopi: diopiMm(ctx, out, self, mat3)\n", "'mat3' is neither an argument nor an output"),
])
def test_bad_entries_stop_the_build_with_the_entry_named(generator, tmp_path, entry, message):
    with pytest.raises(SystemExit, match=f"table.yaml: entry 0 .*{message}"):
        generate_from(generator, tmp_path, entry)
