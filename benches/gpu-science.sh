# The `science` stage of benches/gpu-session.sh, which sources this file (it is not run alone): the
# `gpu` scale's headline rows trained and evaluated on one GPU by a `reproduce` binary built elsewhere,
# in priority order, so that a call cut by its limit leaves whole results:
#   softmax seed 0, lssa+rw15 seed 0, lssa seed 0 (also read post hoc with p = 15), then seeds 1, 2, ...
#   of the same rows while the budget lasts.
# Each (row, seed) is one `reproduce --scale gpu --claims-only --only ROW --seeds K+1 --out RUNS
# --no-report`: it trains only what RUNS lacks and evaluates what the claims read (1x..16x, NTK and
# plain; post hoc p = 15 where a claim reads it), writing result.json at once. A run starts only when
# its expected time fits in what is left of the budget: the time model below for a row not yet run
# (scaled by how the runs so far compared with it), else the row's last measured time. Every run is
# held to what is left, so the stage ends within SCIENCE_S.
#
# Files under $OUT (the device tool returns at most 8): gpu.txt, science-plan.txt (the time model and
# the schedule), science.txt (every run's log), science-runs.tsv (one line per run: row, seed, exit,
# seconds, expected seconds, evaluations), science-results.tar (rewritten after every finished run:
# each run's result.json, config.toml and metrics.jsonl, under the runs directory's name, e.g.
# gpu/softmax/result.json), science-verdict.txt (what finished and the commands that render the report).
#
# Options (environment): SCIENCE_S (seconds of work, default 380), SCIENCE_SEEDS (at most this many
# seeds per row, default 8), RUNS (the runs directory, default runs/gpu: the results' configs name it,
# so the report is rendered with the same --out), REHEARSAL=1 (the same stage on the CPU at the `smoke`
# scale, into runs/gpu-rehearsal, with no GPU or data check: crates/experiments/tests/gpu_science.rs).

SCIENCE_ROWS="softmax lssa+rw15 lssa"
SCIENCE_S=${SCIENCE_S:-380}
SCIENCE_SEEDS=${SCIENCE_SEEDS:-8}
SCIENCE_CONFIG="$(dirname "${BASH_SOURCE[0]}")/../configs/gpu.toml"
if [ "${REHEARSAL:-0}" = 1 ]; then
    SCIENCE_SCALE=smoke
    RUNS=${RUNS:-runs/gpu-rehearsal}
else
    SCIENCE_SCALE=gpu
    RUNS=${RUNS:-runs/gpu}
fi

# The time model's measured inputs (docs/bench/cuda.md; LAB.md for v1) and its assumptions.
GPT2_TOKENS_S=192880 # GPT-2 124M forward+backward step, fused `lssa`, T = 1024, 8K tokens, H100 (2026-11-23)
SDPA_FB_1K=190.8     # SDPA forward+backward TFLOP/s, d = 64, T = 1024, H100 (2026-11-23)
LSSA_FB_4K=113.1     # v5 + v7 forward+backward TFLOP/s, d = 64, T = 4096, H200 (2026-11-27)
LSSA_FWD_4K=179.2    # v5 LSSA forward, same run
LSSAR_FWD_4K=91.5    # v5 LSSAR (p = 15) forward, same run: LSSAR's backward taken as that much slower too
V1_FWD_4K=6.5        # v1 (SIMT, what f32 evaluation runs) forward TFLOP/s at 4K (LAB.md, v1 -> v2)
SHORT_T=0.5          # assumed: at T = 512 the attention kernels run at half their measured rate
F32_DENSE=30         # assumed: f32 matrix products (evaluation runs without autocast), TFLOP/s
HOST_STEP_MS=10      # assumed: host time per step (~1000 eager kernel launches, AdamW on 75 tensors), not overlapped
START_FIRST_S=15     # assumed: the first process (libtorch from a cold disk, the CUDA context)
START_S=8            # assumed: every later process
NVRTC_S=2.2          # one Auto module's NVRTC compile (0.9 s lssa, 2.2 s lssa+rw15; cuda.md), per module not cached
EVAL_FIXED_S=2       # assumed: model build, checkpoint load and validation spans per process
VAL_TARGETS=131072   # the gpu scale's val_targets (scale.rs), at 1x, 2x, 4x, 8x, 16x

