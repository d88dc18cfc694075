"""The DIOPI table covers what four model families dispatch: a forward and backward of a LLaMA-style
transformer, a conv net, an LSTM language model and a transformer encoder, and an AdamW step of each,
run on dipu under the op log (benchmarks/dipu_op_coverage.py), fall back to the CPU only for the
random draws of dropout."""
from pathlib import Path

import pytest

COVERAGE = Path(__file__).resolve().parents[2] / "benchmarks" / "dipu_op_coverage.py"
RANDOM_DRAWS = {"aten::bernoulli_.float"}


@pytest.fixture(scope="module")
def coverage_tool(import_file):
    return import_file(COVERAGE)


@pytest.mark.parametrize("model", ["llama", "convnet", "lstm", "encoder"])
def test_only_random_draws_leave_the_diopi_table(coverage_tool, model):
    result = coverage_tool.coverage(model)
    assert set(result["forward_backward"]["fallbacks"]) <= RANDOM_DRAWS, result
    assert result["optimizer_step"]["fallbacks"] == {}, result
    assert result["forward_backward"]["diopi_calls"] > 0
