//! The fused backward's driver ([`backward_f32`]) on the call's threads ([`Options::helpers`]): the
//! upstream gradient the attention weights see ([`Backward::layer_norm_grad`] for relu-ln), then
//! three phases whose maths is in `grad`: A, every row's `D'_i` and `C_i` ([`Backward::row_grads`]);
//! B, the key tiles' `dk` and `dv` with per-chunk `dq` partials ([`Backward::key_tiles`]); C, `dq` as
//! the sum of its partials ([`Backward::write_dq`]).

use attn_core::{OutputNorm, Plan};

use super::engine::{self, Dims, Head, STATS};
use super::grad::{self, BwdScratch, RowGrad};
use super::isa::Isa;
use super::short;
use super::spare::Spare;
use super::split::{
    AmxPack, F32Params, KeyNorms, Options, PerThread, QueryTask, SendPtr, amx_products, dims, head, head_slice,
    inverse_norms, pack, pack_amx, rw_aux_per_row, write_rows,
};
use super::team::Helpers;
use crate::error::Result;
use crate::params::RawTensor;

/// [`backward_raw`](super::backward_raw) on typed pointers.
///
/// # Safety
/// As [`backward_raw`](super::backward_raw).
pub(super) unsafe fn backward_f32(plan: Plan, p: &F32Params, opts: &Options) -> Result<()> {
    let mut dims = dims(p, opts.tuning, opts.isa)?;
    let isa = opts.isa.assert_supported();
    // A short call recomputes the scores exactly as its forward computed them: from `k` unpacked,
    // with the forward's key norms and activation path.
    let direct = p.seq_len <= short::DIRECT_MAX_ROWS;
    let helpers = opts.helpers;
    let keys = if direct { KeyNorms::Short } else { KeyNorms::Packed };
    // SAFETY: forwarded from our caller.
    let norms = unsafe { inverse_norms(p, isa, helpers, plan.cosine(), keys) };
    dims.in_range = !direct && engine::scores_in_range(&plan, &norms, p.kv_len, p.head_dim);
    // The scores as the forward computed them: on AMX tiles where it did, the same bits.
    let amx = amx_products(isa, p, &plan);
    // SAFETY: forwarded.
    let packed = unsafe { pack(p, dims, helpers, !direct && !amx, true) };
    // SAFETY: forwarded.
    let amx = if amx { unsafe { pack_amx(p, dims, helpers, false) } } else { AmxPack::none() };
    // SAFETY: forwarded.
    let g_ln = unsafe { Backward::layer_norm_grad(p, &plan, helpers) };
    let call = Backward { p, plan, dims, isa, helpers, norms, packed, amx, g_ln };
    // SAFETY: forwarded, for each phase.
    unsafe {
        let rg = call.row_grads();
        let (mut partials, chunks) = call.key_tiles(&rg);
        call.write_dq(&mut partials, chunks);
    }
    Ok(())
}

/// What every phase of one backward call reads.
struct Backward<'a> {
    p: &'a F32Params,
    plan: Plan,
    dims: Dims,
    isa: Isa,
    /// The threads of the call's phases.
    helpers: Helpers,
    /// From [`inverse_norms`].
    norms: Vec<f32>,
    /// From [`pack`].
    packed: (Spare, Spare),
    /// From [`pack_amx`] (the scores' operands) where the forward ran its products on AMX.
    amx: AmxPack,
    /// [`Backward::layer_norm_grad`]'s gradient (empty without an output layer norm).
    g_ln: Vec<f32>,
}

