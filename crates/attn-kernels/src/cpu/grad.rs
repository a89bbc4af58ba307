//! The backward of the streaming engine (SPEC section 6) on f32 tiles, with recomputation: phase A's
//! row quantities ([`backward_rows`]) and phase B's key sweep ([`backward_keys`]); the work split is
//! described in [`engine`](super::engine).

use attn_core::{Builtin, Norm, Phi, Plan};

use crate::cpu::act;
use crate::cpu::engine::{Dims, Head, Rows, ST_MAX, ST_UMAX, ST_W, ST_Z, STATS, anorm, offset, pow_slice, scores};
use crate::cpu::isa::Isa;
use crate::cpu::math;
use crate::cpu::tile;

/// Per-row quantities that the backward's key sweep needs, from phase A.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RowGrad {
    /// `D'_i = <g_i, o_i>` (with re-weighting: of the final output).
    pub dprime: f32,
    /// `C_i = sum_j a_ij dL/da_ij`: `D_i` for stage 1, `N_i E_i` with re-weighting.
    pub c: f32,
}

/// Receives a finished key tile: `(j0, nk, dk rows, dv rows)`.
pub(crate) type WriteKv<'a> = dyn FnMut(usize, usize, &[f32], &[f32]) + 'a;

/// Per-task scratch of the backward.
pub(crate) struct BwdScratch {
    s: Vec<f32>,
    f: Vec<f32>,
    gv: Vec<f32>,
    pt: Vec<f32>,
    tmp: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    /// The rows of the query tile at hand (phase B refills them tile after tile).
    rows: Rows,
}

impl BwdScratch {
    pub(crate) fn new(dims: Dims) -> Self {
        let bkp = dims.bk_pad();
        let tile = dims.bq.max(dims.bk) * bkp.max(dims.bq);
        Self {
            s: vec![0.0; dims.bq * bkp],
            f: vec![0.0; dims.bq * bkp],
            gv: vec![0.0; dims.bq * bkp],
            pt: vec![0.0; tile],
            tmp: vec![0.0; bkp],
            dk: vec![0.0; dims.bk * dims.d],
            dv: vec![0.0; dims.bk * dims.d],
            rows: Rows::empty(),
        }
    }
}

