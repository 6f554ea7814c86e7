#!/usr/bin/env bash
# The prepared session for a lent GPU: one call of at most 10 minutes on a machine whose python
# already has torch, Triton and gpubench's other dependencies (it reaches no package registry).
# In the repository root:
#
#   OUT=/some/dir bash benchmarks/gpu_session.sh                   # the GPU session
#   REHEARSE=1 OUT=/tmp/rehearsal bash benchmarks/gpu_session.sh   # the same steps, small, on a CPU
#   make gpu-session                                               # the same, into $OUT when set
#
# One deadline, DEADLINE_S (540 s) from the script's start, bounds everything: each part's limit is
# what is left of it (less STOP_S to stop and pack), capped at the part's own share, and every run
# inside a part gets a `gpubench run --budget` of what the part has left, so it plans its cases to
# fit (breadth-first) instead of being cut off. Parts, most important first:
#
#   env      calibration (`env --calibrate --json`: the ceilings of every "% of peak", and the
#            call that crashed on the last GPU), nvidia-smi -q, then `gpubench prepare` (the
#            speculative pair, so no case trains it while it is timed)
#   first    gpu-first: one representative case of every technique at real sizes
#   dobench  triton.testing.do_bench beside the harness's device time, one flash and one paged
#            decode case (they should agree within 5%)
#   kernels  issue 28's goal cases: kernels-h200 (paged decode), kernels-h200-flash, and the flash
#            cases again on the pointer path (GPUBENCH_FLASH_DESCRIPTORS=0) while time remains
#   rest     gpu-quick, its --dry-run estimate first, with all the time left
#
# Named in PARTS only (gpu-quick fills the time left, so after it nothing would run):
#   model    `run --model` on a published model (gpt-oss-20b: MoE, sliding windows, sinks; MODEL to
#            change it), train and serve: what to turn on for it on this GPU, sized to its memory.
#            PARTS="env model" gives it a session; PARTS="env first model rest" a share of one
#
# What comes back (at most 8 files, the device machine's limit): session.log (what ran, when, with
# which limit and exit code; a failed install's output), one <part>.tar.gz a part (packed when it
# starts, every SNAPSHOT_S while it runs and when it ends, so a part that hangs, or a call killed
# from outside, still leaves what it wrote), and cache.tar.gz (the Triton tunings, the case-time
# history and the speculative pair: commit it as results/<GPU>/cache so the next session starts
# warm). SIGTERM or SIGINT to this script stops the part in flight (SIGINT to its command, which
# keeps what it measured), packs it and the cache, and exits.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the directory the results go to}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$SECONDS
DEADLINE_S=${DEADLINE_S:-540}
STOP_S=${STOP_S:-20}          # kept back from each part: its command's kill grace, then packing
KILL_S=${KILL_S:-10}          # after the part's SIGINT, how long before SIGKILL
SNAPSHOT_S=${SNAPSHOT_S:-20}  # how often a running part is packed
MIN_PART_S=${MIN_PART_S:-15}  # a part with less than this left is not started
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gpu-session.XXXXXX")
LOG=$OUT/session.log
export PYTHONUNBUFFERED=1

log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$LOG"; }
log_at() { local at=$1; shift; echo "[$at s] $*" | tee -a "$LOG"; }  # log_at SECONDS_INTO_SESSION TEXT
left() { echo $((DEADLINE_S - (SECONDS - T0))); }

if [ -n "${REHEARSE:-}" ]; then
  DEVICE=cpu; PY=${PY:-.venv/bin/python}
  FIRST="--scenario smoke --only kv_cache,moe_grouping --repeat-scale 0.3"
  PAGED="--scenario smoke --only paged_attention --repeat-scale 0.3"
  FLASH="--scenario smoke --only flash_attention --repeat-scale 0.3"
  REST="--scenario smoke --only packed_metadata,activation_offload --repeat-scale 0.3"
  MODEL_RUN="--model ${MODEL:-smollm2-135m} --workload serve --repeat-scale 0.3"
  # A rehearsal's runs are not this machine's history: they go to a store of the rehearsal's own,
  # thrown away with its scratch folder, never into $GPUBENCH_HISTORY or the default store.
  export GPUBENCH_HISTORY=$SCRATCH/history.sqlite
