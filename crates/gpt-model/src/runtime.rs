//! What the linked libtorch can do on this machine (CUDA or not), for logs and device choice.

use tch::{Cuda, Device};

/// A one-line description of the libtorch runtime, e.g. `libtorch (tch 0.24.0): CUDA available, 1 device(s)`.
pub fn describe() -> String {
    if Cuda::is_available() {
        format!(
            "libtorch (tch 0.24.0): CUDA available, {} device(s), cuDNN {}",
            Cuda::device_count(),
            Cuda::cudnn_is_available()
        )
    } else {
        "libtorch (tch 0.24.0): CUDA not available, CPU only".to_string()
    }
}

/// The best device: the first GPU when CUDA works, else the CPU.
pub fn best_device() -> Device {
    Device::cuda_if_available()
}

unsafe extern "C" {
    fn gpt_model_autocast_cuda_bf16();
}

/// Makes `tch::autocast(true, ..)` on CUDA compute in bf16 (libtorch's default is fp16), as the paper's
/// recipe (SPEC section 8) asks. Process-wide; harmless without CUDA.
pub fn use_bf16_autocast() {
    // SAFETY: sets a libtorch global; no pointers cross.
    unsafe { gpt_model_autocast_cuda_bf16() }
}
