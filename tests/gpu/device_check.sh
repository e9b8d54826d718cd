#!/usr/bin/env bash
# The whole GPU verification in one call of the lent device machine (tests/gpu/README.md, "One call on
# a lent GPU machine"), ending within about 8.5 minutes:
#
#   bash tests/gpu/device_check.sh        # from the repo root, with .carry/ (the two wheels) carried
#
# Steps, each under `timeout`, each recorded (rc, seconds) whatever the others did:
#   nvidia-smi, torch       what the machine is
#   unpack-h100/-turing     the wheels from .carry/wheels-h100 and .carry/wheels-turing, unzipped into
#                           scratch site dirs (pip there may reject the wheel's platform tag, and
#                           unzip may be missing: python's zipfile needs neither)
#   explain                 fa_attn imports from the H100 wheel (not kernels/), and explain() says
#                           sass 9.0 for bf16 d128; one call against SDPA
#   gpu_tests   \           pytest tests/gpu, the default sweep, FA_STRICT=1           -> gpu_tests.log
#   turing       } at once  tests/gpu/test_turing.py with the 7.5-only wheel (PTX JIT)  -> turing.log
#   sanitize    /           tests/gpu/sanitize.sh (memcheck, racecheck, initcheck)      -> sanitize.log
#   bench                   bench/attention.py, d128 and d64, seqlen 1k..8k, bf16, alone on the GPU
#                           -> bench.log, attention.json, attention.png
# The three correctness steps share the GPU (their timings mean nothing; only bench is timed) so that
# each gets minutes, not seconds. Everything printed also goes to $OUT/device_check.log: 7 files in
# $OUT, under the tool's 8.
#
# pytest: `-o pythonpath=` empties pyproject's `pythonpath = ["kernels"]`, which pytest puts *before*
# PYTHONPATH; without it the source tree's fa_attn (no kernels: every call falls back) would be tested.
#
# Exit status: 0 when every step passed, 1 when any failed, timed out (rc 124/137) or was skipped
# (a step whose input is missing); the summary table says which. 2: OUT cannot be written.
#
# Knobs (environment): OUT (default /tmp/fa-device-out), PYTHON (python3), FA_CHECK_TOTAL_S
# (500: the deadline, in seconds from the start), FA_CHECK_BENCH_S (130: kept for bench at the end),
# FA_CHECK_PYTEST_STOP (-x; e.g. --maxfail=20 to see more failures in one run).
set -uo pipefail  # no -e: a failing step must not end the script

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
root=$PWD
py=${PYTHON:-python3}
export PYTHON=$py PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
out=${OUT:-${TMPDIR:-/tmp}/fa-device-out}
if ! { mkdir -p "$out" && touch "$out/device_check.log"; }; then
  echo "cannot write OUT=$out" >&2
  exit 2
fi
exec 3>&1 4>&2 > >(tee "$out/device_check.log") 2>&1
tee_pid=$!

total_s=${FA_CHECK_TOTAL_S:-500}
bench_s=${FA_CHECK_BENCH_S:-130}
pytest_stop=${FA_CHECK_PYTEST_STOP:--x}
deadline=$((SECONDS + total_s))
scratch=$(mktemp -d "${TMPDIR:-/tmp}/fa-device-check.XXXXXX")
site_h100=$scratch/site-h100
site_turing=$scratch/site-turing
steps=()  # in the order of the summary table

# record NAME RC SECONDS LIMIT [NOTE]: one line per step, in a file because steps may run in the background.
record() {
  echo "$1 $2 $3 $4 ${5:-}" >"$scratch/status.$1"
}