/// Recomputes, for rows `[i0, i0+nq)` and keys `[j0, j0+nk)`, the scores `s` (kept in `sc.s`), the
/// activations `f` (in `sc.f`), `g·v` (in `sc.gv`), and then for each visible entry the final weight
/// `w_ij` (into `sc.f`, overwriting `f`) and `ds_ij * scale_i * inq_i * ink_j` (into `sc.gv`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn grad_tile<const FMA: bool>(
    plan: &Plan,
    head: &Head<'_>,
    g: &[f32],
    ldg: usize,
    dims: Dims,
    rows: &Rows,
    stats: &[f32],
    rg: &[RowGrad],
    i0: usize,
    nq: usize,
    j0: usize,
    nk: usize,
    sc: &mut BwdScratch,
) {
    let lds = dims.bk_pad();
    scores::<FMA>(plan, head, dims, rows, i0, nq, (j0, nk), &mut sc.s, lds, false);
    let vt = &head.vt[j0 / dims.bk * dims.d * dims.bk_pad()..];
    tile::matmul_nt::<FMA>(dims.isa, &g[i0 * ldg..], ldg, vt, dims.bk_pad(), dims.d, nq, &mut sc.gv, lds);
    for r in 0..nq {
        let i = i0 + r;
        let n = dims.n(i);
        let vis = dims.visible(i, j0, nk);
        let st = &stats[i * STATS..(i + 1) * STATS];
        let s = &mut sc.s[r * lds..r * lds + vis];
        if plan.running_max {
            // phi(s - max) and phi'(s - max): the maximum cancels (attn-core does the same).
            let m = st[ST_MAX];
            s.iter_mut().for_each(|x| *x -= m);
        }
        let s = &*s;
        let f = &mut sc.f[r * lds..r * lds + lds];
        let gv = &mut sc.gv[r * lds..r * lds + lds];
        f[vis..].fill(0.0);
        gv[vis..].fill(0.0);
        let (f, gv) = (&mut f[..vis], &mut gv[..vis]);
        f.copy_from_slice(s);
        act::apply::<FMA>(&plan.phi, dims.in_range, dims.isa, f);
        let a = anorm(plan.norm, st[ST_Z] as f64, n, dims.t);
        let RowGrad { dprime, c } = rg[i];
        // gv <- dL/da_ij; f <- w_ij.
        match plan.reweight {
            Some(p) if st[ST_UMAX] > 0.0 => {
                let (na, off, inv_m, inv_w) = (n as f32 * a, offset(n), 1.0 / st[ST_UMAX], 1.0 / st[ST_W]);
                // rho = relu(u) / m, kept in f; h = (gv - D') / W * p * rho^(p-1) / m; dL/da = N h.
                f.iter_mut().for_each(|x| *x = math::fmadd::<FMA>(*x, na, -off).max(0.0) * inv_m);
                let tmp = &mut sc.tmp[..vis];
                tmp.copy_from_slice(f);
                pow_slice(tmp, p - 1, &mut sc.pt[..vis]);
                if p == 1 {
                    // d relu(u)/du is 0 where u <= 0; rho^0 would say 1.
                    tmp.iter_mut().zip(f.iter()).for_each(|(t, &x)| *t = if x > 0.0 { 1.0 } else { 0.0 });
                }
                let k = n as f32 * p as f32 * inv_w * inv_m;
                gv.iter_mut().zip(tmp.iter()).for_each(|(x, &rp)| *x = (*x - dprime) * k * rp);
                // w = rho^p / W = rho * rho^(p-1) / W.
                f.iter_mut().zip(tmp.iter()).for_each(|(x, &rp)| *x = *x * rp * inv_w);
            }
            _ => {
                f.iter_mut().for_each(|x| *x *= a);
            }
        }
        // df: through the stage-1 normaliser. Needs f (not w) for sign(f) under a signed l1: recompute
        // the sign from the score only when it matters.
        match plan.norm {
            // One key: a_11 = f/|f| is constant in f, so nothing flows back through it (exactly; the
            // general formula would cancel dw - D here and amplify its rounding by 1/Z).
            Norm::L1 if n == 1 => gv.fill(0.0),
            Norm::L1 => {
                if plan.signed {
                    let mut fs = s.to_vec();
                    act::apply::<FMA>(&plan.phi, dims.in_range, dims.isa, &mut fs);
                    gv.iter_mut().zip(&fs).for_each(|(x, &fv)| *x = (*x - sign(fv) * c) * a);
                } else {
                    gv.iter_mut().for_each(|x| *x = (*x - c) * a);
                }
            }
            Norm::None => {}
            // a = 1/N_i or 1/T: df = da * a.
            Norm::DivN | Norm::DivLen => gv.iter_mut().for_each(|x| *x *= a),
        }
        // ds = df * phi'(s). Exp needs phi(s) itself: recompute it into tmp (f now holds w).
        if matches!(plan.phi, Phi::Builtin(Builtin::Exp | Builtin::Sigmoid)) {
            let fs = &mut sc.tmp[..vis];
            fs.copy_from_slice(s);
            act::apply::<FMA>(&plan.phi, dims.in_range, dims.isa, fs);
            act::mul_derivative::<FMA>(&plan.phi, dims.in_range, s, fs, gv);
        } else {
            act::mul_derivative::<FMA>(&plan.phi, dims.in_range, s, &[], gv);
        }
        let fac = rows.fac[r];
        if plan.cosine() {
            gv.iter_mut().zip(&head.ink[j0..j0 + vis]).for_each(|(x, &kn)| *x *= fac * kn);
        } else {
            gv.iter_mut().for_each(|x| *x *= fac);
        }
    }
}

#[inline(always)]
fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

