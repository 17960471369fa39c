#!/usr/bin/env bash
# One prepared check of populi on a lent GPU machine (docs/gpu.md, "Real hardware"),
# run from the repository root:
#
#   bash scripts/device_gpu_check.sh                      # on the device ($OUT is set)
#   OUT=$(mktemp -d) bash scripts/device_gpu_check.sh     # a rehearsal: GPU steps SKIP
#
# The machine has no network: what its python3 lacks comes as wheels in .whl/ (populi's
# dependencies and pytest-trio; see the report of the session that made them). They go
# to $CHECK_ROOT/site, and $CHECK_ROOT/venv is a python that sees them and python3's own
# packages (torch), so the daemons the tests start (PYTHONPATH=the repo) find both.
# $CHECK_ROOT is outside /tmp: a root daemon gives each task a private /tmp.
#
# Steps, each one PASS/FAIL/SKIP line: the wheels, the imports, nvidia-smi, torch on
# CUDA, the real-GPU tests (tests/gpu/test_nvml_real.py, tests/mesh/test_real_gpu_task.py),
# one real daemon checked as a user would (scripts/device_gpu_check.py), then tests/gpu
# and tests/executor in the time left. DEPLOY=1 also deploys the tiny model on
# llama-server with --gpus 1 (the binary: $POPULI_LLAMA_SERVER, default
# .venv/bin/llama-server, carried). Files in $OUT (at most 8): check.log (all of the
# output), nvidia-smi.txt, pytest.log, daemon.log, gpus.json, tasks.json, deploy.json.
# Everything ends inside BUDGET seconds (default 380); exit 1 if a step failed.
set -u -o pipefail

OUT=${OUT:-$(mktemp -d)}
BUDGET=${BUDGET:-380}
PY=${PY:-python3}
CHECK_ROOT=${CHECK_ROOT:-/opt/populi-check}
REPO=$(pwd)
FAILED=()
TASK_ENV=()

step() {  # step VERDICT NAME DETAIL...
  echo "$1 $2: ${*:3}"
  if [ "$1" = FAIL ]; then FAILED+=("$2"); fi
}

left() { echo $((BUDGET - SECONDS)); }

install_wheels() {
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    step SKIP wheels "no .whl/ here: $PY must hold every dependency itself"
    return 0
  fi
  rm -rf "$CHECK_ROOT" && mkdir -p "$CHECK_ROOT/site" "$CHECK_ROOT/bin" || {
    step FAIL wheels "cannot make $CHECK_ROOT (set CHECK_ROOT)"; return 1; }
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$CHECK_ROOT/site" .whl/*.whl; then
    step PASS wheels "$(ls .whl/*.whl | wc -l) wheels into $CHECK_ROOT/site"
  else
    step FAIL wheels "pip install --target $CHECK_ROOT/site failed"; return 1
  fi
}

make_python() {  # $CHECK_ROOT/venv: $PY's packages, the wheels, and populi-node on PATH
  mkdir -p "$CHECK_ROOT/bin"
  "$PY" -m venv --without-pip "$CHECK_ROOT/venv" || { step FAIL python "venv failed"; return 1; }
  VPY=$CHECK_ROOT/venv/bin/python
  local purelib sites
  purelib=$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  sites=$("$PY" -c 'import site, sys; print(repr([p for p in site.getsitepackages() if p]))')
  # A .pth line that starts with "import" runs: addsitedir also reads their .pth files.
  printf 'import site; [site.addsitedir(p) for p in [%s] + %s]\n' \
    "'$CHECK_ROOT/site'" "$sites" >"$purelib/_populi_check.pth"
  printf '#!/bin/sh\nexec %s -m populi_p2p.cli "$@"\n' "$VPY" >"$CHECK_ROOT/bin/populi-node"
  chmod 755 "$CHECK_ROOT/bin/populi-node"
  export PATH=$CHECK_ROOT/bin:$PATH PYTHONPATH=$REPO
  local probe='import importlib.metadata as m, sys
import trio, nacl, zeroconf, hypercorn, platformdirs, pytest_trio, populi_p2p.node
names = "attrs msgpack httpx h11 trio pynacl zeroconf hypercorn prometheus-client nvidia-ml-py pytest pytest-trio pytest-timeout hypothesis gguf numpy torch".split()
def version(n):
    try: return m.version(n)
    except m.PackageNotFoundError: return "-"
print(sys.version.split()[0], sys.executable, " ".join(f"{n}={version(n)}" for n in names))'
  if out=$("$VPY" -c "$probe" 2>&1); then
    step PASS imports "$out"
  else
    step FAIL imports "$out"; return 1
  fi
  out=$(populi-node --version 2>&1) && step PASS populi_node "$out" || step FAIL populi_node "$out"
}

check_gpu() {  # nvidia-smi to $OUT; TORCH_PY when torch sees CUDA
  if [ -n "${TORCH_PY:-}" ]; then  # a rehearsal's stand-in (the fake NVML)
    step SKIP torch_cuda "TORCH_PY=$TORCH_PY given"
    return 0
  fi
  TORCH_PY=
  if ! command -v nvidia-smi >/dev/null; then
    step SKIP nvidia_smi "no nvidia-smi here"
    step SKIP torch_cuda "no GPU here"
    return 0
  fi
  { timeout 30 nvidia-smi; timeout 30 nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,driver_version,compute_cap --format=csv; } >"$OUT/nvidia-smi.txt" 2>&1
  step PASS nvidia_smi "$(grep -v '^index' "$OUT/nvidia-smi.txt" | tail -n 1)"
  local probe='import sys, torch; assert torch.cuda.is_available(), "no CUDA"
print(sys.executable, torch.__version__, torch.cuda.get_device_name(0))'
  if out=$(timeout 120 "$PY" -c "$probe" 2>&1); then
    TORCH_PY=$(echo "$out" | tail -n 1 | cut -d' ' -f1)
    step PASS torch_cuda "$(echo "$out" | tail -n 1)"
  else
    step FAIL torch_cuda "$(echo "$out" | tail -n 3)"
  fi
  if [ -n "$TORCH_PY" ]; then check_task_view; fi
}

