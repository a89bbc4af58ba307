#!/usr/bin/env bash
# One stage of the CUDA kernel lab on a GPU machine without a Rust toolchain, from a `bench-cuda` built
# elsewhere. On the build machine:
#   cargo build --release -p lssa-benches --bin bench-cuda
#   mkdir -p .gpu && cp target/release/bench-cuda .gpu/ && strip .gpu/bench-cuda
# and, for the stages that run the Python package (pytest, ship1), its wheel:
#   (cd crates/lssa-py && maturin build --release) && cp crates/lssa-py/target/wheels/lssa-*.whl .gpu/
# then carry .gpu/ to the GPU machine and run, from the repository root, one stage per call (each
# stays under ten minutes):
#   benches/gpu-session.sh ship      # prints the plan of the run that checks Auto's kernels (v5 + v7 since issue 47)
#                                    # on a GPU: two calls, ship1 then ship2, at most 6 minutes each, the decisive
#                                    # facts first; runs nothing
#   benches/gpu-session.sh ship1     # call 1: every check case of v5 + v7 and v8 + v9 (`check --kernels v7,v8`),
#                                    # beside it the Python suite's CUDA tests under Auto; then the verdict
#   benches/gpu-session.sh ship2     # call 2: the speed table with SDPA and FlexAttention beside it at d = 64 (T = 4K,
#                                    # 16K), then d = 128 without FlexAttention
#   benches/gpu-session.sh first     # the key facts in one call, for a session with little GPU time: the wgmma
#                                    # layout probe and every kernel version vs attn-core at T = 77 and 300, then
#                                    # every version's TFLOP/s at d = 64, T = 4096 (and memory at 16K, 64K)
#   benches/gpu-session.sh check     # wgmma layout probe, then every kernel version vs attn-core (f64)
#   benches/gpu-session.sh lab       # kernel resources, then TFLOP/s of every version at d = 64, T = 4K..16K
#   benches/gpu-session.sh model     # GPT-2 124M step, reference vs each fused generation
#   benches/gpu-session.sh full64    # the issue's table at d = 64, T = 1K..32K, and memory at 16K and 64K
#   benches/gpu-session.sh full128   # the same at d = 128
#   benches/gpu-session.sh flex      # ours vs LSSA/LSSAR written for compiled FlexAttention, d = 64, T = 1K/4K/16K
#   benches/gpu-session.sh pytest    # the Python package's suite on CUDA (fused and flex), from the carried wheel
#   benches/gpu-session.sh all       # every stage from check to pytest in order (about 40 minutes of an H100), where no
#                                    # call limit applies
# DRY_RUN=1 prints each command a stage would run, with its time limit, and whether the GPU, the binary
# and the wheel it needs are here; it runs nothing and needs none of them. A real run first checks for
# them and stops with exit 2 and the reason (no `nvidia-smi`, no CUDA device, no binary, no wheel).
# Output goes to $OUT (default .gpu/out), each stage's text as it runs (`NAME.txt`, also printed) and
# bench-cuda's JSON (`NAME.json`, rewritten after every check case and every timed length, with
# `"partial": true` until it ends, and `NAME.md`), so a stage stopped by its limit leaves what it did.
# ship1 writes gpu.txt, ship-check.{txt,json,md}, ship-pytest-install.txt, ship-pytest.txt and
# ship1-verdict.txt; ship2 ship-speed64.{txt,json,md}, ship-speed128.{txt,json,md} and ship2-verdict.txt.
set -uo pipefail
BIN=${BIN:-.gpu/bench-cuda}
OUT=${OUT:-.gpu/out}
DRY=${DRY_RUN:-0}
PY=${PYTHON:-python3}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
stage=${1:-check}
STAGES="ship, ship1, ship2, first, check, lab, model, full64, full128, flex, pytest, all"

case "$stage" in
ship | ship1 | ship2 | first | check | lab | model | full64 | full128 | flex | pytest | all) ;;
*) echo "unknown stage $stage ($STAGES)" >&2; exit 2 ;;
esac

# What a real run of the stage needs; each prints why it is missing and returns 2.
gpu_missing() {
    if ! command -v "$NVIDIA_SMI" > /dev/null 2>&1; then
        echo "no GPU on this machine: $NVIDIA_SMI is not installed (no NVIDIA driver); run this stage on the GPU machine"
        return 2
    fi
    local list
    list=$("$NVIDIA_SMI" -L 2>&1)
    if ! grep -q '^GPU ' <<< "$list"; then
        echo "no GPU on this machine: $NVIDIA_SMI -L lists no CUDA device ($(head -c 200 <<< "$list"))"
        return 2
    fi
}
bin_missing() {
    [ -x "$BIN" ] || { echo "no $BIN: build and carry it first (see the top of $0)"; return 2; }
}
wheel_missing() {
    local n
    n=$(find .gpu -maxdepth 1 -name 'lssa-*.whl' 2> /dev/null | wc -l)
    [ "$n" -eq 1 ] || { echo "need exactly one .gpu/lssa-*.whl, found $n: build and carry it first (see the top of $0)"; return 2; }
}
needs=()
case "$stage" in
ship) ;;
pytest) needs=(gpu wheel) ;;
ship1 | all) needs=(gpu bin wheel) ;;
*) needs=(gpu bin) ;;
esac
if [ "$DRY" = 1 ]; then
    echo "gpu-session: dry run of stage $stage (nothing runs)"
    for n in "${needs[@]}"; do
        why=$("${n}_missing") || echo "note: $why; a real run would stop here with exit 2"
    done