# A key of configs/gpu.toml (the gpu scale's recipe, kept equal to scale.rs by a test).
science_key() {
    awk -F' = ' -v k="$1" '$1 == k { print $2; exit }' "$SCIENCE_CONFIG"
}

# Prints the time model and the schedule; writes `row first later` lines (expected seconds of a row's
# first seed and of its later ones) to $1.
science_model() {
    awk -v expect="$1" -v budget="$SCIENCE_S" -v seeds="$SCIENCE_SEEDS" -v rows="$SCIENCE_ROWS" \
        -v L="$(science_key n_layer)" -v H="$(science_key n_head)" -v d="$(science_key d_model)" \
        -v T="$(science_key context_len)" -v V="$(science_key vocab_size)" -v r="$(science_key mlp_ratio)" \
        -v tps="$(science_key tokens_per_step)" -v steps="$(science_key max_steps)" \
        -v g2="$GPT2_TOKENS_S" -v sdpa="$SDPA_FB_1K" -v lfb="$LSSA_FB_4K" -v lf="$LSSA_FWD_4K" \
        -v lrf="$LSSAR_FWD_4K" -v v1="$V1_FWD_4K" -v short="$SHORT_T" -v f32="$F32_DENSE" \
        -v host="$HOST_STEP_MS" -v start1="$START_FIRST_S" -v start="$START_S" -v nvrtc="$NVRTC_S" \
        -v efix="$EVAL_FIXED_S" -v vt="$VAL_TARGETS" '
    function params(V, d, L, r) { return int((V + 63) / 64) * 64 * d + L * (4*d*d + 4*d + 2*r*d*d + (r+1)*d + 4*d) + 2*d }
    BEGIN {
        N = params(V, d, L, r); ftok = 6 * N + 12 * L * d * T
        N2 = params(50257, 768, 12, 4); f2 = 6 * N2 + 12 * 12 * 768 * 1024
        rdense = g2 * f2 * d / 768
        astep = 3.5 * 2 * (tps / T) * H * T * T * (d / H) * L
        rate["softmax"] = sdpa * short; rate["lssa"] = lfb * short; rate["lssa+rw15"] = lfb * lrf / lf * short
        mods["softmax"] = 1; mods["lssa+rw15"] = 2; mods["lssa"] = 2
        # Evaluation in f32: per length, the dense forward 2 N x targets, and causal attention
        # 2 m T d L x targets at v1 rate (twice the time re-weighted: two sweeps).
        d1 = 2 * N * vt / (f32 * 1e12); a1 = 2 * T * d * L * vt / (v1 * 1e12)
        # (lengths, sum of multiples) of a group with 1x (ntk) and without it (plain): 1..16.
        n1 = 5; s1 = 31; n2 = 4; s2 = 30
        ev["softmax"] = (n1 + n2 + 1) * d1 + (s1 + s2) * a1 + 2 * a1
        ev["lssa+rw15"] = (n1 + n2) * d1 + 2 * (s1 + s2) * a1
        ev["lssa"] = 2 * (n1 + n2) * d1 + 3 * (s1 + s2) * a1
        printf "time model (an H100 / H200, before any GPU run; inputs: docs/bench/cuda.md, the recipe of configs/gpu.toml):\n"
        printf "  model: %d layers, width %d, %d heads of %d, T = %d, vocabulary %d; %d steps of %d tokens\n", L, d, H, d / H, T, V, steps, tps
        printf "  parameters N = %d; training FLOPs per token 6 N + 12 L d T = %.4e (ModelConfig::flops_per_token); per step %.3e\n", N, ftok, ftok * tps
        printf "  matrix products: GPT-2 124M step (fused lssa, T = 1024, H100) %d tokens/s x %.4e FLOPs/token = %.1f TFLOP/s, x %d/768 for the width = %.1f TFLOP/s -> %.2f ms per step\n", g2, f2, g2 * f2 / 1e12, d, rdense / 1e12, 6 * N * tps / rdense * 1e3
        printf "  attention per step (causal, forward+backward = 3.5 x forward): %.3e FLOPs at x %s the measured rate for T = %d:\n", astep, short, T
        split(rows, R, " ")
        for (i = 1; i in R; i++) {
            row = R[i]
            step = 6 * N * tps / rdense + astep / (rate[row] * 1e12) + host / 1e3
            tr[row] = steps * step
            first[row] = nvrtc * mods[row] + tr[row] + ev[row] + efix
            later[row] = tr[row] + ev[row] + efix
            printf "    %-10s %6.1f TFLOP/s -> %.2f ms; with %d ms of host time a step takes %.1f ms: training %.0f s\n", row, rate[row], astep / (rate[row] * 1e12) * 1e3, host, step * 1e3, tr[row]
        }
        printf "  evaluation (f32, no autocast; %d targets at 1x..16x, NTK and plain; p = 15 where the claims read it): softmax %.0f s, lssa+rw15 %.0f s, lssa %.0f s\n", vt, ev["softmax"], ev["lssa+rw15"], ev["lssa"]
        printf "  per process: %d s to start the first, %d s each later one; NVRTC %.1f s per module not yet cached (softmax 1, lssa+rw15 2, lssa 2 new), %d s of evaluation set-up\n", start1, start, nvrtc, efix
        printf "schedule (expected seconds; a run starts only if it fits in what is left of %d s):\n", budget
        printf "  %-10s %4s %7s %6s %7s %10s  %s\n", "row", "seed", "train", "eval", "total", "cumulative", "fits"
        total = 0; fit = 0; through = -1
        for (k = 0; k < seeds; k++) {
            whole = 1
            for (i = 1; i in R; i++) {
                row = R[i]
                t = (k == 0 ? first[row] : later[row]) + (total == 0 ? start1 : start)
                total += t
                ok = total <= budget
                if (ok) fit++; else whole = 0
                printf "  %-10s %4d %7.0f %6.0f %7.0f %10.0f  %s\n", row, k, tr[row], ev[row], t, total, ok ? "yes" : "no"
            }
            if (whole) through = k
            if (total > budget) break
        }
        printf "expected: %d runs in %d s; every row through seed %d", fit, budget, through
        printf (through >= 0 ? " (seed 0 of each row fits: the recipe is not shrunk)\n" : " (SEED 0 OF EACH ROW DOES NOT FIT: shrink the recipe)\n")
        printf "uncertainty: the host time per step and the width discount are assumptions, not measurements; each 10 ms more per step adds %.0f s per run\n", steps * 0.01
        for (i = 1; i in R; i++) print R[i], int(first[R[i]] + (i == 1 ? start1 : start) + 0.5), int(later[R[i]] + start + 0.5) > expect
    }'
}