crate::multiversion! {
    /// Phase A of the backward for query rows `[i0, i0 + nq)`: fills `rg[0..nq]` with
    /// `D'_i` and `C_i`; with re-weighting this is one sweep over the keys for `E_i`.
    pub(crate) fn backward_rows<const FMA: bool>(
        isa: Isa,
        plan: &Plan,
        head: &Head<'_>,
        g: &[f32],
        ldg: usize,
        o: &[f32],
        ldo: usize,
        stats: &[f32],
        dims: Dims,
        i0: usize,
        nq: usize,
        sc: &mut BwdScratch,
        rg: &mut [RowGrad],
        aux: Option<&[f32]>,
    ) {
        let d = dims.d;
        for r in 0..nq {
            let i = i0 + r;
            let dp: f32 = g[i * ldg..i * ldg + d].iter().zip(&o[i * ldo..i * ldo + d]).map(|(a, b)| a * b).sum();
            rg[r] = RowGrad { dprime: dp, c: dp };
        }
        let Some(p) = plan.reweight else { return };
        if let Some(aux) = aux {
            // The forward's helper: E_i = a p / (W m) (<g_i, y_i> - D'_i c_i), no sweep.
            for r in 0..nq {
                let i = i0 + r;
                let st = &stats[i * STATS..(i + 1) * STATS];
                if st[ST_UMAX] <= 0.0 {
                    continue; // fallback row: C_i = D'_i, already set
                }
                let n = dims.n(i);
                let a = anorm(plan.norm, st[ST_Z] as f64, n, dims.t);
                let row = &aux[r * (d + 1)..(r + 1) * (d + 1)];
                let gy: f64 = g[i * ldg..i * ldg + d].iter().zip(&row[1..]).map(|(&x, &y)| x as f64 * y as f64).sum();
                let e = (gy - rg[r].dprime as f64 * row[0] as f64)
                    * (a as f64 * p as f64 / (st[ST_W] as f64 * st[ST_UMAX] as f64));
                rg[r].c = (n as f64 * e) as f32;
            }
            return;
        }
        let rows = Rows::new(plan, head, dims, i0, nq);
        let lds = dims.bk_pad();
        let mut e = vec![0.0f64; nq];
        let nkt = dims.key_tiles(i0 + nq);
        for kt in 0..nkt {
            let j0 = kt * dims.bk;
            let nk = dims.bk.min(dims.t - j0);
            scores::<FMA>(plan, head, dims, &rows, i0, nq, (j0, nk), &mut sc.s, lds, false);
            let vt = &head.vt[kt * d * dims.bk_pad()..];
            tile::matmul_nt::<FMA>(dims.isa, &g[i0 * ldg..], ldg, vt, dims.bk_pad(), d, nq, &mut sc.gv, lds);
            for r in 0..nq {
                let i = i0 + r;
                let n = dims.n(i);
                let st = &stats[i * STATS..(i + 1) * STATS];
                if st[ST_UMAX] <= 0.0 {
                    continue; // fallback row: C_i = D'_i, already set
                }
                let vis = dims.visible(i, j0, nk);
                let f = &mut sc.s[r * lds..r * lds + vis];
                if plan.running_max {
                    let m = st[ST_MAX];
                    f.iter_mut().for_each(|x| *x -= m);
                }
                act::apply::<FMA>(&plan.phi, dims.in_range, dims.isa, f);
                let a = anorm(plan.norm, st[ST_Z] as f64, n, dims.t);
                let (na, off, inv_m, inv_w) = (n as f32 * a, offset(n), 1.0 / st[ST_UMAX], 1.0 / st[ST_W]);
                // E_i = sum_j a_ij h_ij, h_ij = (gv - D') / W * p * rho^(p-1) / m.
                let rho = &mut sc.f[..vis];
                rho.iter_mut().zip(f.iter()).for_each(|(x, &fv)| *x = math::fmadd::<FMA>(fv, na, -off).max(0.0) * inv_m);
                if p == 1 {
                    rho.iter_mut().for_each(|x| *x = if *x > 0.0 { 1.0 } else { 0.0 });
                } else {
                    pow_slice(rho, p - 1, &mut sc.tmp);
                }
                let dp = rg[r].dprime;
                let gv = &sc.gv[r * lds..r * lds + vis];
                let part: f32 = f.iter().zip(rho.iter()).zip(gv).map(|((&fv, &rp), &x)| fv * rp * (x - dp)).sum();
                e[r] += part as f64 * (a * p as f32 * inv_w * inv_m) as f64;
            }
        }
        for r in 0..nq {
            let i = i0 + r;
            if stats[i * STATS + ST_UMAX] > 0.0 {
                rg[r].c = (dims.n(i) as f64 * e[r]) as f32;
            }
        }
    }
}

