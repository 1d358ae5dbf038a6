#!/usr/bin/env bash
# Everything that needs CUDA, in one run on the GPU machine (budget: under 8 minutes on one H200).
# Run from anywhere; it works from the repository root with no network:
#   bash tests/gpu/run_gpu_checks.sh
# 1. every CUDA test of the whole suite: pytest -m cuda tests (keeps going past failures)
#    (DeepSpeed: tests/gpu/test_deepspeed_cuda.py, nccl on one GPU, bf16 ZeRO-3, ZeRO-3 with parameters
#    and optimizer offloaded to CPU)
# 2. benchmarks/gpu.py at full size: plain PyTorch / Accelerate / accelerando, big-model rows
# 3. benchmarks/fsdp.py: DDP vs FSDP2 (needs 2 GPUs: nccl refuses two ranks on one device)
# 4. benchmarks/deepspeed.py: accelerando's step against deepspeed.initialize's (ZeRO-2, ZeRO-3),
#    interleaved in one process per stage, one rank per GPU
# 5. benchmarks/fp8/run.py --gpu: bf16 vs torchao fp8 (tensorwise) on a 1.0 B-parameter model, 200
#    compiled steps, plus each fp8 backend by hand vs through accelerando (budget: about 2 minutes,
#    capped at 200 s); skipped with a line saying so where torchao does not import
# Writes benchmarks/results/gpu-<date>.md (and copies it to $OUT/ when OUT is set), then exits
# non-zero if any section failed. Wheels in .gpu-wheels/ (tests/gpu/bring_wheels.sh) fill in what the
# machine's Python lacks (torchao, DeepSpeed). PYTHON overrides the interpreter (default: .venv/bin/python if
# present, else python3); GPU_BENCH_REPEATS the fresh processes per benchmark cell (default 3).
# Issues that add CUDA behaviour (DeepSpeed, FP8, TP...) add their tests with the cuda marker and,
# if they need one, a section here.
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
REPEATS="${GPU_BENCH_REPEATS:-3}"
RESULTS="benchmarks/results/gpu-$(date +%F).md"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p benchmarks/results
STATUS=0
START=$SECONDS

section() {  # section TITLE: a heading in the results, and the time since the start on the terminal
  echo "== $1 ($((SECONDS - START)) s so far)" >&2
  printf '\n## %s\n\n' "$1" >>"$RESULTS"
}

ended() {  # ended NAME RC BEGAN: record how a section ended
  local name=$1 rc=$2 began=$3
  printf '\n%s: exit %s, %s s\n' "$name" "$rc" "$((SECONDS - began))" | tee -a "$RESULTS" >&2
  if [ "$rc" -ne 0 ] && [ "$STATUS" -eq 0 ]; then STATUS=$rc; fi
}

GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$GPUS" -eq 0 ]; then
  echo "no CUDA device: these checks only run on the GPU machine ($PYTHON)" >&2
  exit 2
fi
# Wheels brought with the code (tests/gpu/bring_wheels.sh): install only what this Python lacks,
# into a folder placed after src on the path, so the machine's own packages always win.
BROUGHT=""
if [ -d .gpu-wheels ]; then
  BROUGHT=$("$PYTHON" - <<'PY'
import importlib.metadata as md
import pathlib

def installed(name):
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False

names = {p.name.split("-")[0].replace("_", "-").lower() for p in pathlib.Path(".gpu-wheels").glob("*.whl")}
print(" ".join(sorted(n for n in names if not installed(n))))
PY
)
  if [ -n "$BROUGHT" ]; then
    # shellcheck disable=SC2086 # one argument per distribution name
    if "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps \
      --find-links .gpu-wheels --target "$WORK/site" $BROUGHT; then
      export PYTHONPATH="$PYTHONPATH:$WORK/site" PATH="$PATH:$WORK/site/bin"  # ninja, for DeepSpeed's JIT ops
    else
      echo "could not install the brought wheels ($BROUGHT); going on without them" >&2
      BROUGHT="(install failed: $BROUGHT)"
    fi
  fi
