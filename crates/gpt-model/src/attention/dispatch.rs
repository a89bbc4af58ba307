//! The attention dispatch: fused kernels where possible, the reference elsewhere, chunked without autograd.

use std::cell::Cell;
use std::sync::Once;

use tch::Tensor;

use super::{Attention, fused, torch_ops};
use crate::config::AttnImpl;

/// Why attention could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    /// From the reference (tch ops) implementation.
    #[error(transparent)]
    Reference(#[from] torch_ops::AttnError),
    /// From the fused kernels (other than "not fused here", which falls back).
    #[error(transparent)]
    Fused(#[from] fused::FusedError),
}

/// Query rows per block of the chunked no-grad reference path: its scratch is
/// `B·H·CHUNK·T_k` floats instead of `B·H·T_q·T_k`.
pub const EVAL_CHUNK: i64 = 256;

/// Counters of the paths [`attend`] took on the calling thread since it started (tests and logs use
/// them to prove that long-context evaluation never materialised `T x T`; per thread, so that
/// concurrent work elsewhere does not blur the count).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PathCounts {
    /// Calls served by the fused kernels.
    pub fused: usize,
    /// Calls served by the reference with the full `T_q x T_k` weight matrix.
    pub reference_full: usize,
    /// Calls served by the chunked no-grad reference.
    pub reference_chunked: usize,
    /// Softmax calls on a GPU served by libtorch's `scaled_dot_product_attention`.
    pub sdpa: usize,
}

thread_local! {
    static COUNTS: Cell<PathCounts> = const { Cell::new(PathCounts { fused: 0, reference_full: 0, reference_chunked: 0, sdpa: 0 }) };
}

fn count(f: impl FnOnce(&mut PathCounts)) {
    COUNTS.with(|c| {
        let mut x = c.get();
        f(&mut x);
        c.set(x);
    });
}
static WARN_CUDA: Once = Once::new();
static WARN_NOT_FUSED: Once = Once::new();

/// The calling thread's path counters.
pub fn path_counts() -> PathCounts {
    COUNTS.with(Cell::get)
}

