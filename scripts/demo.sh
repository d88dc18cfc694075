#!/usr/bin/env bash
# The main job on the embedded default: train the tiny preset on this machine and summarise its loss curve.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec "${H2_VENV:-$root/.venv}/bin/h2" train --preset tiny --steps 200 --device cpu --out runs/demo --overwrite "$@"