fi
{
  echo "# GPU checks, $(date -u '+%F %H:%M UTC')"
  echo
  echo '```'
  echo "installed from .gpu-wheels: ${BROUGHT:-nothing}"
  git log -1 --format='commit %h %s' 2>/dev/null || true
  "$PYTHON" - <<'PY'
import importlib.metadata as md
import platform
import torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
for name in ("accelerate", "transformers", "safetensors"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
for name in ("deepspeed", "torchao"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not importable")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB")
PY
  echo '```'
} >"$RESULTS"
cat "$RESULTS"

section "pytest -m cuda tests"
began=$SECONDS
"$PYTHON" -m pytest -m cuda tests -q -ra -p no:cacheprovider 2>&1 | tee "$WORK/pytest.log"
rc=${PIPESTATUS[0]}
summary=$(sed -n '/short test summary info/,$p' "$WORK/pytest.log")
{ echo '```'; if [ -n "$summary" ]; then echo "$summary"; else tail -n 1 "$WORK/pytest.log"; fi; echo '```'; } >>"$RESULTS"
ended "pytest" "$rc" "$began"

section "benchmarks/gpu.py (per-step overhead and big-model loading)"
began=$SECONDS
"$PYTHON" benchmarks/gpu.py --repeats "$REPEATS" --markdown "$WORK/gpu.md" 2>&1 | tee "$WORK/gpu.log"
rc=${PIPESTATUS[0]}
if [ -f "$WORK/gpu.md" ]; then cat "$WORK/gpu.md" >>"$RESULTS"; fi
if [ "$rc" -ne 0 ]; then { echo '```'; tail -n 40 "$WORK/gpu.log"; echo '```'; } >>"$RESULTS"; fi
ended "benchmarks/gpu.py" "$rc" "$began"

section "benchmarks/fsdp.py (DDP vs FSDP2)"
began=$SECONDS
if [ "$GPUS" -ge 2 ]; then
  "$PYTHON" benchmarks/fsdp.py --dim 2048 --depth 8 --batch 64 --steps 20 2>&1 | tee "$WORK/fsdp.log"
  rc=${PIPESTATUS[0]}
  cat "$WORK/fsdp.log" >>"$RESULTS"
else
  echo "skipped: $GPUS GPU; fsdp.py needs 2 (one rank per GPU with nccl)" | tee -a "$RESULTS" >&2
  rc=0
fi
ended "benchmarks/fsdp.py" "$rc" "$began"

section "benchmarks/deepspeed.py (accelerando vs deepspeed.initialize)"
began=$SECONDS
if "$PYTHON" -c "import deepspeed" >/dev/null 2>&1; then
  "$PYTHON" benchmarks/deepspeed.py --nproc "$GPUS" --modes overhead-zero2 overhead-zero3 --dim 1024 --depth 8 \
    --batch 64 --steps 20 --repeats 1 2>&1 | grep -v ' INFO ' | tee "$WORK/deepspeed.log"
  rc=${PIPESTATUS[0]}
  cat "$WORK/deepspeed.log" >>"$RESULTS"
else
  echo "skipped: deepspeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)" | tee -a "$RESULTS" >&2
  rc=0
fi
ended "benchmarks/deepspeed.py" "$rc" "$began"

section "benchmarks/fp8/run.py --gpu (torchao fp8 vs bf16, 1.0 B params, 200 steps)"
began=$SECONDS
if fp8_missing=$("$PYTHON" -c "import torchao.float8" 2>&1); then
  timeout 200 "$PYTHON" benchmarks/fp8/run.py --gpu --markdown "$WORK/fp8.md" 2>&1 | grep -v 'Failed to load' | tee "$WORK/fp8.log"
  rc=${PIPESTATUS[0]}
  if [ -f "$WORK/fp8.md" ]; then cat "$WORK/fp8.md" >>"$RESULTS"; else { echo '```'; tail -n 40 "$WORK/fp8.log"; echo '```'; } >>"$RESULTS"; fi
  if [ "$rc" -eq 124 ]; then echo "fp8 suite: timed out after 200 s" | tee -a "$RESULTS" >&2; fi
else
  echo "skipped: torchao does not import here ($(echo "$fp8_missing" | tail -n 1)); bring a torchao wheel matching this torch (pip install --no-deps torchao)" | tee -a "$RESULTS" >&2
  rc=0
fi
ended "benchmarks/fp8/run.py" "$rc" "$began"

printf '\ntotal: %s s, exit %s\n' "$((SECONDS - START))" "$STATUS" | tee -a "$RESULTS" >&2
if [ -n "${OUT:-}" ]; then cp "$RESULTS" "$OUT/"; fi
echo "results: $RESULTS" >&2
exit "$STATUS"
