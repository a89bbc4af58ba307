//! Host staging: the ndarray entry points, written once for the GPU and the emulator.

use half::{bf16, f16};
use ndarray::{Array4, ArrayView4, AsArray, Ix4};

use attn_core::Variant;

use super::config::Config;
use super::config::not_fused;
use super::device::GpuExec;
use super::kernel::Options;
use super::launch::{Buf, Exec, backward_exec, forward_exec};
use crate::cpu::STATS_PER_ROW;
use crate::error::{Error, Grads, Result};
use crate::params::Dtype;
use crate::params::Params;

// ---------------------------------------------------------------------------------------------
// ndarray entry points: upload, run, download (for tests, the kernel lab and small users), written
// once for the GPU and the emulator.

/// An f32 array (any layout) as the bytes of a standard-layout array in `dtype`.
fn to_bytes(x: &ArrayView4<'_, f32>, dtype: Dtype) -> Vec<u8> {
    let x = x.as_standard_layout();
    let data = x.as_slice().expect("standard layout");
    match dtype {
        Dtype::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => data.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        Dtype::Bf16 => data.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
    }
}

fn from_bytes(bytes: &[u8], dtype: Dtype, shape: (usize, usize, usize, usize)) -> Result<Array4<f32>> {
    let data: Vec<f32> = match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::Bf16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    };
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let data = data.into_iter().take(n).collect();
    Array4::from_shape_vec(shape, data).map_err(|e| Error::BadParams(e.to_string()))
}

/// Checks the ndarray inputs and resolves the variant for their head dimension.
pub(super) fn checked(
    variant: &Variant,
    q: &ArrayView4<'_, f32>,
    k: &ArrayView4<'_, f32>,
    v: &ArrayView4<'_, f32>,
    d_out: Option<&ArrayView4<'_, f32>>,
) -> Result<Config> {
    attn_core::reference::check_inputs_cached(variant, q, k, v, d_out)?;
    if v.shape()[3] != q.shape()[3] {
        return Err(not_fused(variant, "the fused kernels need v to have the head dimension of q and k"));
    }
    Config::new(variant, q.shape()[3])
}

fn contiguous<P>(addr: u64, shape: (usize, usize, usize, usize)) -> crate::params::RawTensor<*mut P> {
    let (_, h, t, d) = shape;
    crate::params::RawTensor { ptr: addr as *mut P, strides: [h * t * d, t * d, d] }
}

fn shape4(x: &ArrayView4<'_, f32>) -> (usize, usize, usize, usize) {
    let s = x.shape();
    (s[0], s[1], s[2], s[3])
}

/// The inputs, output and statistics of one forward in `x`'s memory.
struct Staged {
    shape: (usize, usize, usize, usize),
    kv_shape: (usize, usize, usize, usize),
    _inputs: [Buf; 3],
    o: Buf,
    _stats: Buf,
    params: Params,
}