impl Backward<'_> {
    /// The upstream gradient the attention weights see for relu-ln: back through the layer norm
    /// (dx = (g - mean g - o mean(g o)) / sigma, with o the normalised output), into a contiguous
    /// `(B·H, T, d)` copy; empty for every other output norm.
    ///
    /// # Safety
    /// As [`backward_raw`](super::backward_raw).
    unsafe fn layer_norm_grad(p: &F32Params, plan: &Plan, helpers: Helpers) -> Vec<f32> {
        if plan.output_norm != OutputNorm::LayerNorm {
            return Vec::new();
        }
        let (bh, t, d) = (p.batch * p.heads, p.seq_len, p.head_dim);
        let mut buf = vec![0.0f32; bh * t * d];
        let (g, o, stats_all) = (SendPtr(p.d_out), SendPtr(p.o.as_const()), SendPtr(p.stats as *const f32));
        helpers.chunks_mut(&mut buf, t * d, &|x, dst| {
            // Capture the whole SendPtr (not its raw-pointer field) in the closure.
            #[allow(clippy::redundant_locals)]
            let (g, o, stats_all) = (g, o, stats_all);
            let (b, h) = (x / p.heads, x % p.heads);
            // SAFETY: forwarded.
            let ((gs, ldg), (os, ldo)) = unsafe { (head_slice(g.0, b, h, t, d), head_slice(o.0, b, h, t, d)) };
            // SAFETY: forwarded; stats are (B·H·T, STATS).
            let st = unsafe { std::slice::from_raw_parts(stats_all.0.add(x * t * STATS), t * STATS) };
            for i in 0..t {
                let (gr, or) = (&gs[i * ldg..i * ldg + d], &os[i * ldo..i * ldo + d]);
                let mean_g = gr.iter().map(|&x| x as f64).sum::<f64>() / d as f64;
                let mean_go = gr.iter().zip(or).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() / d as f64;
                let sigma = st[i * STATS + 1] as f64;
                for c in 0..d {
                    dst[i * d + c] = ((gr[c] as f64 - mean_g - or[c] as f64 * mean_go) / sigma) as f32;
                }
            }
        });
        buf
    }

    /// The upstream gradient of head `(b, h)` and its row stride.
    ///
    /// # Safety
    /// As [`backward_raw`](super::backward_raw).
    unsafe fn g_of(&self, b: usize, h: usize) -> (&[f32], usize) {
        let (t, d) = (self.p.seq_len, self.p.head_dim);
        if self.plan.output_norm == OutputNorm::LayerNorm {
            let x = b * self.p.heads + h;
            (&self.g_ln[x * t * d..(x + 1) * t * d], d)
        } else {
            // SAFETY: forwarded.
            unsafe { head_slice(self.p.d_out, b, h, t, d) }
        }
    }

    /// # Safety
    /// As [`head`].
    unsafe fn head(&self, b: usize, h: usize) -> Head<'_> {
        // SAFETY: forwarded.
        unsafe { head(self.p, &self.norms, &self.packed, &self.amx, self.dims, b, h) }
    }

    /// Head `x`'s row statistics, `(T, STATS)`.
    ///
    /// # Safety
    /// As [`backward_raw`](super::backward_raw).
    unsafe fn stats(&self, x: usize) -> &[f32] {
        let t = self.p.seq_len;
        // SAFETY: forwarded; stats are (B·H·T, STATS).
        unsafe { std::slice::from_raw_parts((self.p.stats as *const f32).add(x * t * STATS), t * STATS) }
    }

    /// Phase A: `D'_i` and `C_i` for every row, `(B·H, T)`.
    ///
    /// # Safety
    /// As [`backward_raw`](super::backward_raw).
    unsafe fn row_grads(&self) -> Vec<RowGrad> {
        let (p, dims) = (self.p, self.dims);
        let (bh, t, d) = (p.batch * p.heads, p.seq_len, p.head_dim);
        let mut rg = vec![RowGrad::default(); bh * t];
        let o = SendPtr(p.o.as_const());
        let aux = SendPtr(p.rw_aux as *const f32);
        // Query tiles per head (T need not be a multiple of bq): one task per (head, query tile).
        let rg_ptr = SendPtr(rg.as_mut_ptr());
        let scratch = PerThread::new(self.helpers.threads());
        self.helpers.tasks(bh * t.div_ceil(dims.bq), &|task| {
            scratch.with(
                || BwdScratch::new(dims),
                |sc| {
                    // Capture the whole SendPtr (not its raw-pointer field) in the closure.
                    #[allow(clippy::redundant_locals)]
                    let (o, rg_ptr, aux) = (o, rg_ptr, aux);
                    let QueryTask { x, b, h, i0, nq } = QueryTask::new(task, p, dims);
                    // SAFETY: forwarded; rows [i0, i0+nq) of head x of `rg` belong to this task alone.
                    unsafe {
                        let hd = self.head(b, h);
                        let (os, ldo) = head_slice(o.0, b, h, t, d);
                        let st = self.stats(x);
                        let rgt = std::slice::from_raw_parts_mut(rg_ptr.0.add(x * t + i0), nq);
                        let (g, ldg) = self.g_of(b, h);
                        let w = rw_aux_per_row(d);
                        let ax =
                            (!aux.0.is_null()).then(|| std::slice::from_raw_parts(aux.0.add((x * t + i0) * w), nq * w));
                        grad::backward_rows(self.isa, &self.plan, &hd, g, ldg, os, ldo, st, dims, i0, nq, sc, rgt, ax);
                    }
                },
            )
        });
        rg
    }

    /// Phase B: key tiles, split into chunks only when there are fewer heads than threads; writes
    /// `dk` and `dv`, and returns the `dq` partials, `(B·H, chunks, T, d)`, and `chunks`. Each query
    /// head's dk and dv go to the outputs, or with grouped-query attention to one `(B, H, T_k, d)`
    /// buffer each, summed over each key head's group afterwards.
    ///
    /// # Safety
    /// As [`backward_raw`](super::backward_raw); `rg` from [`Backward::row_grads`].
    unsafe fn key_tiles(&self, rg: &[RowGrad]) -> (Spare, usize) {
        let (p, dims) = (self.p, self.dims);
        let (bh, t, d) = (p.batch * p.heads, p.seq_len, p.head_dim);
        let nkt = p.kv_len.div_ceil(dims.bk);
        let threads = self.helpers.threads();
        let chunks = if bh >= threads { 1 } else { (2 * threads).div_ceil(bh).min(nkt) };
        // Each task zeroes its own partial first (warm in its cache, and in parallel).
        let mut partials = Spare::take(bh * chunks * t * d);
        let tk = p.kv_len;
        let grouped = p.kv_heads != p.heads;
        let mut per_head = if grouped { vec![0.0f32; 2 * bh * tk * d] } else { Vec::new() };
        let (dk_out, dv_out) = if grouped {
            let (dk, dv) = per_head.split_at_mut(bh * tk * d);
            let strides = [p.heads * tk * d, tk * d, d];
            (SendPtr(RawTensor { ptr: dk.as_mut_ptr(), strides }), SendPtr(RawTensor { ptr: dv.as_mut_ptr(), strides }))
        } else {
            (SendPtr(p.dk), SendPtr(p.dv))
        };
        let scratch = PerThread::new(threads);
        self.helpers.chunks_mut(&mut partials, t * d, &|task, dq_part| {
            scratch.with(
                || BwdScratch::new(dims),
                |sc| {
                    // Capture the whole SendPtr (not its raw-pointer field) in the closure.
                    #[allow(clippy::redundant_locals)]
                    let (dk_out, dv_out) = (dk_out, dv_out);
                    let (x, chunk) = (task / chunks, task % chunks);
                    let (b, h) = (x / p.heads, x % p.heads);
                    let kts: Vec<usize> = (chunk..nkt).step_by(chunks).collect();
                    dq_part.fill(0.0);
                    // SAFETY: forwarded; this task alone writes the dk, dv rows of its key tiles.
                    unsafe {
                        let hd = self.head(b, h);
                        let st = self.stats(x);
                        let (g, ldg) = self.g_of(b, h);
                        let mut write_kv = |j0: usize, _nk: usize, dk: &[f32], dv: &[f32]| {
                            write_rows(dk_out.0, b, h, j0, d, dk);
                            write_rows(dv_out.0, b, h, j0, d, dv);
                        };
                        let rgx = &rg[x * t..(x + 1) * t];
                        grad::backward_keys(
                            self.isa,
                            &self.plan,
                            &hd,
                            g,
                            ldg,
                            st,
                            rgx,
                            dims,
                            &kts,
                            sc,
                            dq_part,
                            &mut write_kv,
                        );
                    }
                },
            )
        });
        if grouped {
            // SAFETY: forwarded; `per_head` holds every query head's rows.
            unsafe { sum_groups(p, self.helpers, &per_head[..bh * tk * d], p.dk) };
            // SAFETY: as above.
            unsafe { sum_groups(p, self.helpers, &per_head[bh * tk * d..], p.dv) };
        }
        (partials, chunks)
    }

    /// Phase C: dq = sum of the partials of [`Backward::key_tiles`], then back through the L2
    /// normalisation.
    ///
    /// # Safety
    /// As [`backward_raw`](super::backward_raw).
    unsafe fn write_dq(&self, partials: &mut [f32], chunks: usize) {
        let p = self.p;
        let (t, d) = (p.seq_len, p.head_dim);
        let dq_out = SendPtr(p.dq);
        self.helpers.chunks_mut(partials, chunks * t * d, &|x, parts| {
            // Capture the whole SendPtr (not its raw-pointer field) in the closure.
            #[allow(clippy::redundant_locals)]
            let dq_out = dq_out;
            let (b, h) = (x / p.heads, x % p.heads);
            let (first, rest) = parts.split_at_mut(t * d);
            for part in rest.chunks_exact(t * d) {
                first.iter_mut().zip(part).for_each(|(a, &b)| *a += b);
            }
            if self.plan.cosine() {
                // SAFETY: forwarded.
                let hd = unsafe { self.head(b, h) };
                for i in 0..t {
                    grad::project(&mut first[i * d..(i + 1) * d], &hd.q[i * hd.ldq..i * hd.ldq + d], hd.inq[i]);
                }
            }
            // SAFETY: forwarded; head x's dq rows belong to this task alone.
            unsafe { write_rows(dq_out.0, b, h, 0, d, first) };
        });
    }
}

