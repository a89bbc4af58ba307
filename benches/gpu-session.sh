#!/usr/bin/env bash
# One stage of a GPU session on a machine without a Rust toolchain or a network, from binaries built
# elsewhere: the reproduction's `gpu` scale (`science`) and the CUDA kernel lab (the others).
#
# On the build machine, from the repository root (`.gpu/` is untracked and travels with the working
# tree; `data/` is ignored and must be carried):
#   cargo build --release -p lssa-benches --bin bench-cuda
#   mkdir -p .gpu && cp target/release/bench-cuda .gpu/ && strip .gpu/bench-cuda
# for `science`, the reproduction binary and the libraries it links beside libtorch and glibc (the
# GPU machine may lack libfontconfig and libfreetype, which the report's figures use; a run takes from
# .gpu/lib only what its loader reports missing):
#   cargo build --release -p experiments --bin reproduce
#   cp target/release/reproduce .gpu/ && strip .gpu/reproduce
#   readelf -d .gpu/reproduce | grep RUNPATH   # must name /opt/torch/.venv/lib/python3.12/site-packages/torch/lib
#   mkdir -p .gpu/lib && ldd .gpu/reproduce | awk '$3 ~ /^\/(usr\/)?lib/ && $1 !~ /^(libc\.|libm\.|libstdc|libgcc_s|ld-linux|libdl|librt|libpthread|libutil)/ { print $3 }' | xargs -r cp -L -t .gpu/lib/
#   echo "$(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD || echo -dirty)" > .gpu/REVISION   # the runs' revision
# for the stages that run the Python package (pytest, ship1), its wheel:
#   (cd crates/lssa-py && maturin build --release) && cp crates/lssa-py/target/wheels/lssa-*.whl .gpu/
# and, for ship1 (and science), the kernels' PTX compiled here, where NVRTC is the GPU machine's
# (13.0, the torch venv's, found through LIBTORCH): no GPU needed, and the GPU call compiles nothing
# (about 3 CPU-seconds a module, some 130 modules; xz shrinks the PTX about 25 times):
#   LIBTORCH=$PWD/.torch/libtorch LSSA_PTX_CACHE=$PWD/.gpu/ptx-cache target/release/bench-cuda warm --arch compute_90a \
#       --kernels v7,v8 --python-suite crates/lssa-py/tests/test_cuda.py --head-dims 64 --variants softmax+rw15,lssa,lssa+rw15
#   tar -cJf .gpu/ptx-cache.tar.xz -C .gpu/ptx-cache . && rm -r .gpu/ptx-cache
# Keep .gpu/ to those files (du -sh .gpu: about 30 MB; the working tree, .gpu/ and the carried paths
# travel within 64 MiB; .gpu/ is not git-ignored, so it travels uncarried), then run, from the
# repository root, one stage per call (each under ten minutes):
#   benches/gpu-session.sh science   # the gpu scale's headline rows: softmax, lssa+rw15, lssa seed 0, then
#                                    # seeds 1, 2, ... while SCIENCE_S (380 s) lasts; the plan (DRY_RUN=1)
#                                    # gives the time model; benches/gpu-science.sh has the details
#   benches/gpu-session.sh ship      # prints the plan of the run that checks Auto's kernels (v5 + v7 since issue 47)
#                                    # on a GPU: two calls, ship1 then ship2, the decisive facts first; runs nothing
#   benches/gpu-session.sh ship1     # the PTX cache warmed, then every check case of v5 + v7 and v8 + v9
#                                    # (`check --kernels v7,v8`), beside it the Python suite's CUDA tests under
#                                    # Auto in the order that matters; then the verdict (about 4 minutes)
#   benches/gpu-session.sh ship2     # the speed table with SDPA and FlexAttention beside it at d = 64 (T = 4K,
#                                    # 16K), then d = 128 without FlexAttention
#   benches/gpu-session.sh v10       # lab v10 (issue 63) in one call of under 6 minutes: the wgmma and TMA layout
#                                    # probes and v10 + v7 against attn-core (`check --kernels v10`, T = 77 and 300),
#                                    # then its speed beside SDPA, Auto (v5) and v5 at d = 64, T = 4K and 16K; the
#                                    # PTX cache first where the build machine compiled it (32 lab modules in 72 s on
#                                    # 2 cores, 112 MB before xz; with speed's Auto modules):
#                                    #   bench-cuda warm --arch compute_90a --kernels v5,v10 --only-t 77,300 \
#                                    #       --variants lssa,lssa+rw15,linear-l1 --head-dims 64
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
# With the device tool of this workplace (its `run`): call 1, the science, then call 2 at once (the
# machine stays warm 30 s), then give it back; commit what comes back before anything else:
#   run(command="benches/gpu-session.sh science", carry=["data/default"], timeout_s=420)
#   run(command="benches/gpu-session.sh ship1", timeout_s=270)
# (data/default must be a directory, not a link: a carried link travels as a link.) The science call
# returns science-results.tar; back here, from the repository root (data/default present; N = the most
# seeds a row finished, science-verdict.txt gives both lines):
#   mkdir -p runs && tar -xf FILES_AT/science-results.tar -C runs     # -> runs/gpu/<run>/result.json
#   cargo xtask reproduce --scale gpu --claims-only --seeds N --report-only   # -> docs/REPRODUCTION-gpu.md
# DRY_RUN=1 prints each command a stage would run, with its time limit, and whether the GPU, the binary,
# the data and the wheel it needs are here; it runs nothing and needs none of them. A real run first
# checks for them and stops with exit 2 and the reason (no `nvidia-smi`, no CUDA device, no binary, no
# data, no wheel, a library the binary needs and nothing carries). REHEARSAL=1 runs `science` on the CPU
# at the smoke scale with no GPU or data check (the test suite does: crates/experiments/tests/gpu_science.rs).
# Output goes to $OUT (default .gpu/out), each stage's text as it runs (`NAME.txt`, also printed) and
# bench-cuda's JSON (`NAME.json`, rewritten after every check case and every timed length, with
# `"partial": true` until it ends, and `NAME.md`), so a stage stopped by its limit leaves what it did.
# science writes gpu.txt, science-plan.txt, science.txt, science-runs.tsv, science-results.tar and
# science-verdict.txt; ship1 gpu.txt, ship-warm.txt, ship-check.{txt,json,md}, ship-pytest.txt and
# ship1-verdict.txt; ship2 ship-speed64.{txt,json,md}, ship-speed128.{txt,json,md} and ship2-verdict.txt
# (the device tool returns at most 8 files a call).
set -uo pipefail
OUT=${OUT:-.gpu/out}
DRY=${DRY_RUN:-0}
PY=${PYTHON:-python3}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
stage=${1:-check}
STAGES="science, ship, ship1, ship2, v10, first, check, lab, model, full64, full128, flex, pytest, all"
if [ "$stage" = science ]; then BIN=${BIN:-.gpu/reproduce}; else BIN=${BIN:-.gpu/bench-cuda}; fi

