#!/usr/bin/env bash
# Create or reuse the project's virtual environment (.venv) and install H2 into it.
# torch is installed first and pinned, so that nothing later can make pip resolve another build
# (on a CPU-only machine a resolver-chosen torch pulls gigabytes of CUDA wheels). The project
# itself is installed editable without build isolation, so its C++ extensions compile against
# exactly that torch; the CMake build folder is kept, so a re-run only rebuilds what changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${H2_VENV:-$root/.venv}"
torch_version="${H2_TORCH_VERSION:-2.13.0}"
python="${PYTHON:-python3}"

# System packages: the rdma-core headers and libraries, so the ibverbs transport always compiles,
# pyverbs, which the tests use to cross-check DiComm's RDMA probe, OpenSSL's libcrypto headers
# (DiComm's setup handshake proves the job token with HMAC-SHA256), GoogleTest (DiComm's C++ unit tests)
# clang-format (scripts/lint.sh checks csrc/ with it), and OpenCL: the ICD loader and headers, pocl (Portable
# OpenCL on the CPU, the OpenCL device this machine has), CLBlast (OpenCL BLAS) and clinfo, for the OpenCL DIPU
# vendor. Installed only as root (CI and the development
# machines are root); otherwise say what was skipped and build without them.
system_packages=(libibverbs-dev librdmacm-dev rdma-core python3-pyverbs libssl-dev libgtest-dev clang-format
                 ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libclblast-dev clinfo)
missing_packages=()
for package in "${system_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing_packages+=("$package")
done
if [ "${#missing_packages[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "[bootstrap] installing system packages: ${missing_packages[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" >/dev/null
  else
    echo "[bootstrap] skipped system packages ${missing_packages[*]} (needs root and apt-get):" \
         "the ibverbs transport is not compiled and the pyverbs cross-check is skipped;" \
         "without libssl-dev DiComm does not build, without libgtest-dev scripts/test.sh cannot build its C++ unit tests," \
         "without clang-format scripts/lint.sh does not check csrc/," \
         "without the OpenCL packages the build stops unless H2_WITHOUT_OPENCL=1 (then without the OpenCL vendor)"
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip install --quiet --disable-pip-version-check)

if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "[bootstrap] installing torch==$torch_version"
  "${pip[@]}" "torch==$torch_version"
fi
# grpcio and pyzmq (Di-PS's control and data flow) do not depend on torch.
build_and_test_deps=(numpy pyyaml "pybind11>=2.12" "scikit-build-core>=0.10" ninja pytest pytest-benchmark hypothesis expecttest matplotlib tensorboardX "grpcio>=1.60" "pyzmq>=25" networkx)
if ! "$py" -c "import numpy, yaml, pybind11, scikit_build_core, ninja, pytest, pytest_benchmark, hypothesis, expecttest, matplotlib, tensorboardX, grpc, zmq, networkx" 2>/dev/null; then
  echo "[bootstrap] installing build and test dependencies"
  "${pip[@]}" "${build_and_test_deps[@]}"
fi
# The ecosystem's libraries for real workloads (Hugging Face configs and tokenizers, safetensors, datasets and
# parquet, TensorBoard and W&B logging, progress bars), the planner's LP solver (highspy); torch stays pinned
# through a constraint so that none of them can make pip resolve another build.
workload_deps=(transformers tokenizers safetensors datasets pyarrow sentencepiece tensorboard wandb tqdm highspy)
if ! "$py" -c "import transformers, tokenizers, safetensors, datasets, pyarrow, sentencepiece, tensorboard, wandb, tqdm, highspy" 2>/dev/null; then
  echo "[bootstrap] installing workload libraries (transformers, tokenizers, safetensors, datasets, ...)"
  constraint="$(mktemp)"
  echo "torch==$torch_version" > "$constraint"
  "${pip[@]}" -c "$constraint" "${workload_deps[@]}"
  rm -f "$constraint"
fi
# The linter (ruff) and the formatter (yapf) are pinned: another version may lint or format differently
# and fail scripts/lint.sh on unchanged code.
ruff_version=0.17.5
yapf_version=0.43.0
if [ "$("$venv/bin/ruff" --version 2>/dev/null)" != "ruff $ruff_version" ]; then
  echo "[bootstrap] installing ruff==$ruff_version"
  "${pip[@]}" "ruff==$ruff_version"
fi
if [ "$("$venv/bin/yapf" --version 2>/dev/null)" != "yapf $yapf_version" ]; then
  echo "[bootstrap] installing yapf==$yapf_version"
  "${pip[@]}" "yapf==$yapf_version"
fi
echo "[bootstrap] building and installing h2 (editable)"
"${pip[@]}" --no-build-isolation --no-deps --editable "$root"
"$py" -c "import dicomm; print('[bootstrap] dicomm', dicomm.probe_ibverbs()['message'])"