cuda_in() {  # cuda_in [setpriv ...] VAR=VALUE...: torch as a task would run it
  local run=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do run+=("$1"); shift; done
  shift
  timeout 120 "${run[@]}" env -i "$@" "$TORCH_PY" -c \
    'import torch; print("cuda", torch.cuda.is_available())' 2>&1 | tail -n 2 | tr '\n' ' '
}

check_task_view() {  # what a task meets: an empty environment and, from root, its own uid
  echo "INFO torch python: $(namei -mo "$TORCH_PY" 2>&1 | tr '\n' ';')"
  echo "INFO LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  local path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin out
  TASK_ENV=()
  out=$(cuda_in -- "$path")
  if [ "$out" = "cuda True " ]; then
    step PASS torch_in_task_env "torch sees CUDA with a task's environment (PATH alone)"
  elif [ "$(cuda_in -- "$path" "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")" = "cuda True " ]; then
    TASK_ENV=("LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
    step FAIL torch_in_task_env "with PATH alone: $out; it needs ${TASK_ENV[*]} (given to the holder task)"
  else
    step FAIL torch_in_task_env "with PATH alone: $out"
  fi
  command -v setpriv >/dev/null || { echo "INFO no setpriv: the task uid is not tried"; return 0; }
  out=$(cuda_in setpriv --reuid=61999 --regid=61999 --clear-groups -- "$path" "${TASK_ENV[@]}")
  if [ "$out" = "cuda True " ]; then
    step PASS torch_as_task_uid "uid 61999 (as a root daemon's task) imports torch and sees CUDA"
  else  # the daemon checks then run tasks as root, to get to the GPU steps at all
    step FAIL torch_as_task_uid "uid 61999: $out; the daemon's tasks run as root below"
    TASK_USER=root
  fi
}

run_pytest() {  # run_pytest NAME LIMIT ARGS...
  local name=$1 limit=$2
  shift 2
  if [ "$limit" -lt 30 ]; then step SKIP "$name" "only ${limit}s left"; return 0; fi
  local flags=(-p no:cacheprovider --maxfail 10)
  if "$VPY" -c 'import pytest_timeout' 2>/dev/null; then flags+=(--timeout 120); fi
  echo "== $name: pytest ${flags[*]} $* (limit ${limit}s)" >>"$OUT/pytest.log"
  timeout -k 10 "$limit" "$VPY" -m pytest "${flags[@]}" "$@" >>"$OUT/pytest.log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E '(passed|failed|skipped|error).* in [0-9.]+s' "$OUT/pytest.log" | tail -n 1 | tr -d '=')
  if [ $rc -eq 0 ]; then step PASS "$name" "$summary"; else step FAIL "$name" "rc $rc: $summary"; fi
}

daemon_checks() {
  local flags=()
  if [ -n "$TORCH_PY" ]; then flags+=(--torch-python "$TORCH_PY"); fi
  if [ -n "${TASK_USER:-}" ]; then flags+=(--task-user "$TASK_USER"); fi
  for kv in "${TASK_ENV[@]}"; do flags+=(--task-env "$kv"); done
  if [ "${DEPLOY:-0}" = 1 ]; then
    export POPULI_LLAMA_SERVER=${POPULI_LLAMA_SERVER:-$REPO/.venv/bin/llama-server}
    if [ -x "$POPULI_LLAMA_SERVER" ] && ! ldd "$POPULI_LLAMA_SERVER" | grep -q 'not found'; then
      flags+=(--deploy)
      echo "INFO llama-server: $("$POPULI_LLAMA_SERVER" --version 2>&1 | tail -n 1)"
    else
      step FAIL deploy "no runnable llama-server at $POPULI_LLAMA_SERVER: $(ldd "$POPULI_LLAMA_SERVER" 2>&1 | grep 'not found' | head -n 3)"
    fi
  fi
  local budget=$(( $(left) - 100 ))
  local work
  work=$(mktemp -d /tmp/populi-check.XXXXXX)
  timeout -k 10 "$((budget + 15))" "$VPY" scripts/device_gpu_check.py --out "$OUT" \
    --work "$work" --budget "$budget" "${flags[@]}"
  local rc=$?
  if [ $rc -ne 0 ]; then FAILED+=(daemon_checks); fi
}

main() {
  echo "populi GPU check: $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(uname -srm), $(nproc) CPUs, budget ${BUDGET}s, OUT=$OUT"
  install_wheels || return 1
  make_python || return 1
  check_gpu
  # The tests that need the real GPU first, each named; then one real daemon.
  run_pytest pytest_real_gpu "$(( $(left) - 240 < 120 ? $(left) - 240 : 120 ))" -v -rs \
    tests/gpu/test_nvml_real.py tests/mesh/test_real_gpu_task.py
  daemon_checks
  run_pytest pytest_gpu_executor "$(( $(left) - 15 ))" -q -rs tests/gpu tests/executor
  echo "done in ${SECONDS}s; failed: ${FAILED[*]:-none}"
  [ ${#FAILED[@]} -eq 0 ]
}

mkdir -p "$OUT"
main 2>&1 | tee "$OUT/check.log"
exit "${PIPESTATUS[0]}"
