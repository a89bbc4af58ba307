"""The power calculation of issue 58 (docs/PILOT.md, "The pilot of training length"): for each claim
the language models' runs judge, its per-seed contrast on the pilot's seeds at each training length
(docs/pilot/length.json), and the share of simulated experiments of n seeds that decide it.

Noise model. A per-seed contrast is drawn from a normal with the pilot's mean at that length and a
planning sd; the 95% interval is the t interval over the n seeds (the report's interval also holds
the validation spans' part, which the planning sd covers: see below). The planning sd of a contrast
is the larger of
  - the pilot's: the sd of its two seeds' values at each training length, pooled over the lengths
    (three degrees of freedom, one per length), and
  - the 7-seed report of 01e5101 at 2000 steps: its half-width / t(0.975, df) x sqrt(7), with the
    report's Welch-Satterthwaite df, which holds the span part too (for the comparisons added by issue 46; the shape claims' from the table of
    docs/PILOT.md's power calculation of issue 34, 3 seeds),
so the plan is never tighter than what either source measured. Standard library only:

    python3 docs/pilot/length_power.py
"""
import json, math, os, random, statistics

HERE = os.path.dirname(os.path.abspath(__file__))
TQ = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
      11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}
# One-sided 95% (the 90% interval of two one-sided tests).
TQ90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
        11: 1.796, 12: 1.782, 13: 1.771, 14: 1.761, 15: 1.753}

pilot = json.load(open(os.path.join(HERE, "length.json")))
points = pilot["points"]


def loss(p, ntk, m):
    d = p["ntk"] if (ntk or m == 1) else p["plain"]
    return d.get(str(m))


def at(steps, row, seed):
    for p in points:
        name = p["train"] + (f" p={p['posthoc']} post hoc" if p["posthoc"] else "")
        if p["steps"] == steps and name == row and p["seed"] == seed:
            return p
    return None


S, L, A, A15 = "softmax", "lssa+rw15", "lssa", "lssa p=15 post hoc"
S15 = "softmax p=15 post hoc"


def claims(ntk):
    """(name, contrast of one seed's points, rule, delta); `g(row, m)` is the row's loss."""
    return [
        ("softmax-degrades", lambda g: g(S, 16) - g(S, 1), "effect", 0.02),
        ("interaction", lambda g: (g(L, 1) - g(S, 1)) - (g(L, 16) - g(S, 16)), "effect", 0.02),
        ("lssar-flat", lambda g: (g(L, 16) - g(L, 1)) - 0.5 * (g(S, 16) - g(S, 1)), "atmost", 0.0),
        ("large-p-posthoc", lambda g: (g(S15, 1) - g(S, 1)) - (g(A15, 1) - g(A, 1)), "effect", 0.05),
        ("lssar-beats-softmax", lambda g: g(S, 8) - g(L, 8), "effect", 0.02),
        ("lssar-posthoc-beats-softmax", lambda g: g(S, 8) - g(A15, 8), "effect", 0.02),
        ("lssa-beats-softmax", lambda g: g(S, 8) - g(A, 8), "effect", 0.02),
        ("lssar-free-at-1x", lambda g: g(L, 1) - g(S, 1), "equivalent", 0.01),
        ("lssar-flat-paper", lambda g: (g(L, 8) - g(L, 1)) - 0.1 * (g(S, 8) - g(S, 1)), "atmost", 0.0),
    ]


# The report of 01e5101 (7 seeds, 2000 steps): 95% half-width and df of the comparisons, plain / NTK.
REPORT_HALF = {
    "lssar-beats-softmax": ((0.0425, 13), (0.041, 12)), "lssar-posthoc-beats-softmax": ((0.0655, 8), (0.074, 7)),
    "lssa-beats-softmax": ((0.0375, 9), (0.051, 7)), "lssar-free-at-1x": ((0.046, 7), (0.046, 7)),
    "lssar-flat-paper": ((0.0055, 7), (0.0055, 15)),
}
# docs/PILOT.md, issue 34's table: the seed sd of the shape claims (plain, NTK).
SHAPE_SD = {"softmax-degrades": (0.080, 0.059), "interaction": (0.086, 0.055), "lssar-flat": (0.043, 0.035),
            "large-p-posthoc": (0.052, 0.052)}


