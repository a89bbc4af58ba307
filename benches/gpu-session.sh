#!/usr/bin/env bash
# One stage of the CUDA kernel lab on a GPU machine without a Rust toolchain, from a `bench-cuda` built
# elsewhere. On the build machine:
#   cargo build --release -p lssa-benches --bin bench-cuda
#   mkdir -p .gpu && cp target/release/bench-cuda .gpu/ && strip .gpu/bench-cuda
# then carry .gpu/ to the GPU machine and run, from the repository root, one stage per call (each
# stays under ten minutes):
#   benches/gpu-session.sh first     # the key facts in one call, for a session with little GPU time: the wgmma
#                                    # layout probe and every kernel version vs attn-core at T = 77 and 300, then
#                                    # every version's TFLOP/s at d = 64, T = 4096 (and memory at 16K, 64K)
#   benches/gpu-session.sh check     # wgmma layout probe, then every kernel version vs attn-core (f64)
#   benches/gpu-session.sh lab       # kernel resources, then TFLOP/s of every version at d = 64, T = 4K..16K
#   benches/gpu-session.sh model     # GPT-2 124M step, reference vs each fused generation
#   benches/gpu-session.sh full64    # the table at d = 64, T = 1K..32K, and memory at 16K and 64K
#   benches/gpu-session.sh full128   # the same at d = 128
#   benches/gpu-session.sh flex      # ours vs LSSA/LSSAR written for compiled FlexAttention, d = 64, T = 1K/4K/16K
#   benches/gpu-session.sh pytest    # the Python package's suite on CUDA (fused and flex), from a wheel built here:
#                                    #   (cd crates/lssa-py && maturin build --release) && cp crates/lssa-py/target/wheels/*.whl .gpu/
#   benches/gpu-session.sh all       # every stage above in order (about 40 minutes of an H100), where no call limit applies
# DRY_RUN=1 prints each command a stage would run, with its time limit, and runs nothing (no GPU or binary needed).
# Output (text and JSON) goes to $OUT (default .gpu/out); the text is also printed.
set -uo pipefail
BIN=${BIN:-.gpu/bench-cuda}
OUT=${OUT:-.gpu/out}
DRY=${DRY_RUN:-0}
stage=${1:-check}
if [ "$DRY" = 1 ]; then
    echo "gpu-session: dry run of stage $stage (nothing runs)"
else
    mkdir -p "$OUT"
    [ -x "$BIN" ] || { echo "no $BIN: build and carry it first (see the top of $0)" >&2; exit 2; }
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
[ "$DRY" = 1 ] || nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1 || true
pytest_cuda() { # the package's suite with its CUDA tests, from the carried wheel
    local py=${PYTHON:-python3}
    if [ "$DRY" = 1 ]; then
        echo "would run (pytest, at most 570 s): $py -m pip install --no-deps .gpu/lssa-*.whl && $py -m pytest -q crates/lssa-py/tests"
        return 0
    fi
    "$py" -m pip install --no-deps --force-reinstall .gpu/lssa-*.whl > "$OUT/pytest-install.txt" 2>&1 &&
        timeout 570 "$py" -m pytest -q -rs crates/lssa-py/tests 2>&1 | tee "$OUT/pytest.txt"
    local rc=${PIPESTATUS[0]}
    echo "pytest: exit $rc" | tee -a "$OUT/pytest.txt"
    return "$rc"
}
case "$stage" in
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
*) echo "unknown stage $stage (first, check, lab, model, full64, full128, flex, pytest, all)" >&2; exit 2 ;;
esac