else
  DEVICE=cuda; PY=${PY:-python3}
  FIRST="--scenario gpu-first"; PAGED="--scenario kernels-h200"; FLASH="--scenario kernels-h200-flash"
  REST="--scenario gpu-quick"
  MODEL_RUN="--model ${MODEL:-gpt-oss-20b} --workload both"
fi
PARTS=${PARTS:-"env first dobench kernels rest"}
echo "gpu_session: started $(date -u +%FT%TZ), deadline $DEADLINE_S s, parts: $PARTS, out $OUT" > "$LOG"

if [ -z "${REHEARSE:-}" ]; then
  # Nothing can be downloaded there: an install that tries fails at once, and says why in the log.
  if ! "$PY" -m pip install -q --no-index --disable-pip-version-check --no-deps --no-build-isolation -e . \
      > "$SCRATCH/pip.log" 2>&1; then
    log "pip install failed (the parts below will fail too):"; cat "$SCRATCH/pip.log" >> "$LOG"
  fi
fi
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-') if torch.cuda.is_available() else 'cpu')" 2>>"$LOG")
GPU=${GPU:-unknown}
if [ -z "${GPUBENCH_CACHE_DIR:-}" ]; then
  export GPUBENCH_CACHE_DIR=$SCRATCH/cache
  mkdir -p "$GPUBENCH_CACHE_DIR"
  [ -d "results/$GPU/cache" ] && cp -r "results/$GPU/cache/." "$GPUBENCH_CACHE_DIR/"
fi
log "device $GPU ($PY), cache $GPUBENCH_CACHE_DIR"

pack() {  # pack NAME DIR: DIR into $OUT/NAME.tar.gz, replaced whole (never a half-written tarball)
  tar -czf "$SCRATCH/.pack.tar.gz" -C "$2" . 2>/dev/null && mv -f "$SCRATCH/.pack.tar.gz" "$OUT/$1.tar.gz"
}

CUR=""; CHILD=""; SNAP=""; PART_END=0
lim() {  # lim COMMAND...: run it under what is left of the part, SIGINT first (Python says where it was)
  local rest=$((PART_END - SECONDS))
  if ((rest < 5)); then echo "not run (the part's time is spent): $*"; return 124; fi
  echo "+ [limit $rest s] $*"
  timeout -s INT -k "$KILL_S" "$rest" "$@"
}
budget() {  # a run's --budget in seconds: what the part has left, less the kill grace and Python's start-up
  echo "$((PART_END - SECONDS - KILL_S - 5))"
}
plan() {  # plan ARGS...: gpubench run --dry-run of what `run` would do with the part's time left
  local b; b=$(budget)
  if ((b < 10)); then echo "not planned (the part has ${b} s of budget left): gpubench run $*"; return 124; fi
  lim "$PY" -m gpubench.cli run "$@" --device "$DEVICE" --budget "${b}s" --fill-budget --dry-run
}
run() {  # run NAME ARGS...: gpubench run into the part's folder, planned to fit what the part has left
  local name=$1 b; shift
  b=$(budget)
  if ((b < 10)); then echo "not run (the part has ${b} s of budget left): gpubench run $*"; return 124; fi
  lim "$PY" -m gpubench.cli run "$@" --device "$DEVICE" --budget "${b}s" --fill-budget --out "$DIR/$name"
}

end_part() {  # the part in flight: stop its snapshots, pack it, pack the cache
  [ -n "$SNAP" ] && kill "$SNAP" 2>/dev/null; wait "$SNAP" 2>/dev/null; SNAP=""
  [ -n "$CUR" ] && pack "$CUR" "$SCRATCH/$CUR"
  pack cache "$GPUBENCH_CACHE_DIR"
  CUR=""; CHILD=""
}