# The training data the gpu scale reads: data/default's manifest and every file it names.
data_missing() {
    local dir=data/default f
    [ -f "$dir/manifest.json" ] ||
        { echo "no $dir/manifest.json: carry data/default to this machine (see the top of $0)"; return 2; }
    for f in $(grep -o '"file": *"[^"]*"' "$dir/manifest.json" | sed 's/.*"\([^"]*\)"$/\1/'); do
        [ -s "$dir/$f" ] || { echo "$dir/$f, which $dir/manifest.json names, is missing or empty"; return 2; }
    done
}

# The directory of libraries for LD_LIBRARY_PATH under which $BIN finds all it needs: empty when it
# already does; else links to those of .gpu/lib that the loader reports missing (and only those, so
# the machine's own libraries win), round by round as each reveals its own needs. Prints the
# directory, or the reason and returns 2.
science_libs() {
    command -v ldd > /dev/null 2>&1 || return 0
    local dir=$1 missing lib round
    for round in 1 2 3 4 5; do
        missing=$(LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$BIN" 2> /dev/null |
            awk '/not found/ { print $1 }' | sort -u)
        if [ -z "$missing" ]; then
            [ "$round" = 1 ] || echo "$dir"
            return 0
        fi
        for lib in $missing; do
            [ -e ".gpu/lib/$lib" ] || {
                echo "$BIN needs $(echo $missing), which this machine lacks and .gpu/lib does not carry (see the top of $0)"
                return 2
            }
            mkdir -p "$dir" && ln -sf "$PWD/.gpu/lib/$lib" "$dir/$lib"
        done
    done
    echo "$BIN: the libraries it needs did not resolve in 5 rounds"
    return 2
}

