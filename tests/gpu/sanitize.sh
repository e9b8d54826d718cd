#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over a small sweep of our kernels (forward and backward).
#
#   tests/gpu/sanitize.sh            # both tools; exit status non-zero if either reports an error
#
# Needs a GPU, fa_attn installed with its kernels (a wheel from `fa build`), and compute-sanitizer:
# from $COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, or NVIDIA's PyPI wheel
# (pip install nvidia-cuda-sanitizer-api-cu12 puts it in site-packages/nvidia/cuda_sanitizer_api/bin).
# The kernels are loaded with cuModuleLoadData, which the sanitizer instruments like any module.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"

find_sanitizer() {
  if [[ -n "${COMPUTE_SANITIZER:-}" ]]; then echo "$COMPUTE_SANITIZER"; return; fi
  if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return; fi
  if [[ -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/compute-sanitizer" ]]; then echo "$CUDA_HOME/bin/compute-sanitizer"; return; fi
  "$python" - <<'PY'
import importlib.util, pathlib
try:  # find_spec raises, rather than returning None, when no nvidia.* package is installed at all
    spec = importlib.util.find_spec("nvidia.cuda_sanitizer_api")
except ModuleNotFoundError:
    spec = None
if spec and spec.submodule_search_locations:
    p = pathlib.Path(list(spec.submodule_search_locations)[0]) / "bin" / "compute-sanitizer"
    if p.exists():
        print(p)
PY
}

san="$(find_sanitizer)"
if [[ -z "$san" ]]; then
  echo "compute-sanitizer not found: set COMPUTE_SANITIZER, or pip install nvidia-cuda-sanitizer-api-cu12" >&2
  exit 2
fi
if [[ ! -x "$san" ]]; then  # wheels may drop the exec bit
  cp "$san" "${TMPDIR:-/tmp}/compute-sanitizer" && chmod +x "${TMPDIR:-/tmp}/compute-sanitizer"
  san="${TMPDIR:-/tmp}/compute-sanitizer"
fi

status=0
echo "== memcheck ($san)"
"$san" --tool memcheck --error-exitcode 1 --leak-check no "$python" "$here/sanitize_sweep.py" || status=1
echo "== racecheck (shared-memory hazards)"
"$san" --tool racecheck --error-exitcode 1 --racecheck-report hazard "$python" "$here/sanitize_sweep.py" --quick --no-check || status=1
echo "== initcheck (reads of uninitialised device memory)"
"$san" --tool initcheck --error-exitcode 1 "$python" "$here/sanitize_sweep.py" --quick --no-check || status=1
exit $status