crate::multiversion! {
    /// Phase B of the backward for the key tiles `kts` of one head: writes the finished `dk`, `dv`
    /// rows of those tiles through `write_kv(j0, nk, dk, dv)` and accumulates `sum_j P_ij k_j` for
    /// every query row into `dq_part` (`T_q x d`, row stride `d`).
    pub(crate) fn backward_keys<const FMA: bool>(
        isa: Isa,
        plan: &Plan,
        head: &Head<'_>,
        g: &[f32],
        ldg: usize,
        stats: &[f32],
        rg: &[RowGrad],
        dims: Dims,
        kts: &[usize],
        sc: &mut BwdScratch,
        dq_part: &mut [f32],
        write_kv: &mut WriteKv<'_>,
    ) {
        let d = dims.d;
        let lds = dims.bk_pad();
        let tq = dims.tq();
        let nqt = tq.div_ceil(dims.bq);
        for &kt in kts {
            let j0 = kt * dims.bk;
            let nk = dims.bk.min(dims.t - j0);
            sc.dk[..nk * d].fill(0.0);
            sc.dv[..nk * d].fill(0.0);
            // Query rows from `j0 - off` on see this tile.
            for qt in j0.saturating_sub(dims.off) / dims.bq..nqt {
                let i0 = qt * dims.bq;
                let nq = dims.bq.min(tq - i0);
                // The scratch's rows, refilled (under AMX they hold the query tile's split, 48 KiB).
                let mut rows = std::mem::replace(&mut sc.rows, Rows::empty());
                rows.fill(plan, head, dims, i0, nq);
                grad_tile::<FMA>(plan, head, g, ldg, dims, &rows, stats, rg, i0, nq, j0, nk, sc);
                sc.rows = rows;
                // dv += w^T g and dk += P^T q, reading w and P transposed in place.
                tile::matmul_tn_acc::<FMA>(dims.isa, &sc.f, lds, &g[i0 * ldg..], ldg, nk, nq, d, &mut sc.dv, d);
                tile::matmul_tn_acc::<FMA>(dims.isa, &sc.gv, lds, &head.q[i0 * head.ldq..], head.ldq, nk, nq, d, &mut sc.dk, d);
                tile::matmul_acc::<FMA>(dims.isa, &sc.gv, lds, &head.k[j0 * head.ldk..], head.ldk, nq, nk, d, &mut dq_part[i0 * d..], d);
            }
            if plan.cosine() {
                for c in 0..nk {
                    let j = j0 + c;
                    project(&mut sc.dk[c * d..(c + 1) * d], &head.k[j * head.ldk..j * head.ldk + d], head.ink[j]);
                }
            }
            write_kv(j0, nk, &sc.dk[..nk * d], &sc.dv[..nk * d]);
        }
    }
}

/// Backward of `x' = x / max(||x||, 1e-12)` given `y = sum P x_other`, which equals `dx' / ||x||`:
/// `dx = y - x' <x', y>` (no projection when the norm was clamped at 1e-12).
#[inline(always)]
pub(crate) fn project(y: &mut [f32], x: &[f32], inv_norm: f32) {
    if inv_norm >= 1e12 {
        return;
    }
    let dot: f32 = y.iter().zip(x).map(|(a, b)| a * b).sum::<f32>() * inv_norm * inv_norm;
    y.iter_mut().zip(x).for_each(|(a, &b)| *a -= b * dot);
}