# Rewrites $OUT/science-results.tar (through a temporary file) with every run's result.json,
# config.toml and metrics.jsonl under $RUNS, named from the runs directory's own name.
science_pack() {
    local parent name files
    parent=$(dirname "$RUNS")
    name=$(basename "$RUNS")
    files=$(cd "$parent" && for r in "$name"/*/result.json; do
        [ -f "$r" ] || continue
        dir=$(dirname "$r")
        for f in result.json config.toml metrics.jsonl; do [ -f "$dir/$f" ] && echo "$dir/$f"; done
    done)
    [ -n "$files" ] || return 0
    # shellcheck disable=SC2086 # run directory names hold no spaces (runner::run_dir_name)
    tar -cf "$OUT/science-results.tar.tmp" -C "$parent" $files && mv "$OUT/science-results.tar.tmp" "$OUT/science-results.tar"
}

# The run directory of seed k of row (runner::run_dir).
science_dir() {
    local dir=${1//[^A-Za-z0-9-]/_}
    [ "$2" = 0 ] && echo "$RUNS/$dir" || echo "$RUNS/${dir}_seed$2"
}

# The command that trains and evaluates seed $2 of row $1 (and any earlier seed it lacks).
science_cmd() {
    echo "$BIN --scale $SCIENCE_SCALE --claims-only --only $1 --seeds $(($2 + 1)) --out $RUNS --no-report"
}

science_render_help() {
    local seeds=$1
    cat << EOF2
Render the report where the results come back (a checkout with data/default, at the commit that built
the binary or later), from the repository root:
  mkdir -p $(dirname "$RUNS") && tar -xf FILES_AT/science-results.tar -C $(dirname "$RUNS")
  cargo xtask reproduce --scale $SCIENCE_SCALE --claims-only --seeds $seeds --out $RUNS --report-only
-> $([ "$SCIENCE_SCALE" = gpu ] && echo "docs/REPRODUCTION-gpu.md and docs/figures-gpu/" || echo "$RUNS/REPRODUCTION.md") (FILES_AT: where the device tool put this call's files).
EOF2
}

# The stage: the plan, then the runs in priority order while the budget lasts, then the verdict.
science_stage() {
    local expect plan
    expect=$(mktemp)
    plan=$(science_model "$expect")
    echo "science: the $SCIENCE_SCALE scale's headline rows ($SCIENCE_ROWS), seed by seed, at most $SCIENCE_S s of work"
    [ "${REHEARSAL:-0}" = 1 ] &&
        echo "REHEARSAL=1: the smoke scale on the CPU into $RUNS; the times below are the GPU's model, not this machine's"
    echo "$plan"
    echo "each run: $BIN --scale $SCIENCE_SCALE --claims-only --only ROW --seeds K+1 --out $RUNS --no-report (ROW in priority order, K = the seed index)"
    echo "then: $OUT/science-results.tar (after every run), science-runs.tsv, science.txt, science-verdict.txt"
    if [ "$DRY" = 1 ]; then
        local why
        why=$(science_libs "${TMPDIR:-/tmp}/lssa-gpu-lib-$$") || echo "note: $why; a real run would stop here with exit 2"
        rm -rf "${TMPDIR:-/tmp}/lssa-gpu-lib-$$"
        science_render_help "$SCIENCE_SEEDS"
        rm -f "$expect"
        return 0
    fi
    echo "$plan" > "$OUT/science-plan.txt"
    local libdir
    # Outside $OUT: the device tool returns plain files only.
    libdir=$(science_libs "${TMPDIR:-/tmp}/lssa-gpu-lib") || { echo "gpu-session science: $libdir" >&2; return 2; }
    [ -n "$libdir" ] && export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" &&
        echo "libraries from .gpu/lib: $(ls "$libdir" | tr '\n' ' ')"
    # PTX compiled on the build machine (the top of gpu-session.sh), if carried.
    export LSSA_PTX_CACHE=${LSSA_PTX_CACHE:-$PWD/.gpu/ptx-cache}
    [ -f .gpu/ptx-cache.tar.xz ] && mkdir -p "$LSSA_PTX_CACHE" && tar -xJf .gpu/ptx-cache.tar.xz -C "$LSSA_PTX_CACHE" &&
        echo "PTX cache: $(ls "$LSSA_PTX_CACHE" | wc -l) modules from .gpu/ptx-cache.tar.xz"
    # The build's revision, which the runs record (no .git travels; trainer::git_revision).
    [ -s .gpu/REVISION ] && export LSSA_GIT_REVISION=${LSSA_GIT_REVISION:-$(head -n 1 .gpu/REVISION)}
    printf 'row\tseed\texit\tseconds\texpected_s\tevals\n' > "$OUT/science-runs.tsv"
    : > "$OUT/science.txt"
    local started=$SECONDS measured=0 modelled=0 finished=0 failures=0 k row
    declare -A last first later seeds_done
    while read -r row f l; do first[$row]=$f; later[$row]=$l; done < "$expect"
    rm -f "$expect"
    for ((k = 0; k < SCIENCE_SEEDS; k++)); do
        for row in $SCIENCE_ROWS; do
            local left=$((SCIENCE_S - (SECONDS - started))) model want
            model=${first[$row]}
            [ "$k" -gt 0 ] && model=${later[$row]}
            # The row's last measured time, else the model scaled by the runs so far.
            if [ -n "${last[$row]:-}" ]; then want=${last[$row]}; elif [ "$modelled" -gt 0 ]; then
                want=$((model * measured / modelled)); else want=$model; fi
            if [ "$left" -le 0 ] || [ "$want" -gt "$left" ]; then
                echo "science: $row seed $k would take about $want s and $left s are left: stopping"
                break 2
            fi
            echo "=== $row seed $k: expected $want s, $left s left: $(science_cmd "$row" "$k")" | tee -a "$OUT/science.txt"
            local t0=$SECONDS rc
            # shellcheck disable=SC2046 # the command's words
            timeout -k 10 "$left" $(science_cmd "$row" "$k") >> "$OUT/science.txt" 2>&1
            rc=$?
            local took=$((SECONDS - t0)) result evals=0
            result="$(science_dir "$row" "$k")/result.json"
            # One `seq_len` per evaluation (trainer::eval::LengthLoss).
            [ -f "$result" ] && evals=$(grep -c '"seq_len":' "$result")
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$k" "$rc" "$took" "$want" "$evals" >> "$OUT/science-runs.tsv"
            if [ "$rc" = 0 ] && [ -f "$result" ]; then
                science_pack
                last[$row]=$took
                measured=$((measured + took))
                modelled=$((modelled + model))
                finished=$((finished + 1))
                seeds_done[$row]=$((k + 1))
                failures=0
                echo "science: $row seed $k done in $took s ($evals evaluations; $(du -h "$OUT/science-results.tar" | cut -f1) packed)"
            else
                echo "science: $row seed $k FAILED (exit $rc; 124 = cut by the budget) after $took s; its log's end:"
                tail -n 15 "$OUT/science.txt"
                science_pack
                [ "$rc" = 124 ] && break 2
                failures=$((failures + 1))
                [ "$failures" -ge 3 ] && { echo "science: 3 failures in a row: stopping"; break 2; }
            fi
        done
    done
    local all=1 most=0 summary=""
    for row in $SCIENCE_ROWS; do
        local n=${seeds_done[$row]:-0}
        [ "$n" -ge 1 ] || all=0
        [ "$n" -gt "$most" ] && most=$n
        summary="$summary$row: $n seeds; "
    done
    {
        echo "science: $finished runs finished in $((SECONDS - started)) s of $SCIENCE_S (${summary}seed 0 of every row: $([ "$all" = 1 ] && echo yes || echo NO))"
        science_render_help "$((most > 0 ? most : 1))"
    } | tee "$OUT/science-verdict.txt"
    [ "$all" = 1 ]
}