else
    missing=0
    for n in "${needs[@]}"; do
        why=$("${n}_missing") || { echo "gpu-session $stage: $why" >&2; missing=1; }
    done
    [ "$missing" = 0 ] || exit 2
    mkdir -p "$OUT"
    [ "$stage" = ship ] || "$NVIDIA_SMI" --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1 || true
fi

run() { # name, limit in seconds, bench-cuda arguments...
    local name=$1 limit=$2
    shift 2
    if [ "$DRY" = 1 ]; then
        echo "would run ($name, at most $limit s): $BIN $* --out $OUT/$name.json"
        return 0
    fi
    timeout "$limit" "$BIN" "$@" --out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "$name: exit $rc (124 = timed out after ${limit} s)" | tee -a "$OUT/$name.txt"
    return "$rc"
}
pytest_cuda() { # the package's suite with its CUDA tests, from the carried wheel
    if [ "$DRY" = 1 ]; then
        echo "would run (pytest, at most 570 s): $PY -m pip install --no-deps .gpu/lssa-*.whl && $PY -m pytest -q crates/lssa-py/tests"
        return 0
    fi
    "$PY" -m pip install --no-deps --force-reinstall .gpu/lssa-*.whl > "$OUT/pytest-install.txt" 2>&1 &&
        timeout 570 "$PY" -m pytest -q -rs crates/lssa-py/tests 2>&1 | tee "$OUT/pytest.txt"
    local rc=${PIPESTATUS[0]}
    echo "pytest: exit $rc" | tee -a "$OUT/pytest.txt"
    return "$rc"
}

# The check of Auto's kernels (the switch of issue 47): two calls of at most SHIP_CALL_S seconds of work each (the
# device's 15 minutes include its start-up), every limit below inside that.
SHIP_CALL_S=360
SHIP_CHECK_S=300   # ship1: check, with the pytest stage beside it (two processes on one GPU)
SHIP_PYTEST_S=300  # ship1: wheel install (at most 30 s) and the CUDA tests under Auto
SHIP_SPEED64_S=220 # ship2: d = 64 with FlexAttention, then
SHIP_SPEED128_S=130 # ship2: d = 128
verdict_line() { # what a verdict of ship1 means
    if [ "$1" = PASS ]; then
        echo "Kernel::Auto's kernels (v5 + v7 at d = 64, v3 + v7 at 128) hold on this GPU."
    else
        echo "Kernel::Auto's kernels FAIL on this GPU (see ship-check.txt and ship-pytest.txt): v5 + v7 became Auto's on"
        echo "2026-11-27 (issue 47); until the cause is found, LSSA_CUDA_KERNEL=v3 (a lab build) runs the previous pair."
    fi
}
ship_pytest() { # the Python suite's CUDA tests under Auto, from the carried wheel
    local cmd="$PY -m pytest -v -rs crates/lssa-py/tests/test_cuda.py"
    if [ "$DRY" = 1 ]; then
        echo "would run (ship-pytest, at most $SHIP_PYTEST_S s, beside ship-check): $PY -m pip install --no-deps .gpu/lssa-*.whl (at most 30 s), then $cmd"
        return 0
    fi
    local started=$SECONDS
    timeout 30 "$PY" -m pip install --no-deps --force-reinstall .gpu/lssa-*.whl > "$OUT/ship-pytest-install.txt" 2>&1 ||
        { echo "ship-pytest: the wheel did not install (see ship-pytest-install.txt)" > "$OUT/ship-pytest.txt"; return 2; }
    LSSA_CUDA_KERNEL=auto timeout $((SHIP_PYTEST_S - (SECONDS - started))) "$PY" -m pytest -v -rs crates/lssa-py/tests/test_cuda.py > "$OUT/ship-pytest.txt" 2>&1
    local rc=$?
    echo "ship-pytest: exit $rc (124 = timed out after ${SHIP_PYTEST_S} s)" >> "$OUT/ship-pytest.txt"
    return "$rc"
}
ship_plan() {
    cat << EOF
The check of Kernel::Auto's kernels on a GPU (v5 + v7 at head dimension 64, v3 + v7 at 128, since issue 47).
Build machine, from the repository root:
  cargo build --release -p lssa-benches --bin bench-cuda
  mkdir -p .gpu && cp target/release/bench-cuda .gpu/ && strip .gpu/bench-cuda
  (cd crates/lssa-py && maturin build --release) && cp crates/lssa-py/target/wheels/lssa-*.whl .gpu/
GPU machine, from the repository root with .gpu/ carried over, two calls of at most $SHIP_CALL_S s of work each:
  benches/gpu-session.sh ship1   # decisive: every check case of v5 + v7 and v8 + v9 (at most $SHIP_CHECK_S s), beside it the
                                 # Python suite's CUDA tests under Auto (at most $SHIP_PYTEST_S s)
                                 # -> $OUT/gpu.txt, ship-check.{txt,json,md}, ship-pytest-install.txt, ship-pytest.txt, ship1-verdict.txt
  benches/gpu-session.sh ship2   # the speed table, SDPA and FlexAttention beside it: d = 64 (at most $SHIP_SPEED64_S s), d = 128 (at most $SHIP_SPEED128_S s)
                                 # -> $OUT/ship-speed64.{txt,json,md}, ship-speed128.{txt,json,md}, ship2-verdict.txt
DRY_RUN=1 benches/gpu-session.sh ship1 (or ship2) prints the commands and limits and runs nothing.
EOF
}

