//! The fused linear layer of `csrc/fused_linear.cpp`, for [`crate::model`]'s linears on CPUs with
//! AMX: the entry point, and the callbacks its products make into attn-kernels' `cpu::gemm`.

use std::ffi::{c_char, c_void};

use attn_kernels::cpu::gemm;
use tch::Tensor;

unsafe extern "C" {
    fn gpt_model_amx_linear(x: *const c_void, w: *const c_void, b: *const c_void, out: *mut *mut c_void)
    -> *mut c_char;
    fn gpt_model_linear_free_error(msg: *mut c_char);
}

/// `x Wᵀ (+ b)` as one autograd node whose products run on AMX tiles ([`gemm`]); `x` `(..., k)`,
/// `w` `(n, k)`, `b` `(n)`, all float32 on the CPU.
pub(crate) fn amx_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, String> {
    let mut out: *mut c_void = std::ptr::null_mut();
    let b = b.map_or(std::ptr::null(), |b| b.as_ptr().cast());
    // SAFETY: the pointers are live `at::Tensor`s for the call (or a null bias); on success the
    // bridge writes a newly allocated tensor to `out`.
    let err = unsafe { gpt_model_amx_linear(x.as_ptr().cast(), w.as_ptr().cast(), b, &mut out) };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { super::bridge_error(err, gpt_model_linear_free_error) }?;
    // SAFETY: `out` is a new `at::Tensor*` that nobody else owns.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// Rows of `A` that one [`gpt_model_gemm_rows`] call should take at most: the bridge's split.
#[unsafe(no_mangle)]
pub extern "C" fn gpt_model_gemm_row_block() -> usize {
    gemm::ROW_BLOCK
}

/// [`gemm::packed_len`].
#[unsafe(no_mangle)]
pub extern "C" fn gpt_model_gemm_packed_len(k: usize, n: usize) -> usize {
    gemm::packed_len(k, n)
}

/// [`gemm::pack_b`] of `B` (`k x n`, or with `transposed` `Bᵀ`, rows `ld` apart) into `out`
/// (`out_len` floats); null, or the message of a panic.
///
/// # Safety
/// `b` holds `k` rows (`n` with `transposed`) `ld` floats apart, readable; `out` `out_len` writable
/// floats that overlap nothing else.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpt_model_gemm_pack_b(
    b: *const f32,
    ld: usize,
    k: usize,
    n: usize,
    transposed: bool,
    out: *mut f32,
    out_len: usize,
) -> *mut c_char {
    let (rows, cols) = if transposed { (n, k) } else { (k, n) };
    super::guarded(|| {
        let len = if rows == 0 { 0 } else { (rows - 1) * ld + cols };
        // SAFETY: see the function contract.
        let (b, out) = unsafe { (std::slice::from_raw_parts(b, len), std::slice::from_raw_parts_mut(out, out_len)) };
        gemm::pack_b(b, ld, k, n, transposed, out);
        Ok::<(), String>(())
    })
}

/// [`gemm::rows`]: `C[0..m] (+)= A[0..m] · B` on the calling thread, and `A`'s row sums to
/// `row_sums` unless it is null; null, or the message of a panic.
///
/// # Safety
/// `a` holds `A`'s `m` rows of `k` (with `a_transposed`, `k` rows of `m`) `lda` floats apart,
/// readable; `packed` `packed_len` floats from [`gpt_model_gemm_pack_b`] of a `k x n` `B`; `c` `m`
/// rows of `n` floats `ldc` apart, writable, overlapping nothing else; `row_sums` null or `m`
/// writable floats overlapping nothing else.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpt_model_gemm_rows(
    a: *const f32,
    lda: usize,
    a_transposed: bool,
    m: usize,
    k: usize,
    packed: *const f32,
    packed_len: usize,
    n: usize,
    c: *mut f32,
    ldc: usize,
    add: bool,
    row_sums: *mut f32,
) -> *mut c_char {
    let (rows, cols) = if a_transposed { (k, m) } else { (m, k) };
    super::guarded(|| {
        let a_len = if rows == 0 { 0 } else { (rows - 1) * lda + cols };
        let c_len = if m == 0 { 0 } else { (m - 1) * ldc + n };
        // SAFETY: see the function contract.
        let (a, packed, c) = unsafe {
            (
                std::slice::from_raw_parts(a, a_len),
                std::slice::from_raw_parts(packed, packed_len),
                std::slice::from_raw_parts_mut(c, c_len),
            )
        };
        // SAFETY: see the function contract.
        let sums = (!row_sums.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(row_sums, m) });
        gemm::rows(a, lda, a_transposed, m, k, packed, n, c, ldc, add, sums);
        Ok::<(), String>(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// The node's output and its three gradients against float64 linears of the same values: within
    /// `2^-21` of the sums of the terms' magnitudes (the tiles' `2^-22`, with the bias added), at a
    /// 3-D input of rows that cross a row block, columns that are no multiple of 32 and an inner
    /// dimension that crosses a chunk of `B`, with and without a bias.
    #[test]
    fn the_amx_linear_and_its_gradients_are_f32_accurate() {
        if !gemm::available() {
            return;
        }
        let opts = (Kind::Float, Device::Cpu);
        for (shape, k, n, bias) in
            [(vec![2i64, 70], 40i64, 48i64, true), (vec![3, 50], 600, 96, false), (vec![1, 1], 32, 3, true)]
        {
            let (mut xs, mut gs) = (shape.clone(), shape.clone());
            xs.push(k);
            gs.push(n);
            let draw = |seed, size: &[i64]| crate::model::with_seed(seed, || Tensor::randn(size, opts));
            let (x, w, b, g) = (draw(9, &xs), draw(10, &[n, k]), draw(11, &[n]), draw(12, &gs));
            let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
            let (xl, wl, bl) = (leaf(&x), leaf(&w), leaf(&b));
            let y = amx_linear(&xl, &wl, bias.then_some(&bl)).unwrap();
            (&y * &g).sum(Kind::Float).backward();
            let d = |t: &Tensor| t.to_kind(Kind::Double);
            let exact = d(&x).linear(&d(&w), bias.then(|| d(&b)).as_ref());
            let size = d(&x).abs().linear(&d(&w).abs(), bias.then(|| d(&b).abs()).as_ref());
            let within = |got: &Tensor, exact: &Tensor, size: &Tensor, what: &str| {
                let excess = (d(got) - exact).abs() - size * 2f64.powi(-21);
                let worst = excess.max().double_value(&[]);
                assert!(worst <= 0.0, "{what} {shape:?} x {k} -> {n}: exceeds its bound by {worst:e}");
            };
            within(&y, &exact, &size, "output");
            let (g2, x2) = (d(&g).reshape([-1, n]), d(&x).reshape([-1, k]));
            within(&xl.grad().reshape([-1, k]), &g2.matmul(&d(&w)), &g2.abs().matmul(&d(&w).abs()), "dx");
            within(&wl.grad(), &g2.tr().matmul(&x2), &g2.abs().tr().matmul(&x2.abs()), "dw");
            if bias {
                // Summed by libtorch: within the rows' count of roundings.
                let rows = g2.size()[0] as f64;
                let bound = g2.abs().sum_dim_intlist(0, false, Kind::Double) * (rows * 2f64.powi(-24));
                within(&bl.grad(), &g2.sum_dim_intlist(0, false, Kind::Double), &(bound * 2f64.powi(21)), "db");
            } else {
                assert!(!bl.grad().defined(), "no bias, no gradient");
            }
        }
    }
}
