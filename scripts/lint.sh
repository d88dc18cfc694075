#!/usr/bin/env bash
# Check the whole tree's style; fails on any violation (scripts/test.sh runs this first, and so does CI).
# Python: ruff's lint rules ([tool.ruff] in pyproject.toml) and yapf's format ([tool.yapf]). C++ in csrc/:
# clang-format (.clang-format). To fix what they report: `ruff check --fix .`, `yapf -i -r -p <folders>`
# (the folders below) and `clang-format -i <files>`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${H2_VENV:-$root/.venv}"
ruff="$venv/bin/ruff"
[ -x "$ruff" ] || ruff="$(command -v ruff || true)"
if [ -z "$ruff" ]; then
  echo "[lint] ruff not found in $venv/bin or on PATH (scripts/bootstrap.sh installs it)" >&2
  exit 1
fi

status=0
echo "[lint] ruff check"
"$ruff" check --quiet --output-format concise . || status=1
python_folders=(h2 heteropp heteroauto ditorch dicomm tests benchmarks scripts csrc)
echo "[lint] yapf --diff"
if ! yapf_out="$("$venv/bin/yapf" --diff --recursive --parallel "${python_folders[@]}" 2>&1)"; then
  grep '^+++ ' <<<"$yapf_out" | sed 's/^+++ \(.*\)\t.*$/\1: not formatted as yapf formats it/; s/^+++ //' || echo "$yapf_out"
  status=1
fi

cpp_files=()
while IFS= read -r -d '' file; do cpp_files+=("$file"); done < <(find csrc \( -name '*.cc' -o -name '*.cpp' -o -name '*.h' \) -print0 | sort -z)
if command -v clang-format >/dev/null; then
  echo "[lint] clang-format --dry-run on ${#cpp_files[@]} files in csrc/"
  if ! clang_out="$(clang-format --dry-run -Werror "${cpp_files[@]}" 2>&1)"; then
    grep ': error: ' <<<"$clang_out" || echo "$clang_out"  # one line per place, without the quoted source
    status=1
  fi
else
  echo "[lint] skipped clang-format (not installed; scripts/bootstrap.sh installs it as root)"
fi
if [ "$status" -ne 0 ]; then
  echo "[lint] failed: \`ruff check --fix .\`, \`yapf -i -r -p ${python_folders[*]}\` and \`clang-format -i\` fix" \
       "most of it; the rest is by hand" >&2
fi
exit "$status"