def per_seed(steps, f, ntk):
    seeds = sorted({p["seed"] for p in points if p["steps"] == steps})
    out = []
    for seed in seeds:
        def g(row, m):
            p = at(steps, row, seed)
            v = loss(p, ntk, m) if p else None
            if v is None:
                raise KeyError((row, m))
            return v
        try:
            out.append(f(g))
        except KeyError:
            pass
    return out


def decided(mean, sd, n, rule, delta, reps=20000, rng=None):
    """Shares of simulated experiments: (decided, reproduced)."""
    rng = rng or random.Random(58)
    dec = rep = 0
    for _ in range(reps):
        xs = [rng.gauss(mean, sd) for _ in range(n)]
        m = sum(xs) / n
        se = statistics.stdev(xs) / math.sqrt(n)
        lo, hi = m - TQ[n - 1] * se, m + TQ[n - 1] * se
        if rule == "effect":
            r = lo > 0 and m >= delta
            d = r or hi < 0 or hi < delta
        elif rule == "atmost":
            r = hi < delta
            d = r or lo > delta
        else:
            lo90, hi90 = m - TQ90[n - 1] * se, m + TQ90[n - 1] * se
            r = -delta < lo90 and hi90 < delta
            d = r or lo > delta or hi < -delta
        dec += d
        rep += r
    return dec / reps, rep / reps


def main():
    steps = sorted({p["steps"] for p in points})
    print("Per-seed contrasts on the pilot's seeds (nats), by training steps")
    print("| claim | RoPE | " + " | ".join(f"{s} steps" for s in steps) + " | pilot sd (pooled) | planning sd |")
    print("|---|---|" + "---|" * len(steps) + "---:|---:|")
    plans = []
    for ntk in (False, True):
        for name, f, rule, delta in claims(ntk):
            if name == "lssar-free-at-1x" and ntk:
                continue
            cells, diffs = [], []
            for s in steps:
                v = per_seed(s, f, ntk)
                cells.append(", ".join(f"{x:+.3f}" for x in v) or "-")
                if len(v) == 2:
                    diffs.append((v[0] - v[1]) ** 2 / 2)
            pilot_sd = math.sqrt(sum(diffs) / len(diffs)) if diffs else float("nan")
            i = 1 if ntk else 0
            if name in REPORT_HALF:
                half, df = REPORT_HALF[name][i]
                other = half / TQ[df] * math.sqrt(7)
            else:
                other = SHAPE_SD[name][i]
            sd = max(pilot_sd, other) if diffs else other
            rope = "1x" if name == "lssar-free-at-1x" else ("NTK" if ntk else "plain")
            print(f"| {name} | {rope} | " + " | ".join(cells) + f" | {pilot_sd:.3f} | {sd:.3f} |")
            plans.append((name, rope, f, rule, delta, sd, ntk))
    for s in steps:
        print(f"\nAt {s} steps: share of 20,000 simulated experiments that decide each claim (reproduced in parentheses), at the pilot's mean and the planning sd")
        print("| claim | RoPE | mean | " + " | ".join(f"n={n}" for n in range(3, 11)) + " |")
        print("|---|---|---:|" + "---:|" * 8)
        for name, rope, f, rule, delta, sd, ntk in plans:
            v = per_seed(s, f, ntk)
            if not v:
                continue
            mean = sum(v) / len(v)
            cells = []
            for n in range(3, 11):
                d, r = decided(mean, sd, n, rule, delta)
                cells.append(f"{d:.2f} ({r:.2f})")
            print(f"| {name} | {rope} | {mean:+.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