case "$stage" in
ship) ship_plan ;;
ship1)
    echo "ship1: check of v5 + v7 and v8 + v9 (at most $SHIP_CHECK_S s) and, beside it, the CUDA tests under Auto (at most $SHIP_PYTEST_S s)"
    if [ "$DRY" = 1 ]; then
        run ship-check "$SHIP_CHECK_S" check --kernels v7,v8
        ship_pytest
        echo "then: $OUT/ship1-verdict.txt (PASS when the check ran to its end with no failing row of Auto's pairs, v8's counted apart, and the tests passed) and what it means"
        exit 0
    fi
    ship_pytest &
    pytest_pid=$!
    run ship-check "$SHIP_CHECK_S" check --kernels v7,v8
    check_rc=$?
    wait "$pytest_pid"
    pytest_rc=$?
    echo "--- ship-pytest.txt (the CUDA tests under Auto) ---"
    tail -n 60 "$OUT/ship-pytest.txt"
    # The check exits 1 when any row fails, the lab's v8 + v9 included: Auto's verdict reads the rows of
    # its own pairs (v5 + v7, v3 + v7, and the GPT under v7) in a check that ran to its end.
    auto_failed=$(grep -cE '(v5\+v7|v3\+v7| v7 \|).*FAIL *$' "$OUT/ship-check.txt")
    lab_failed=$(grep -cE '(v8\+v9|v8\+v7| v8 \|).*FAIL *$' "$OUT/ship-check.txt")
    if [ "$check_rc" -le 1 ] && grep -q '^wrote ' "$OUT/ship-check.txt" && [ "$auto_failed" -eq 0 ] &&
        [ "$pytest_rc" -eq 0 ]; then verdict=PASS; else verdict=FAIL; fi
    echo "ship1: $verdict (Auto's check rows failed: $auto_failed, the lab's v8 rows: $lab_failed; check exit $check_rc, pytest exit $pytest_rc; 124 = timed out)" |
        tee "$OUT/ship1-verdict.txt"
    verdict_line "$verdict"
    [ "$verdict" = PASS ] ;;
ship2)
    run ship-speed64 "$SHIP_SPEED64_S" speed --head-dims 64 --lengths 4096,16384 --flex
    rc64=$?
    run ship-speed128 "$SHIP_SPEED128_S" speed --head-dims 128 --lengths 4096,16384
    rc128=$?
    if [ "$DRY" = 1 ]; then
        echo "then: $OUT/ship2-verdict.txt (the exit codes)"
        exit 0
    fi
    echo "ship2: speed64 exit $rc64, speed128 exit $rc128 (124 = timed out)" | tee "$OUT/ship2-verdict.txt"
    [ -f "$OUT/ship1-verdict.txt" ] && cat "$OUT/ship1-verdict.txt"
    [ "$rc64" -eq 0 ] && [ "$rc128" -eq 0 ] ;;
first)
    run first-check 300 check --only-t 77,300
    rc=$?
    run first-speed 240 speed --head-dims 64 --lengths 4096 --reps 5
    [ "$rc" -eq 0 ] ;; # the check's failure is the stage's, after the timings
check) run check 420 check ;;
lab) run lab 540 speed --head-dims 64 --lengths 4096,8192,16384 ;;
model) run model 540 model ;;
full64) run full64 570 speed --head-dims 64 ;;
full128) run full128 570 speed --head-dims 128 ;;
flex) run flex 570 speed --head-dims 64 --lengths 1024,4096,16384 --flex ;;
pytest) pytest_cuda ;;
all)
    rc=0
    for s in check lab model full64 full128 flex; do "$0" "$s" || rc=1; done
    pytest_cuda || rc=1
    [ "$rc" -eq 0 ] ;;
esac