# step NAME CAP LOG CMD...: runs CMD under `timeout`, for CAP seconds or until $phase_end if sooner,
# its output to LOG ("-": to stdout). Never fails itself.
step() {
  local name=$1 cap=$2 log=$3 rc t0=$SECONDS
  shift 3
  local left=$((phase_end - SECONDS))
  local limit=$((cap < left ? cap : left))
  if ((limit < 5)); then
    record "$name" skip 0 0 "no time left"
    return 0
  fi
  echo "== $name (at most ${limit}s)$([[ $log != - ]] && echo " -> ${log#"$out"/}")"
  if [[ $log == - ]]; then
    timeout -k 10 "$limit" "$@"
  else
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
  fi
  rc=$?
  record "$name" "$rc" $((SECONDS - t0)) "$limit"
}

skip() {  # skip NAME WHY
  echo "== $1: skipped, $2"
  record "$1" skip 0 0 "$2"
}

# `env` assignments that put a wheel's site dir first on PYTHONPATH (timeout runs programs, not functions).
path_h100=PYTHONPATH=$site_h100${PYTHONPATH:+:$PYTHONPATH}
path_turing=PYTHONPATH=$site_turing${PYTHONPATH:+:$PYTHONPATH}

unpack() {  # unpack NAME WHEELDIR SITE: the one cu13/torch 2.11 wheel of WHEELDIR into SITE
  local name=$1 dir=$2 site=$3 wheels
  steps+=("$name")
  shopt -s nullglob
  wheels=("$dir"/fa_attn-*+cu13torch2.11-*.whl)
  shopt -u nullglob
  if ((${#wheels[@]} != 1)); then
    skip "$name" "want one $dir/fa_attn-*+cu13torch2.11-*.whl, found ${#wheels[@]} (carry .carry; build: tests/gpu/README.md)"
    return 0
  fi
  echo "   ${wheels[0]#"$root"/} ($(du -k "${wheels[0]}" | cut -f1) KiB)"
  step "$name" 60 - "$py" -m zipfile -e "${wheels[0]}" "$site"
}

ok() {  # ok NAME: the step ran and passed
  [[ -f $scratch/status.$1 ]] && [[ $(cut -d' ' -f2 "$scratch/status.$1") == 0 ]]
}

echo "device_check: $(date -u '+%F %T') UTC, repo $root, OUT $out, deadline ${total_s}s"

# --- what the machine is -----------------------------------------------------------------------------
phase_end=$((deadline - bench_s - 60))  # leave the correctness steps at least a minute
steps+=(nvidia-smi)
step nvidia-smi 20 - nvidia-smi
steps+=(torch)
step torch 60 - "$py" -c '
import sys, torch
print(f"python {sys.version.split()[0]} at {sys.executable}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cxx11abi {torch._C._GLIBCXX_USE_CXX11_ABI}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA GPU")
p = torch.cuda.get_device_properties(0)
print(f"GPU 0: {p.name}, sm {p.major}.{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
'

# --- the wheels ----------------------------------------------------------------------------------------
unpack unpack-h100 "$root/.carry/wheels-h100" "$site_h100"
unpack unpack-turing "$root/.carry/wheels-turing" "$site_turing"

steps+=(explain)
if ok unpack-h100; then
  step explain 90 - env "$path_h100" "$py" - "$root" <<'PY'
import os
import sys

import fa_attn
import torch
from fa_attn import loader

root = sys.argv[1]
where = os.path.dirname(fa_attn.__file__)
print(f"fa_attn from {where}")
if where.startswith(os.path.join(root, "kernels")):
    sys.exit("FAIL: imported the source tree's fa_attn (no kernels), not the wheel")
man = loader.manifest()
print(f"manifest: variant {man.get('variant')}, torch {man.get('torch')}, sass {man.get('sass')}, "
      f"ptx {man.get('ptx')}, {len(man.get('kernels') or [])} kernels")
problem = loader.static_binding_problem(man)
print("binding: fits this torch" if problem is None else f"binding: {problem.code}: {problem.message}")
if not torch.cuda.is_available():
    sys.exit("no CUDA GPU: explain() not checked")
major, minor = torch.cuda.get_device_capability()
if major != 9:
    print(f"note: this GPU is sm {major}.{minor}; the H100 wheel has SASS for 9.0 only")
q, k, v = (torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
good = True
for causal in (False, True):
    d = fa_attn.explain(q, k, v, causal=causal)
    reasons = "; ".join(f"{r.code}: {r.message}" for r in d.reasons)
    print(f"explain bf16 d128 causal={causal}: path {d.path}, arch {d.arch}, head_dim {d.head_dim}"
          + (f", reasons {reasons}" if reasons else ""))
    good &= d.path == "sass" and d.arch == "9.0"
os.environ["FA_STRICT"] = "1"
try:
    ours = fa_attn.flash_attn_func(q, k, v, causal=True)
    ours.sum().backward()
except fa_attn.FaFallbackError as err:
    sys.exit(f"explain: FAIL, the call fell back: {err}")
last = fa_attn.last_dispatch()
ref = torch.nn.functional.scaled_dot_product_attention(
    *(t.detach().transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
err = (ours.detach().float() - ref.float()).abs().max().item()
print(f"one call: path {last.path}, arch {last.arch}; max |ours - sdpa| = {err:.3g} (bf16), "
      f"dq finite: {bool(torch.isfinite(q.grad).all())}")
good &= err < 0.05 and bool(torch.isfinite(q.grad).all())
print("explain: PASS" if good else "explain: FAIL (want path sass, arch 9.0, and output close to SDPA)")
sys.exit(0 if good else 1)
PY
else
  skip explain "needs unpack-h100"
fi

# --- correctness, three at once ------------------------------------------------------------------------
phase_end=$((deadline - bench_s))
timeout_opts=()
if "$py" -c 'import pytest_timeout' 2>/dev/null; then
  timeout_opts=(--timeout 150 --timeout-method thread)  # a hung kernel prints every thread's stack
fi
pytest_opts=(-q -o pythonpath= -p no:cacheprovider --durations 10 "${timeout_opts[@]}")
steps+=(gpu_tests turing sanitize)
jobs_running=()  # a bare `wait` would also wait for the tee above, which never ends
if ok unpack-h100; then
  step gpu_tests 400 "$out/gpu_tests.log" env "$path_h100" FA_STRICT=1 \
    "$py" -m pytest tests/gpu "$pytest_stop" "${pytest_opts[@]}" &
  jobs_running+=($!)
else
  skip gpu_tests "needs unpack-h100"
fi
if ok unpack-turing; then
  step turing 400 "$out/turing.log" env "$path_turing" FA_STRICT=1 FA_GPU_TURING=1 \
    "$py" -m pytest tests/gpu/test_turing.py "$pytest_stop" "${pytest_opts[@]}" &
  jobs_running+=($!)
else
  skip turing "needs unpack-turing"
fi
if ok unpack-h100; then
  # sanitize.sh looks in $COMPUTE_SANITIZER, on PATH, in $CUDA_HOME/bin: add the toolkit's usual homes.
  if [[ -z ${COMPUTE_SANITIZER:-} ]] && ! command -v compute-sanitizer >/dev/null; then
    for san in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda*/bin/compute-sanitizer \
      /usr/local/cuda*/compute-sanitizer/compute-sanitizer; do
      if [[ -x $san ]]; then
        export COMPUTE_SANITIZER=$san
        break
      fi
    done
  fi
  step sanitize 400 "$out/sanitize.log" env "$path_h100" bash tests/gpu/sanitize.sh &
  jobs_running+=($!)
else
  skip sanitize "needs unpack-h100"
fi
((${#jobs_running[@]} == 0)) || wait "${jobs_running[@]}"

# note NAME TEXT: put TEXT (a log's verdict line) in NAME's record; NEWRC replaces its rc when given.
note() {
  local name=$1 text=$2 newrc=${3:-} rc secs limit
  [[ -f $scratch/status.$name ]] || return 0
  read -r _ rc secs limit _ <"$scratch/status.$name"
  record "$name" "${newrc:-$rc}" "$secs" "$limit" "$text"
}
for name in gpu_tests turing; do
  [[ -f $out/$name.log ]] || continue
  verdict=$(grep -E '^[0-9]+ (passed|failed|skipped|error)|^=+ .*[0-9]+ (passed|failed|skipped|error)' \
    "$out/$name.log" | tail -n 1 | tr -d '=')
  # pytest exits 0 when every test skipped: on the device that means no GPU was seen, not a pass.
  if ok "$name" && ! grep -qE '[0-9]+ passed' <<<"$verdict"; then
    note "$name" "no test passed: ${verdict:-no pytest summary}" none
  else
    note "$name" "${verdict:-no pytest summary (killed? see the log)}"
  fi
done
if [[ -f $out/sanitize.log ]]; then
  summaries=$(grep -o 'ERROR SUMMARY: [0-9]* errors*' "$out/sanitize.log" | sed 's/ERROR SUMMARY: //' | paste -sd, -)
  note sanitize "memcheck, racecheck, initcheck in turn: ${summaries:-no ERROR SUMMARY line}"
fi

# --- speed, alone on the GPU -----------------------------------------------------------------------------
phase_end=$deadline
steps+=(bench)
if ok unpack-h100; then
  step bench "$bench_s" "$out/bench.log" env "$path_h100" "$py" bench/attention.py \
    --head-dims 128 64 --seqlens 1024 2048 4096 8192 --dtypes bf16 --causal both \
    --out "$out"  # bench's own --warmup 5 --reps 20
  if [[ -f $out/bench.log ]]; then
    note bench "H100 targets: $(grep -c '^PASS' "$out/bench.log") PASS, $(grep -c '^FAIL' "$out/bench.log") FAIL"
  fi
else
  skip bench "needs unpack-h100"
fi

# --- summary -------------------------------------------------------------------------------------------
for log in gpu_tests turing sanitize bench; do
  [[ -s $out/$log.log ]] || continue
  echo "---- $log.log, last lines"
  tail -n 12 "$out/$log.log" | cut -c1-300
done
echo
echo "step            rc  seconds  limit  note"
failed=0
for name in "${steps[@]}"; do
  rc=lost secs=0 limit=0 note="no record"
  [[ -f $scratch/status.$name ]] && read -r _ rc secs limit note <"$scratch/status.$name"
  printf '%-14s %4s %8s %6s  %s\n' "$name" "$rc" "$secs" "$limit" "$note"
  [[ $rc == 0 ]] || failed=1
done
echo "total ${SECONDS}s; OUT: $(cd "$out" && ls -m)"
rm -rf "$scratch"
exec 1>&3 2>&4 3>&- 4>&-
wait "$tee_pid"  # the log and the caller's output end with the summary
exit "$failed"