/// Causal attention of `(B, H, T_q, d)` queries at absolute positions `q_offset..q_offset + T_q`
/// over `(B, H, q_offset + T_q, d)` keys and values, with `att`'s variant, by its implementation:
///
/// - `Fused` with `q_offset == 0`, plain `softmax` on a GPU, or on the CPU up to
///   [`SDPA_CPU_MAX_LEN`] rows: libtorch's SDPA (see [`uses_sdpa`]).
/// - `Fused` or `FusedOwn`: the fused kernels (CPU f32, or CUDA f32/f16/bf16) through the autograd
///   bridge, for any `q_offset` (a decoding step reads the KV cache in place; on a GPU the SIMT
///   kernels take it). A variant without a fused kernel, or CUDA kernels that cannot run (no
///   NVRTC), fall back to the reference, with a one-time warning on stderr.
/// - otherwise the reference. Without autograd (`tch::no_grad`) and with more than `EVAL_CHUNK`
///   query rows it runs chunked, so evaluation never holds a full `T x T` matrix.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, att: &Attention, q_offset: i64) -> Result<Tensor, AttentionError> {
    if uses_sdpa(att, q_offset, q.size()[2], q.device()) {
        count(|c| c.sdpa += 1);
        return Ok(sdpa(q, k, v));
    }
    if att.imp() != AttnImpl::Reference {
        match fused::attention(q, k, v, att) {
            Ok(out) => {
                count(|c| c.fused += 1);
                return Ok(out);
            }
            Err(fused::FusedError::Cuda(why)) => {
                WARN_CUDA.call_once(|| eprintln!("warning: {why}: using the reference attention on the GPU"))
            }
            Err(fused::FusedError::NotFused { variant, reason }) => WARN_NOT_FUSED.call_once(|| {
                eprintln!("warning: variant `{variant}` has no fused kernel ({reason}): using the reference attention")
            }),
            // f64 (gradient checks) or half precision on the CPU: the reference, silently (a choice of dtype, not a gap).
            Err(fused::FusedError::Unsupported(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let grad = q.requires_grad() || k.requires_grad() || v.requires_grad();
    let t_q = q.size()[2];
    if !grad && t_q > EVAL_CHUNK {
        count(|c| c.reference_chunked += 1);
        return Ok(torch_ops::attention_chunked(q, k, v, att.plan(), q_offset, EVAL_CHUNK)?);
    }
    count(|c| c.reference_full += 1);
    Ok(torch_ops::attention(q, k, v, att.plan(), q_offset)?)
}

/// The longest sequence for which plain softmax on the CPU runs libtorch's SDPA rather than our fused
/// kernel. Measured side by side (forward + backward, B = 16, H = 2, d = 64, 2 threads; `cargo xtask
/// bench train`'s notes in `docs/bench/train-cpu-notes.md`): SDPA takes 0.45x our kernel's time at T = 64,
/// 0.65x at 128, 0.76x at 256, and 1.45x at 512, where our tiles pay off (`docs/bench/kernels-cpu.md`:
/// 0.57x-0.94x of SDPA's time from T = 512 up).
pub const SDPA_CPU_MAX_LEN: i64 = 256;

/// Whether [`attend`] runs libtorch's `scaled_dot_product_attention` (causal, `1/sqrt(d)`): for exactly
/// the `softmax` variant (no re-weighting, no parameters), by `Fused`, over a whole sequence
/// (`q_offset == 0`, where its causal mask is ours), of any length `t` on a GPU (its FlashAttention
/// kernels: the softmax a nanoGPT user runs) and of at most [`SDPA_CPU_MAX_LEN`] rows on the CPU
/// (where it is faster than our kernel). `FusedOwn` keeps our kernel.
pub fn uses_sdpa(att: &Attention, q_offset: i64, t: i64, device: tch::Device) -> bool {
    att.imp() == AttnImpl::Fused && q_offset == 0 && (device.is_cuda() || t <= SDPA_CPU_MAX_LEN) && att.is_softmax()
}

/// Causal softmax attention of `(B, H, T, d)` tensors by libtorch's `scaled_dot_product_attention`
/// (scale `1/sqrt(d)`, no dropout): SPEC's `softmax` variant.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, 0.0, true, None, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn v(name: &str) -> attn_core::Variant {
        name.parse().unwrap()
    }

    fn uses_sdpa(name: &str, imp: AttnImpl, q_offset: i64, t: i64, device: tch::Device) -> bool {
        super::uses_sdpa(&Attention::new(v(name), imp).unwrap(), q_offset, t, device)
    }

    #[test]
    fn only_plain_softmax_by_fused_goes_to_sdpa_on_a_gpu_and_for_short_rows_on_the_cpu() {
        let gpu = Device::Cuda(0);
        let cpu = Device::Cpu;
        assert!(uses_sdpa("softmax", AttnImpl::Fused, 0, 65536, gpu));
        assert!(uses_sdpa("softmax", AttnImpl::Fused, 0, SDPA_CPU_MAX_LEN, cpu), "short rows on the CPU");
        assert!(!uses_sdpa("softmax", AttnImpl::Fused, 0, SDPA_CPU_MAX_LEN + 1, cpu), "long rows: our kernel");
        assert!(!uses_sdpa("softmax", AttnImpl::FusedOwn, 0, 64, gpu), "FusedOwn asks for our kernel");
        assert!(!uses_sdpa("softmax", AttnImpl::FusedOwn, 0, 64, cpu), "FusedOwn asks for our kernel");
        assert!(!uses_sdpa("softmax", AttnImpl::Reference, 0, 64, gpu));
        assert!(!uses_sdpa("softmax", AttnImpl::Fused, 5, 64, gpu), "decoding with a cache is not SDPA's causal mask");
        for other in ["softmax+rw15", "lssa", "lssa+rw15", "inverse", "exp-nonorm", "softplus-l1"] {
            assert!(!uses_sdpa(other, AttnImpl::Fused, 0, 64, gpu), "{other}");
            assert!(!uses_sdpa(other, AttnImpl::Fused, 0, 64, cpu), "{other}");
        }
    }

    #[test]
    fn sdpa_computes_the_softmax_variant() {
        // The same causal mask and 1/sqrt(d) scale as the reference's `softmax`, in f64 on the CPU (the
        // GPU path differs only in kernels). libtorch's CPU SDPA is not bit-exact f64 on every machine
        // and run: it agreed to 4e-16 here but once differed by 2.0e-9 on the 2-core CI machine, with
        // the same inputs and libtorch. So the bound is 1e-7, which still tells apart every convention
        // that could differ: a mask off by one key moves the output by ~3, and a scale off by a relative
        // 1e-6 by ~2e-6 (the control below holds the test to that).
        const BOUND: f64 = 1e-7;
        let (b, h, t, d) = (2, 3, 37, 16);
        let opts = (Kind::Double, Device::Cpu);
        let (q, k, val) = crate::model::with_seed(3, || {
            (Tensor::randn([b, h, t, d], opts), Tensor::randn([b, h, t, d], opts), Tensor::randn([b, h, t, d], opts))
        });
        let plan = v("softmax").plan().unwrap();
        let want = torch_ops::attention(&q, &k, &val, &plan, 0).unwrap();
        let err = (sdpa(&q, &k, &val) - &want).abs().max().double_value(&[]);
        assert!(err < BOUND, "max |sdpa - reference| = {err}");
        let rescaled = torch_ops::attention(&(&q * (1.0 + 1e-6)), &k, &val, &plan, 0).unwrap();
        let control = (rescaled - &want).abs().max().double_value(&[]);
        assert!(control > 10.0 * BOUND, "a scale off by 1e-6 moves the output by only {control}");
    }
}