/// Writes, for every key head, the sum over its group of query heads of `per_head` (contiguous
/// `(B, H, T_k, d)`) to `out` (`(B, H_kv, T_k, d)`).
///
/// # Safety
/// `out` must be valid for writes of every row, and alias nothing else.
unsafe fn sum_groups(p: &F32Params, helpers: Helpers, per_head: &[f32], out: RawTensor<*mut f32>) {
    let (tk, d, group) = (p.kv_len, p.head_dim, p.heads / p.kv_heads);
    let out = SendPtr(out);
    helpers.tasks(p.batch * p.kv_heads, &|x| {
        // Capture the whole SendPtr (not its raw-pointer field) in the closure.
        #[allow(clippy::redundant_locals)]
        let out = out;
        let (b, hk) = (x / p.kv_heads, x % p.kv_heads);
        let first = (b * p.heads + hk * group) * tk * d;
        let mut sum = per_head[first..first + tk * d].to_vec();
        for m in 1..group {
            let h = first + m * tk * d;
            sum.iter_mut().zip(&per_head[h..h + tk * d]).for_each(|(a, &x)| *a += x);
        }
        // SAFETY: forwarded; this task alone writes key head (b, hk).
        unsafe { write_rows(out.0, b, hk, 0, d, &sum) };
    });
}