case "$stage" in
science | ship | ship1 | ship2 | v10 | first | check | lab | model | full64 | full128 | flex | pytest | all) ;;
*) echo "unknown stage $stage ($STAGES)" >&2; exit 2 ;;
esac
# The science stage and the data check.
. "$(dirname "$0")/gpu-science.sh"

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
science) if [ "${REHEARSAL:-0}" = 1 ]; then needs=(bin); else needs=(gpu bin data); fi ;;
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
    if [ "${REHEARSAL:-0}" = 1 ] && [ "$stage" = science ]; then
        echo "REHEARSAL=1: on the CPU, no GPU" > "$OUT/gpu.txt"
    elif [ "$stage" != ship ]; then
        "$NVIDIA_SMI" --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1 || true
    fi
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

# The check of Auto's kernels (the switch of issue 47): ship1 in about 4 minutes of work, ship2 in about 6 (the
# device's 15 minutes include its start-up and the science call), every limit below inside that. Most of what
# ship1 cost before (2026-11-27: 198 s for check's 48 modules, and pytest cut after 37 of 114 tests) was
# NVRTC, module by module: the PTX cache is warmed first, from .gpu/ptx-cache.tar.xz when the build machine
# compiled it (the top of this file), else on every core here, and the tests run in the order that matters.
SHIP_WARM_S=80      # ship1: bench-cuda warm (what the cache lacks, on every core), the wheel installed beside it
SHIP_CHECK_S=150    # ship1: check, with the CUDA tests beside it (two processes on one GPU)
SHIP_PYTEST_S=150   # ship1: the CUDA tests under Auto, ordered (benches/pytest_auto_first.py)
SHIP_SPEED64_S=220  # ship2: d = 64 with FlexAttention, then
SHIP_SPEED128_S=130 # ship2: d = 128
V10_CHECK_S=170     # v10: both probes, then v10 + v7 on the check's cases at T = 77 and 300
V10_SPEED_S=170     # v10: SDPA, Auto, v5 + v6 and v10 + v7 at d = 64, T = 4096 and 16384
verdict_line() { # what a verdict of ship1 means
    case "$1" in
    PASS) echo "Kernel::Auto's kernels (v5 + v7 at d = 64, v3 + v7 at 128) hold on this GPU." ;;
    INCOMPLETE)
        echo "Nothing failed, but the check or the tests were cut by their limit (see ship-check.txt and ship-pytest.txt):"
        echo "what ran passed; run ship1 again, or the stage that was cut, for the rest." ;;
    *)
        echo "Kernel::Auto's kernels FAIL on this GPU (see ship-check.txt and ship-pytest.txt): v5 + v7 became Auto's on"
        echo "2026-11-27 (issue 47); until the cause is found, LSSA_CUDA_KERNEL=v3 (a lab build) runs the previous pair." ;;
    esac
}
ptx_unpack() { # the PTX the build machine compiled, into $LSSA_PTX_CACHE
    export LSSA_PTX_CACHE=${LSSA_PTX_CACHE:-$PWD/.gpu/ptx-cache}
    if [ ! -f .gpu/ptx-cache.tar.xz ]; then
        echo "note: no .gpu/ptx-cache.tar.xz: every module is compiled here (NVRTC, on every core, within the warm limit)"
    elif [ "$DRY" = 1 ]; then
        echo "would unpack .gpu/ptx-cache.tar.xz into $LSSA_PTX_CACHE"
    else
        mkdir -p "$LSSA_PTX_CACHE" && tar -xJf .gpu/ptx-cache.tar.xz -C "$LSSA_PTX_CACHE" &&
            echo "PTX cache: $(ls "$LSSA_PTX_CACHE" | wc -l) modules from .gpu/ptx-cache.tar.xz in $LSSA_PTX_CACHE"
    fi
}
ship_install() { # the carried wheel; its output opens ship-pytest.txt
    if [ "$DRY" = 1 ]; then
        echo "would install (at most 30 s, beside the warm): $PY -m pip install --no-deps --force-reinstall .gpu/lssa-*.whl"
        return 0
    fi
    { timeout 30 "$PY" -m pip install --no-deps --force-reinstall .gpu/lssa-*.whl 2>&1 && echo installed; } > "$OUT/ship-pytest.txt"
}
ship_pytest() { # the Python suite's CUDA tests under Auto, ordered, from the wheel ship_install installed
    local cmd="$PY -m pytest -v -rs -p pytest_auto_first crates/lssa-py/tests/test_cuda.py"
    if [ "$DRY" = 1 ]; then
        echo "would run (ship-pytest, at most $SHIP_PYTEST_S s, beside ship-check): LSSA_CUDA_KERNEL=auto PYTHONPATH=benches $cmd"
        echo "  (the order of benches/pytest_auto_first.py: softmax, lssa, lssa+rw15 in bf16 then f16 at d = 64; the other"
        echo "  variants at d = 64; d = 128; strided views and side streams; f32, d = 48 and T = 1 (v1); the fallback;"
        echo "  the compiled model last. Each test's line is written as it ends, so a cut run keeps what ran)"
        return 0
    fi
    grep -q '^installed$' "$OUT/ship-pytest.txt" ||
        { echo "ship-pytest: the wheel did not install (see above)" >> "$OUT/ship-pytest.txt"; return 2; }
    # shellcheck disable=SC2086 # the command's words
    PYTHONUNBUFFERED=1 PYTHONPATH="benches${PYTHONPATH:+:$PYTHONPATH}" LSSA_CUDA_KERNEL=auto timeout "$SHIP_PYTEST_S" \
        $cmd >> "$OUT/ship-pytest.txt" 2>&1
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
  LIBTORCH=\$PWD/.torch/libtorch LSSA_PTX_CACHE=\$PWD/.gpu/ptx-cache target/release/bench-cuda warm --arch compute_90a --kernels v7,v8 --python-suite crates/lssa-py/tests/test_cuda.py
  tar -cJf .gpu/ptx-cache.tar.xz -C .gpu/ptx-cache . && rm -r .gpu/ptx-cache
GPU machine, from the repository root with .gpu/ carried over, two calls:
  benches/gpu-session.sh ship1   # decisive, about 4 minutes: the PTX cache warmed (at most $SHIP_WARM_S s), then every check
                                 # case of v5 + v7 and v8 + v9 (at most $SHIP_CHECK_S s), beside it the Python suite's CUDA
                                 # tests under Auto, the trained variants in bf16 first (at most $SHIP_PYTEST_S s)
                                 # -> $OUT/gpu.txt, ship-warm.txt, ship-check.{txt,json,md}, ship-pytest.txt, ship1-verdict.txt
  benches/gpu-session.sh ship2   # the speed table, SDPA and FlexAttention beside it: d = 64 (at most $SHIP_SPEED64_S s), d = 128 (at most $SHIP_SPEED128_S s)
                                 # -> $OUT/ship-speed64.{txt,json,md}, ship-speed128.{txt,json,md}, ship2-verdict.txt
DRY_RUN=1 benches/gpu-session.sh ship1 (or ship2) prints the commands and limits and runs nothing.
EOF
}

