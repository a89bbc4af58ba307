"""Fits the coefficients of `cpu::math::softplus_table` and prints them as the Rust table's rows.

`g(u) = ln(1 + e^-u)` on 32 intervals `[k/2 - 1/4, k/2 + 1/4]` (`[0, 1/4]` at `k = 0`) as a
polynomial of degree 5 in `s = u - k/2`, with relative error minimised (Lawson's iteration of
weighted least squares over 4000 Chebyshev points, 60 steps). The coefficients are fixed in f32
one at a time from the constant up, each remaining one refitted after the last was rounded: the
constant's rounding is half an ulp of `g(k/2)`, a whole ulp of a result in the binade below, which
the higher terms then partly absorb (1.98 ulp at worst with all six rounded at once, 1.62 this
way, by this script's check of f32 Horner over 400001 points an interval).

Usage: `python3 fit_softplus_table.py` (needs numpy; prints the check to stderr).
"""

import sys

import numpy as np

DEGREE, INTERVALS, WIDTH = 5, 32, 0.5


def g(u):
    return np.log1p(np.exp(-u))


def f32(x):
    return np.float32(x).astype(np.float64)


def lawson(columns, y, weight):
    """Coefficients for `columns` minimising max |columns @ p - y| * weight."""
    lw = np.ones(len(y))
    for _ in range(60):
        p = np.linalg.lstsq(columns * (weight * lw)[:, None], y * weight * lw, rcond=None)[0]
        err = np.abs(columns @ p - y) * weight
        lw = lw * np.sqrt(err / err.max()) + 1e-12
        lw /= lw.sum()
    return p


def fit(k):
    """Interval `k`'s f32 coefficients, highest power first."""
    lo, hi = (-WIDTH / 2 if k else 0.0), WIDTH / 2
    t = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.linspace(0, np.pi, 4000))
    y = g(k * WIDTH + t)
    fixed = []  # of t^0, t^1, ...
    for j in range(DEGREE + 1):
        rest = y - sum(c * t**i for i, c in enumerate(fixed))
        columns = np.stack([t**p for p in range(j, DEGREE + 1)], axis=1)
        fixed.append(f32(lawson(columns, rest, 1 / y)[0]))
    return np.array(fixed[::-1])


def check(k, coeffs):
    """The largest error of f32 Horner over the interval, in ulps of the exact result's binade."""
    s = f32(np.linspace(-WIDTH / 2 if k else 0.0, WIDTH / 2, 400001))
    acc = np.full_like(s, coeffs[0])
    for c in coeffs[1:]:
        acc = f32(acc * s + c)
    exact = g(k * WIDTH + s)
    return (np.abs(acc - exact) / 2.0 ** (np.floor(np.log2(exact)) - 23)).max()


def main():
    table = np.array([fit(k) for k in range(INTERVALS)])
    print("worst %.3f ulp" % max(check(k, table[k]) for k in range(INTERVALS)), file=sys.stderr)
    for row in table.T.astype(np.float32):
        words = [np.format_float_scientific(v, unique=True, trim="-", exp_digits=1) + "," for v in row]
        lines, line = [], " " * 7
        for w in words:
            if len(line) + 1 + len(w) > 118:
                lines.append(line)
                line = " " * 7
            line += " " + w
        print("    [\n" + "\n".join(lines + [line]) + "\n    ],")


if __name__ == "__main__":
    main()
