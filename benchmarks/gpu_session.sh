#!/usr/bin/env bash
# One prepared GPU session (issue 24, point 6): on a machine whose python already has torch,
# Triton and gpubench's other dependencies (nothing is downloaded), in the repository root:
#
#   OUT=/some/dir bash benchmarks/gpu_session.sh            # the GPU parts, most important first
#   REHEARSE=1 OUT=/tmp/rehearsal bash benchmarks/gpu_session.sh   # the same steps on a CPU, small
#
# Each part runs under its own `timeout -s INT` (Python then prints where it was stuck, and
# gpubench keeps what finished) and is tarred into $OUT as soon as it ends, so a part that hangs
# costs only itself; at most 8 files come back (device machine's limit). The Triton tunings and
# case times live in $GPUBENCH_CACHE_DIR (default results/<GPU>/cache when that exists, so a
# session starts from the last one's tunings and its --dry-run estimates from its times); part 1
# copies them back out beside the results.
#
# Parts (PARTS="1 2 3 4" by default):
#   1  gpu-quick, whole, one run (goal: <= 5 min with warm caches, timed calls >= 30% of wall)
#   2  gpu-quick --dry-run again: the estimate from this device's case times, beside part 1's wall
#   3  gpu-consumer (memory capped at 24 GiB by its policy; compute is still this GPU's)
#   4  env --calibrate --json (the ceilings the run's % of peak figures use) and nvidia-smi -q
#   5  kernels-h200: issue 28's paged decode goal cases beside sdpa_contiguous / flashinfer
#   6  kernels-h200-flash: issue 28's flash goal cases (fwd, fwd+bwd) beside cuDNN / FA2 SDPA
#   7  kernels-h200-flash again with GPUBENCH_FLASH_DESCRIPTORS=0 (the pointer path: before/after TMA)
#   8  issue 33's do_bench check: harness device time vs triton.testing.do_bench, one flash and one
#      paged decode case, within 5% (benchmarks/do_bench_check.py; on a CPU it says so and times nothing)
# Issue 28 alone: PARTS="5 6 7 4" (about 8 minutes with a cold autotune cache).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the directory the results go to}"
mkdir -p "$OUT"
PARTS=${PARTS:-"1 2 3 4"}
export PYTHONUNBUFFERED=1
if [ -n "${REHEARSE:-}" ]; then
  DEVICE=cpu; QUICK="--scenario smoke --only kv_cache,moe_grouping --repeat-scale 0.3"
  CONSUMER="--scenario smoke --only paged_attention --repeat-scale 0.3"; PY=${PY:-.venv/bin/python}
  LIMIT_QUICK=300; LIMIT_CONSUMER=200
  PAGED="--scenario smoke --only paged_attention --repeat-scale 0.3"
  FLASH="--scenario smoke --only flash_attention --repeat-scale 0.3"; LIMIT_KERNELS=300
else
  DEVICE=cuda; QUICK="--scenario gpu-quick"; CONSUMER="--scenario gpu-consumer"; PY=${PY:-python3}
  LIMIT_QUICK=${LIMIT_QUICK:-330}; LIMIT_CONSUMER=${LIMIT_CONSUMER:-150}
  PAGED="--scenario kernels-h200"; FLASH="--scenario kernels-h200-flash"; LIMIT_KERNELS=${LIMIT_KERNELS:-200}
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || exit 1
fi
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-') if torch.cuda.is_available() else 'cpu')")
if [ -z "${GPUBENCH_CACHE_DIR:-}" ]; then
  export GPUBENCH_CACHE_DIR=/tmp/gpubench-cache
  [ -d "results/$GPU/cache" ] && cp -r "results/$GPU/cache/." "$GPUBENCH_CACHE_DIR/"
fi
echo "gpu_session: $GPU, parts $PARTS, cache $GPUBENCH_CACHE_DIR, out $OUT"

part() {  # part NAME LIMIT_S COMMAND...: run, log, tar what it wrote
  local name=$1 limit=$2; shift 2
  local dir="/tmp/gpu-session/$name"; mkdir -p "$dir"
  local t0=$SECONDS
  timeout -s INT -k 20 "$limit" "$@" > "$dir/log.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$dir/log.txt"
  tar -czf "$OUT/$name.tar.gz" -C "$dir" . 2>/dev/null
}

for p in $PARTS; do
  case $p in
    1) part gpu-quick "$LIMIT_QUICK" "$PY" -m gpubench.cli run $QUICK --device "$DEVICE" --out /tmp/gpu-session/gpu-quick/runs
       tar -czf "$OUT/cache.tar.gz" -C "$GPUBENCH_CACHE_DIR" . 2>/dev/null ;;
    2) part dry-run 60 "$PY" -m gpubench.cli run $QUICK --device "$DEVICE" --dry-run ;;
    3) part gpu-consumer "$LIMIT_CONSUMER" "$PY" -m gpubench.cli run $CONSUMER --device "$DEVICE" \
         --out /tmp/gpu-session/gpu-consumer/runs
       tar -czf "$OUT/cache.tar.gz" -C "$GPUBENCH_CACHE_DIR" . 2>/dev/null ;;
    4) part env 120 bash -c "'$PY' -m gpubench.cli env --device $DEVICE --calibrate --json; \
         command -v nvidia-smi >/dev/null && nvidia-smi -q || true" ;;
    5) part kernels-paged "$LIMIT_KERNELS" "$PY" -m gpubench.cli run $PAGED --device "$DEVICE" --no-history \
         --out /tmp/gpu-session/kernels-paged/runs ;;
    6) part kernels-flash "$LIMIT_KERNELS" "$PY" -m gpubench.cli run $FLASH --device "$DEVICE" --no-history \
         --out /tmp/gpu-session/kernels-flash/runs
       tar -czf "$OUT/cache.tar.gz" -C "$GPUBENCH_CACHE_DIR" . 2>/dev/null ;;
    7) part kernels-flash-pointers "$LIMIT_KERNELS" env GPUBENCH_FLASH_DESCRIPTORS=0 "$PY" -m gpubench.cli run \
         $FLASH --device "$DEVICE" --no-history --out /tmp/gpu-session/kernels-flash-pointers/runs ;;
    8) part do-bench-check 180 "$PY" benchmarks/do_bench_check.py --device "$DEVICE" \
         --out /tmp/gpu-session/do-bench-check/do_bench_check.json ;;
    *) echo "unknown part $p" ;;
  esac
done
ls -la "$OUT"