on_signal() {
  trap '' TERM INT
  log "received SIG$1 during ${CUR:-no part}: stopping it, packing what it wrote"
  if [ -n "$CUR" ]; then pack "$CUR" "$SCRATCH/$CUR"; fi  # first, in case the next signal is a KILL
  if [ -n "$CHILD" ]; then
    local kids i
    kids=$(pgrep -P "$CHILD")  # the part's timeout, which passes SIGINT on to its command
    kill -TERM "$CHILD" 2>/dev/null  # the part's shell: nothing after the command in flight starts
    [ -n "$kids" ] && kill -INT $kids 2>/dev/null
    for ((i = 0; i < 2 * KILL_S; i++)); do
      [ -n "$kids" ] && kill -0 $kids 2>/dev/null || break
      sleep 0.5
    done
    for i in $kids; do kill -KILL -- "-$i" 2>/dev/null || kill -KILL "$i" 2>/dev/null; done  # timeout's group
  fi
  end_part
  log "stopped by SIG$1; files: $(cd "$OUT" && ls | tr '\n' ' ')"
  rm -rf "$SCRATCH"
  exit $((128 + $(kill -l "$1")))
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

part() {  # part NAME MAX_S FUNCTION: FUNCTION's commands run inside the part's limit, logged and packed
  local name=$1 max=$2 fn=$3 limit rc now=$SECONDS  # one clock reading: the limit, the end and the log agree
  local left_s=$((DEADLINE_S - (now - T0)))
  limit=$((left_s - STOP_S))
  ((limit > max)) && limit=$max
  if ((limit < MIN_PART_S)); then log_at "$((now - T0))" "$name: not started ($left_s s of the deadline left)"; return; fi
  CUR=$name; DIR=$SCRATCH/$name; mkdir -p "$DIR"; PART_END=$((now + limit))
  echo "$name: started at $((now - T0)) s of the session, limit $limit s" > "$DIR/log.txt"
  pack "$name" "$DIR"  # a part the log calls started has its tarball already, whatever kills the script
  log_at "$((now - T0))" "$name: started, limit $limit s"
  (while sleep "$SNAPSHOT_S"; do pack "$name" "$DIR"; done) &
  SNAP=$!
  "$fn" >> "$DIR/log.txt" 2>&1 &
  CHILD=$!
  wait "$CHILD"; rc=$?
  echo "$name: exit $rc after $((SECONDS - (PART_END - limit))) s (limit $limit s)" >> "$DIR/log.txt"
  log "$name: exit $rc after $((SECONDS - (PART_END - limit))) s"
  end_part
}

part_env() {
  lim "$PY" -m gpubench.cli env --device "$DEVICE" --calibrate --json > "$DIR/env-calibrate.json"
  if command -v nvidia-smi > /dev/null; then lim nvidia-smi -q > "$DIR/nvidia-smi.txt"; fi
  lim "$PY" -m gpubench.cli prepare --device "$DEVICE"
}
part_first() { run runs $FIRST; }
part_dobench() { lim "$PY" benchmarks/do_bench_check.py --device "$DEVICE" --out "$DIR/do_bench.json"; }
part_kernels() {
  run paged $PAGED
  run flash $FLASH
  GPUBENCH_FLASH_DESCRIPTORS=0 run flash-pointers $FLASH
}
part_rest() {
  plan $REST
  run runs $REST
}
part_model() {
  plan $MODEL_RUN
  run model $MODEL_RUN
}

for p in $PARTS; do
  case $p in
    env) part env 90 part_env ;;
    first) part first 180 part_first ;;
    dobench) part dobench 45 part_dobench ;;
    kernels) part kernels 200 part_kernels ;;
    rest) part rest 100000 part_rest ;;
    model) part model 100000 part_model ;;
    *) log "unknown part $p (known: env first dobench kernels rest model)" ;;
  esac
done
pack cache "$GPUBENCH_CACHE_DIR"
log "done in $((SECONDS - T0)) s of $DEADLINE_S; files: $(cd "$OUT" && ls | tr '\n' ' ')"
rm -rf "$SCRATCH"
