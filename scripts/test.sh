#!/usr/bin/env bash
# Run the whole test suite in the project's virtual environment (created on first use): the style checks
# (scripts/lint.sh), DiComm's C++ unit tests (csrc/dicomm/tests, built into build/cpp-tests and run by ctest),
# then pytest with any arguments given (it lists the 40 slowest tests at the end: the suite must stay under
# 35 minutes here).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
bash scripts/lint.sh
cmake -S csrc/dicomm/tests -B build/cpp-tests -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build/cpp-tests --parallel
ctest --test-dir build/cpp-tests --output-on-failure
exec "${H2_VENV:-$root/.venv}/bin/python" -m pytest --durations=40 "$@"