case "$stage" in
science) science_stage ;;
ship) ship_plan ;;
ship1)
    echo "ship1: the PTX cache warmed (at most $SHIP_WARM_S s), then the check of v5 + v7 and v8 + v9 (at most $SHIP_CHECK_S s)"
    echo "and, beside it, the CUDA tests under Auto, ordered (at most $SHIP_PYTEST_S s)"
    ptx_unpack
    if [ "$DRY" = 1 ]; then
        ship_install
        run ship-warm "$SHIP_WARM_S" warm --kernels v7,v8 --python-suite crates/lssa-py/tests/test_cuda.py
        run ship-check "$SHIP_CHECK_S" check --kernels v7,v8
        ship_pytest
        echo "then: $OUT/ship1-verdict.txt: PASS when the check ran to its end with no failing row of Auto's pairs (v8's counted"
        echo "apart) and the tests passed; FAIL when a row of Auto's or a test failed; INCOMPLETE when nothing failed but a limit cut"
        exit 0
    fi
    ship_install &
    install_pid=$!
    run ship-warm "$SHIP_WARM_S" warm --kernels v7,v8 --python-suite crates/lssa-py/tests/test_cuda.py
    wait "$install_pid"
    ship_pytest &
    pytest_pid=$!
    run ship-check "$SHIP_CHECK_S" check --kernels v7,v8
    check_rc=$?
    wait "$pytest_pid"
    pytest_rc=$?
    echo "--- ship-pytest.txt (the CUDA tests under Auto) ---"
    tail -n 40 "$OUT/ship-pytest.txt"
    # The check exits 1 when any row fails, the lab's v8 + v9 included: Auto's verdict reads the rows of
    # its own pairs (v5 + v7, v3 + v7, and the GPT under v7) in a check that ran to its end.
    auto_failed=$(grep -cE '(v5\+v7|v3\+v7| v7 \|).*FAIL *$' "$OUT/ship-check.txt")
    lab_failed=$(grep -cE '(v8\+v9|v8\+v7| v8 \|).*FAIL *$' "$OUT/ship-check.txt")
    tests_failed=$(grep -cE ' (FAILED|ERROR)( |$)' "$OUT/ship-pytest.txt")
    tests_passed=$(grep -cE ' PASSED( |$)' "$OUT/ship-pytest.txt")
    check_done=0
    [ "$check_rc" -le 1 ] && grep -q '^wrote ' "$OUT/ship-check.txt" && check_done=1
    if [ "$auto_failed" -gt 0 ] || [ "$tests_failed" -gt 0 ] || { [ "$pytest_rc" -ne 0 ] && [ "$pytest_rc" -ne 124 ]; }; then
        verdict=FAIL
    elif [ "$check_done" = 1 ] && [ "$pytest_rc" -eq 0 ]; then
        verdict=PASS
    else
        verdict=INCOMPLETE
    fi
    echo "ship1: $verdict (Auto's check rows failed: $auto_failed, the lab's v8 rows: $lab_failed; check exit $check_rc, pytest exit $pytest_rc; tests passed: $tests_passed, failed: $tests_failed; 124 = timed out)" |
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
v10)
    # Lab v10 (issue 63): the probes and the check decide whether v10 is right on this GPU; the speed
    # table whether it beats v5 (its `v10+v7` row against `v5+v6`'s and Auto's, SDPA beside them).
    echo "v10: the layout probes and v10 + v7 against attn-core (at most $V10_CHECK_S s), then the speed at d = 64 (at most $V10_SPEED_S s)"
    ptx_unpack
    run v10-check "$V10_CHECK_S" check --kernels v10 --only-t 77,300
    check_rc=$?
    run v10-speed "$V10_SPEED_S" speed --head-dims 64 --lengths 4096,16384 --kernels v5,v10
    speed_rc=$?
    if [ "$DRY" = 1 ]; then
        echo "then: $OUT/v10-verdict.txt: PASS when both probes and every v10 row passed in a check that ran to its end"
        exit 0
    fi
    probe_failed=$(grep -cE '^  .* FAIL$' "$OUT/v10-check.txt")
    rows_failed=$(grep -cE 'v10\+v7.*FAIL *$' "$OUT/v10-check.txt")
    if [ "$probe_failed" -gt 0 ] || [ "$rows_failed" -gt 0 ]; then
        verdict=FAIL
    elif [ "$check_rc" -eq 0 ] && grep -q '^wrote ' "$OUT/v10-check.txt"; then
        verdict=PASS
    else
        verdict=INCOMPLETE
    fi
    echo "v10: $verdict (probe modes failed: $probe_failed, v10 rows failed: $rows_failed; check exit $check_rc, speed exit $speed_rc; 124 = timed out)" |
        tee "$OUT/v10-verdict.txt"
    grep -E '^ *64 .*\| *(v5|v10|auto) ' "$OUT/v10-speed.txt" | tee -a "$OUT/v10-verdict.txt"
    [ "$verdict" = PASS ] && [ "$speed_rc" -eq 0 ] ;;
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
