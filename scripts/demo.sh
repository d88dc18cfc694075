#!/usr/bin/env bash
# The main job: one command from the shipped emulated heterogeneous cluster to a trained, checked model.
# `h2 run` profiles the cluster's chip types (cached in profiles/), plans with HeteroAuto, prints the plan
# with its predicted step time and memory, trains the pipeline (one rank per emulated chip, a progress
# line per step) and ends with measured against predicted step time and memory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec "${H2_VENV:-$root/.venv}/bin/h2" run --cluster configs/clusters/local-hetero.yaml --out runs/demo --overwrite \
  --steps 20 --warmup-steps 2 "$@"