fn staged_forward(x: &dyn Exec, cfg: &Config, [q, k, v]: [&ArrayView4<'_, f32>; 3], opts: &Options) -> Result<Staged> {
    let sh = q.shape();
    let (shape, kv_shape) = (shape4(q), shape4(k));
    let n = sh.iter().product::<usize>();
    let inputs =
        [x.upload(&to_bytes(q, opts.dtype))?, x.upload(&to_bytes(k, opts.dtype))?, x.upload(&to_bytes(v, opts.dtype))?];
    let o = x.zeros(n * opts.dtype.size())?;
    let stats = x.zeros(sh[0] * sh[1] * sh[2] * STATS_PER_ROW * 4)?;
    let (null_c, null_m) = (crate::params::null_input(), crate::params::null_output());
    let params = Params {
        batch: sh[0],
        heads: sh[1],
        kv_heads: kv_shape.1,
        seq_len: sh[2],
        kv_len: kv_shape.2,
        head_dim: sh[3],
        q: contiguous::<std::ffi::c_void>(inputs[0].addr(), shape).as_const(),
        k: contiguous::<std::ffi::c_void>(inputs[1].addr(), kv_shape).as_const(),
        v: contiguous::<std::ffi::c_void>(inputs[2].addr(), kv_shape).as_const(),
        o: contiguous(o.addr(), shape),
        stats: stats.addr() as *mut f32,
        rw_aux: std::ptr::null_mut(),
        d_out: null_c,
        dq: null_m,
        dk: null_m,
        dv: null_m,
        dtype: opts.dtype,
    };
    // SAFETY: every pointer is a live buffer of `x` of the shape given, in `opts.dtype`.
    unsafe { forward_exec(x, cfg, &params, opts.dtype, opts.kernel)? };
    Ok(Staged { shape, kv_shape, _inputs: inputs, o, _stats: stats, params })
}

/// The forward of the ndarray entry points on `x`.
pub(crate) fn forward_on(
    x: &dyn Exec,
    cfg: &Config,
    qkv: [&ArrayView4<'_, f32>; 3],
    opts: &Options,
) -> Result<Array4<f32>> {
    let s = staged_forward(x, cfg, qkv, opts)?;
    from_bytes(&x.download(&s.o)?, opts.dtype, s.shape)
}

/// The backward of the ndarray entry points on `x` (runs the forward for its statistics).
pub(crate) fn backward_on(
    x: &dyn Exec,
    cfg: &Config,
    qkv: [&ArrayView4<'_, f32>; 3],
    d_out: &ArrayView4<'_, f32>,
    opts: &Options,
) -> Result<Grads> {
    let s = staged_forward(x, cfg, qkv, opts)?;
    let size = |(b, h, t, d): (usize, usize, usize, usize)| b * h * t * d * opts.dtype.size();
    let g = x.upload(&to_bytes(d_out, opts.dtype))?;
    let (dq, dk, dv) = (x.zeros(size(s.shape))?, x.zeros(size(s.kv_shape))?, x.zeros(size(s.kv_shape))?);
    let mut p = s.params;
    p.d_out = contiguous::<std::ffi::c_void>(g.addr(), s.shape).as_const();
    p.dq = contiguous(dq.addr(), s.shape);
    p.dk = contiguous(dk.addr(), s.kv_shape);
    p.dv = contiguous(dv.addr(), s.kv_shape);
    // SAFETY: as in `staged_forward`; the gradient buffers are fresh.
    unsafe { backward_exec(x, cfg, &p, opts.dtype, opts.kernel)? };
    Ok(Grads {
        dq: from_bytes(&x.download(&dq)?, opts.dtype, s.shape)?,
        dk: from_bytes(&x.download(&dk)?, opts.dtype, s.kv_shape)?,
        dv: from_bytes(&x.download(&dv)?, opts.dtype, s.kv_shape)?,
    })
}

/// Causal attention output of `variant` on the GPU (inputs converted to `opts.dtype`), as f32.
pub fn forward_with<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    opts: &Options,
) -> Result<Array4<f32>> {
    let (q, k, v) = (q.into(), k.into(), v.into());
    let cfg = checked(variant, &q, &k, &v, None)?;
    forward_on(&GpuExec::new(&cfg, q.shape()[3], opts.dtype, opts.kernel.generation())?, &cfg, [&q, &k, &v], opts)
}

/// [`forward_with`] in f32 with the default kernel; see [`crate::cpu::forward`].
pub fn forward<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
) -> Result<Array4<f32>> {
    forward_with(variant, q, k, v, &Options::default())
}

/// Gradients of `sum(d_out * forward(q, k, v))` on the GPU (runs the forward for its statistics).
pub fn backward_with<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    d_out: impl AsArray<'a, f32, Ix4>,
    opts: &Options,
) -> Result<Grads> {
    let (q, k, v, g) = (q.into(), k.into(), v.into(), d_out.into());
    let cfg = checked(variant, &q, &k, &v, Some(&g))?;
    backward_on(&GpuExec::new(&cfg, q.shape()[3], opts.dtype, opts.kernel.generation())?, &cfg, [&q, &k, &v], &g, opts)
}

/// [`backward_with`] in f32; see [`crate::cpu::backward`].
pub fn backward<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    d_out: impl AsArray<'a, f32, Ix4>,
) -> Result<Grads> {
    backward_with(variant, q, k, v, d_out, &Options::default())
}
