//! The raw entry points' one parameter struct ([`Params`]): untyped pointers with their strides and
//! sizes, and the element type they hold ([`Dtype`]). What the CPU and the CUDA backends read, what
//! the model's C++ bridge fills (its `AttnParams` mirrors it field for field) and what the Python
//! extension builds.

use std::ffi::c_void;

/// Element type of `q`, `k`, `v`, `o` and the gradients (the row statistics and re-weighting's
/// helper are always `f32`). Arithmetic is f32 in every case. The CPU kernels take `F32` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Dtype {
    /// IEEE single precision.
    F32 = 0,
    /// IEEE half precision.
    F16 = 1,
    /// bfloat16.
    Bf16 = 2,
}

impl Dtype {
    /// The code the C++ side and the CUDA sources use (`DTYPE`): 0, 1, 2.
    pub(crate) fn code(self) -> u32 {
        self as u32
    }

    /// The name PyTorch gives it: `"float32"`, `"float16"`, `"bfloat16"`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        if self == Dtype::F32 { 4 } else { 2 }
    }
}

/// One strided `(B, H, T, d)` tensor as the raw entry points see it: element strides of the batch,
/// head and row axes; the last axis must be contiguous.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RawTensor<P> {
    /// Address of element `[0, 0, 0, 0]`.
    pub ptr: P,
    /// Element strides of the batch, head and row axes.
    pub strides: [usize; 3],
}

impl<T> RawTensor<*mut T> {
    /// The same tensor, read-only.
    pub fn as_const(self) -> RawTensor<*const T> {
        RawTensor { ptr: self.ptr as *const T, strides: self.strides }
    }
}

impl<T> RawTensor<*const T> {
    /// The same tensor with its elements typed `U` (a reinterpretation of the pointer, nothing read).
    pub fn cast<U>(self) -> RawTensor<*const U> {
        RawTensor { ptr: self.ptr.cast(), strides: self.strides }
    }
}

impl<T> RawTensor<*mut T> {
    /// The same tensor with its elements typed `U` (a reinterpretation of the pointer, nothing read).
    pub fn cast_mut<U>(self) -> RawTensor<*mut U> {
        RawTensor { ptr: self.ptr.cast(), strides: self.strides }
    }
}

/// A null input tensor: one a call does not read.
pub fn null_input<T>() -> RawTensor<*const T> {
    RawTensor { ptr: std::ptr::null(), strides: [0; 3] }
}

/// A null output tensor: one a call does not write.
pub fn null_output<T>() -> RawTensor<*mut T> {
    RawTensor { ptr: std::ptr::null_mut(), strides: [0; 3] }
}

/// The one parameter struct that crosses the FFI boundary (as flash-attention's `Flash_fwd_params`):
/// untyped pointers, strides and sizes, and the element type, shared by
/// [`Prepared::forward_raw`](crate::Prepared::forward_raw), [`Prepared::backward_raw`](crate::Prepared::backward_raw)
/// and their callers. Outputs never alias inputs.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Params {
    /// Batch size `B`.
    pub batch: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Key and value heads `H_kv`, a divisor of `H`: query head `h` reads key head `h / (H / H_kv)`
    /// (grouped-query attention; `H` for plain multi-head attention). On CUDA, `H_kv < H` runs the
    /// SIMT kernels (lab v1).
    pub kv_heads: usize,
    /// Query rows `T` (`T_q`): the last `T` rows of a `kv_len`-long causal sequence, so query row `r`
    /// sees keys `0..=kv_len - T + r` and its `N` is `kv_len - T + r + 1`.
    pub seq_len: usize,
    /// Keys `T_k >= T` (a KV cache and the new rows; `seq_len` for a whole sequence). On CUDA,
    /// `T_k > T` runs the SIMT kernels (lab v1).
    pub kv_len: usize,
    /// Head dimension `d` (of `q`, `k` and `v`).
    pub head_dim: usize,
    /// Queries, (B, H, T, d).
    pub q: RawTensor<*const c_void>,
    /// Keys, (B, H_kv, T_k, d).
    pub k: RawTensor<*const c_void>,
    /// Values, (B, H_kv, T_k, d).
    pub v: RawTensor<*const c_void>,
    /// Output of the forward, (B, H, T, d) (written by the forward, read by the backward).
    pub o: RawTensor<*mut c_void>,
    /// Contiguous `(B, H, T, STATS_PER_ROW)` f32 row statistics (written by the forward, read by the
    /// backward).
    pub stats: *mut f32,
    /// Re-weighted variants on the CPU, optional (null: not kept): contiguous `(B, H, T,
    /// rw_aux_per_row(d))` f32, per row `c_i = sum_j f_ij rho_ij^(p-1)` then `y_i = sum_j f_ij
    /// rho_ij^(p-1) v_j`. The forward writes it when not null (one more `P V`-sized product in its
    /// second sweep); the backward given the forward's helper computes re-weighting's `E_i` from it
    /// instead of sweeping the keys once more (SPEC section 5: `E_i` is linear in `g_i`). Ignored by
    /// variants without re-weighting and by the CUDA kernels.
    pub rw_aux: *mut f32,
    /// Upstream gradient `dL/do` (backward only).
    pub d_out: RawTensor<*const c_void>,
    /// `dL/dq` (backward only, written).
    pub dq: RawTensor<*mut c_void>,
    /// `dL/dk`, (B, H_kv, T_k, d) (backward only, written; summed over each key head's group).
    pub dk: RawTensor<*mut c_void>,
    /// `dL/dv`, as `dk` (backward only, written).
    pub dv: RawTensor<*mut c_void>,
    /// What `q`, `k`, `v`, `o`, `d_out`, `dq`, `dk`, `dv` hold; a backend refuses a dtype it does not
    /// take, and a [`crate::Target`] of another dtype.
    pub dtype: Dtype,
}

impl Params {
    /// Whether `kv_heads` and `kv_len` fit `heads` and `seq_len`.
    pub(crate) fn check_kv(&self) -> crate::error::Result<()> {
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(crate::error::Error::BadParams(format!(
                "{} query heads cannot share {} key heads: H must be a multiple of H_kv >= 1",
                self.heads, self.kv_heads
            )));
        }
        if self.kv_len < self.seq_len {
            return Err(crate::error::Error::BadParams(format!(
                "{} query rows continue a sequence of only {} keys: T_k must be >= T_q",
                self.seq_len, self.kv_len
            )));
        }
        Ok(())
    }

    /// Whether this is a whole sequence with a key head per query head: what every CUDA kernel takes
    /// (the others run on the SIMT kernels).
    pub(crate) fn is_plain(&self) -> bool {
        self.kv_heads == self.heads && self.kv_len == self.seq_len
    }
}

// SAFETY: `Params` is plain data; the raw entry points' contract (valid pointers, outputs written by
// one task per row, inputs only read) is what makes sharing it across threads sound.
unsafe impl Send for Params {}
// SAFETY: as above.
unsafe impl Sync for Params {}
