//! Attention maths on libtorch tensors: the variants written as plain, autograd-native tch ops.
//!
//! [`torch_ops`] is "what the paper does": every variant materialises the full `(B, H, T, T)` weight
//! matrix and lets libtorch's autograd differentiate it. It exists for three reasons:
//!
//! - a same-framework baseline for the benchmarks (`lssa-benches`), i.e. the cost a user pays without
//!   fused kernels: `O(T^2)` memory per head and several passes over it;
//! - a second, independent implementation of SPEC sections 2 and 3 to test against the `attn-core`
//!   reference (and its autograd gradients against `attn-core`'s closed-form backward);
//! - a fallback for devices or variants that have no fused kernel yet.
//!
//! Cost: memory `O(B·H·T²)` per intermediate, several intermediates live at once (see the function
//! docs); at GPT-2 small (12 heads) one `f32` `T x T` matrix per layer is 12 GiB at `T = 16384`.

mod dispatch;
pub mod fused;
mod prepared;
pub mod torch_ops;

/// Which CUDA kernels a model runs ([`crate::Gpt::set_cuda_kernel`]): attn-kernels' choice.
pub use attn_kernels::cuda::Kernel as CudaKernel;
pub use dispatch::{AttentionError, EVAL_CHUNK, PathCounts, SDPA_CPU_MAX_LEN, attend, path_counts, sdpa, uses_sdpa};
pub use prepared::Attention;
