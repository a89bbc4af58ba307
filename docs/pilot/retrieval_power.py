"""The power calculation of docs/PILOT.md for the retrieval grid (issue 46): from the pilot's models
(docs/pilot/retrieval-grid.jsonl, one JSON line per model of `retrieval_pilot`, seeds 9200-9202,
never the benchmark's), each retrieval claim's per-seed difference in exact recall beyond the
training length (row minus softmax, pooled over the 2x-16x prompts) in each regime and RoPE
treatment; then, for n seeds, the share of simulated experiments that reach each outcome of the
four-outcome rule (src/stats: contradicted, reproduced, smaller than claimed, inconclusive) with
delta = 5 points. Per-seed differences are drawn from a normal with the pilot's mean and the pilot's
seed-to-seed sd pooled over the three claims of the regime and RoPE treatment (6 degrees of
freedom); the interval is the seed-level t interval (the report's adds the questions' part, which the
per-seed accuracies already hold). Standard library only:

    python3 docs/pilot/retrieval_power.py [docs/pilot/retrieval-grid.jsonl]
"""
import json, math, random, statistics, sys

TQ = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201}
DELTA = 0.05
CLAIMS = [("retrieval-lssar", "lssa+rw15", ""), ("retrieval-lssa", "lssa", ""), ("retrieval-lssar-posthoc", "lssa", "rw15_")]


def outcome(xs):
    n = len(xs)
    m = sum(xs) / n
    h = TQ[n - 1] * statistics.stdev(xs) / math.sqrt(n)
    lo, hi = m - h, m + h
    if hi < 0:
        return "contradicted"
    if lo > 0 and m >= DELTA:
        return "reproduced"
    if hi < DELTA:
        return "smaller"
    return "inconclusive"


def shares(effect, sd, n, reps=20000, rng=random.Random(46)):
    counts = {"contradicted": 0, "reproduced": 0, "smaller": 0, "inconclusive": 0}
    for _ in range(reps):
        counts[outcome([rng.gauss(effect, sd) for _ in range(n)])] += 1
    return {k: v / reps for k, v in counts.items()}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/pilot/retrieval-grid.jsonl"
    models = [json.loads(l) for l in open(path)]
    acc = {(m["regime"], m["variant"], m["seed"]): m["accuracy"] for m in models}
    regimes = list(dict.fromkeys(m["regime"] for m in models))
    seeds = sorted({m["seed"] for m in models})
    print("Pilot: mean per-seed difference in exact recall beyond T_train, points (seeds " + ", ".join(map(str, seeds)) + ")")
    print("| regime | RoPE | claim | per seed | mean | pooled seed sd |")
    print("|---|---|---|---|---:|---:|")
    cells = []
    for g in regimes:
        for rope in ["ntk", "plain"]:
            diffs = {}
            for name, row, tag in CLAIMS:
                d = []
                for s in seeds:
                    a, b = acc.get((g, row, s)), acc.get((g, "softmax", s))
                    if a and b:
                        d.append(a[f"{tag}{rope}_beyond_exact"] - b[f"{rope}_beyond_exact"])
                diffs[name] = d
            ss = sum(statistics.variance(d) * (len(d) - 1) for d in diffs.values() if len(d) > 1)
            df = sum(len(d) - 1 for d in diffs.values() if len(d) > 1)
            sd = math.sqrt(ss / df) if df else float("nan")
            for name, d in diffs.items():
                if not d:
                    continue
                mean = sum(d) / len(d)
                cells.append((g, rope, name, mean, sd))
                per = ", ".join(f"{100 * x:+.1f}" for x in d)
                print(f"| {g} | {rope} | {name} | {per} | {100 * mean:+.1f} | {100 * sd:.1f} |")
    ns = range(3, 11)
    print()
    print("Share of simulated experiments that decide the claim (any outcome but inconclusive), at the pilot's effect and sd:")
    print("| regime | RoPE | claim | " + " | ".join(f"n={n}" for n in ns) + " | most likely outcome at n=5 |")
    print("|---|---|---|" + "---:|" * len(ns) + "---|")
    worst = {n: 1.0 for n in ns}
    for g, rope, name, mean, sd in cells:
        row = []
        for n in ns:
            sh = shares(mean, sd, n)
            decided = 1 - sh["inconclusive"]
            worst[n] = min(worst[n], decided)
            row.append(f"{decided:.2f}")
        sh5 = shares(mean, sd, 5)
        top = max(sh5, key=sh5.get)
        print(f"| {g} | {rope} | {name} | " + " | ".join(row) + f" | {top} ({sh5[top]:.2f}) |")
    print()
    print("Fewest decided, over every cell: " + ", ".join(f"n={n}: {worst[n]:.2f}" for n in ns))
    # The same with the sd 1.5 times the pilot's (3 seeds estimate an sd loosely).
    print("With the seed sd 1.5 times the pilot's: " + ", ".join(
        f"n={n}: {min(1 - shares(m, 1.5 * sd, n)['inconclusive'] for _, _, _, m, sd in cells):.2f}" for n in ns))


main()
