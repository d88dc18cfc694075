#!/usr/bin/env bash
# Run the whole test suite in the project's virtual environment (created on first use).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec "${H2_VENV:-$root/.venv}/bin/python" -m pytest "$@"
