#!/usr/bin/env bash
# Side-by-side benchmark against Hugging Face transformers (bench/compare).
# Makes build/bench-venv: transformers over the project venv's torch (the same
# libtorch as the build), then runs bench/compare/compare.py.
# Usage: scripts/run-bench-compare.sh BUILD_DIR [compare.py options]
set -euo pipefail
build=${1:-build}
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/$build/bench-venv"
torch_python="${RL_PYTHON:-$root/.venv/bin/python}"
if [ ! -x "$venv/bin/python" ]; then
  "$torch_python" -m venv "$venv"
  # The torch of the build, seen through a .pth file rather than installed twice.
  site=$("$torch_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  vsite=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" > "$vsite/rl-torch.pth"
fi
"$venv/bin/python" -c 'import transformers' 2>/dev/null ||
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "transformers>=4.51" numpy
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec "$venv/bin/python" "$root/bench/compare/compare.py" "$build/bin/bench_train_decode" "$@"
