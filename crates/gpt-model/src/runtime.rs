//! What the linked libtorch can do on this machine (CUDA or not), for logs and device choice, and the
//! Python it came with (for the tools that exist only in PyTorch's Python API: torchrun,
//! FlexAttention).

use std::path::{Path, PathBuf};

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

/// A process-wide setting that several holders share, so that whoever holds it leaves the process as
/// it found it: the first [`claim`](SharedSetting::claim) sets the value (remembering the one it
/// found), concurrent claims of the same value share it, a claim of another value is refused while
/// any holder lives, and the last [`SettingGuard`] dropped restores what the first found. libtorch's
/// thread count (`trainer::process::claim_threads`) and CUDA autocast dtype ([`Bf16Autocast`]) are two.
#[derive(Debug)]
pub struct SharedSetting<T: Copy + 'static> {
    /// `(value claimed, holders, value the first holder found)`, `None` while nobody holds it.
    state: std::sync::Mutex<Option<(T, usize, T)>>,
    get: fn() -> T,
    set: fn(T),
}

/// A claim on a [`SharedSetting`]; the last one dropped restores the value the first found.
#[derive(Debug)]
#[must_use = "the setting holds only while the guard lives"]
pub struct SettingGuard<T: Copy + 'static> {
    setting: &'static SharedSetting<T>,
}

impl<T: Copy + PartialEq + 'static> SharedSetting<T> {
    /// The setting that `get` reads and `set` writes.
    pub const fn new(get: fn() -> T, set: fn(T)) -> Self {
        Self { state: std::sync::Mutex::new(None), get, set }
    }

    /// Holds `value` until the guard and every other holder drop; `Err` is the value other holders
    /// hold when it is another.
    pub fn claim(&'static self, value: T) -> Result<SettingGuard<T>, T> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &mut *state {
            None => {
                *state = Some((value, 1, (self.get)()));
                (self.set)(value);
            }
            Some((held, holders, _)) if *held == value => *holders += 1,
            Some((held, ..)) => return Err(*held),
        }
        Ok(SettingGuard { setting: self })
    }
}

impl<T: Copy + 'static> Drop for SettingGuard<T> {
    fn drop(&mut self) {
        let mut state = self.setting.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, holders, found)) = &mut *state {
            *holders -= 1;
            if *holders == 0 {
                (self.setting.set)(*found);
                *state = None;
            }
        }
    }
}

/// While held, `tch::autocast(true, ..)` on CUDA computes in bf16 (libtorch's default is fp16), as the
/// paper's recipe (SPEC section 8) asks; harmless without CUDA. A claim on the process's one autocast
/// dtype ([`SharedSetting`]): two trainings of one process that both ask for bf16 share it, and the
/// last restores what the first found.
#[derive(Debug)]
#[must_use = "autocast computes in bf16 only while the guard lives"]
pub struct Bf16Autocast {
    _claim: SettingGuard<i32>,
}

/// libtorch's CUDA autocast dtype, as the number of its `at::ScalarType`.
static AUTOCAST_DTYPE: SharedSetting<i32> =
    SharedSetting::new(crate::ffi::autocast::cuda_dtype, crate::ffi::autocast::set_cuda_dtype);

impl Bf16Autocast {
    /// Sets bf16 (if no other holder has) until the returned guard and every other holder drop.
    pub fn hold() -> Self {
        Bf16Autocast { _claim: AUTOCAST_DTYPE.claim(crate::ffi::autocast::bf16()).expect("only bf16 is ever claimed") }
    }

    /// Whether CUDA autocast computes in bf16 now.
    pub fn is_active() -> bool {
        crate::ffi::autocast::cuda_dtype() == crate::ffi::autocast::bf16()
    }
}

/// The Python interpreter of the venv whose libtorch this process loaded, and how it was chosen:
/// `LSSA_TORCH_PYTHON` when set, else `<venv>/bin/python` of the `torch` package whose
/// `libtorch_cpu.so` is mapped into this process (the venv `cargo xtask setup` made, or any other),
/// else `python3` on `PATH`. With it, `python -m torch.distributed.run` is the same PyTorch's
/// torchrun, and its FlexAttention the same build as the libtorch the Rust side runs.
pub fn torch_python() -> (PathBuf, &'static str) {
    if let Some(p) = std::env::var_os("LSSA_TORCH_PYTHON") {
        return (p.into(), "LSSA_TORCH_PYTHON");
    }
    if let Some(p) = loaded_torch_dir().and_then(|torch| venv_python(&torch)) {
        return (p, "the venv of the libtorch this process loaded");
    }
    ("python3".into(), "python3 on PATH")
}

/// `.../site-packages/torch` of the `libtorch_cpu.so` mapped into this process, if any.
fn loaded_torch_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find_map(|path| {
        let lib = Path::new(path);
        (lib.file_name()? == "libtorch_cpu.so").then(|| lib.parent()?.parent().map(Path::to_path_buf))?
    })
}

/// `<venv>/bin/python` for a torch package at `<venv>/lib/pythonX.Y/site-packages/torch`.
fn venv_python(torch: &Path) -> Option<PathBuf> {
    let site = torch.parent().filter(|p| p.file_name().is_some_and(|n| n == "site-packages"))?;
    let python = site.parent()?.parent()?.parent()?.join("bin").join("python");
    python.is_file().then_some(python)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_venv_python_is_found_from_its_torch_package() {
        let dir = tempfile::tempdir().unwrap();
        let torch = dir.path().join("lib/python3.11/site-packages/torch");
        std::fs::create_dir_all(&torch).unwrap();
        assert_eq!(venv_python(&torch), None, "no interpreter there yet");
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/python"), "").unwrap();
        assert_eq!(venv_python(&torch), Some(dir.path().join("bin/python")));
        // A torch that is not inside site-packages (a plain libtorch download) has no venv.
        assert_eq!(venv_python(&dir.path().join("libtorch")), None);
    }

    #[test]
    fn bf16_autocast_holders_count_and_the_last_restores_what_the_first_found() {
        let before = crate::ffi::autocast::cuda_dtype();
        assert!(!Bf16Autocast::is_active(), "libtorch's default is fp16");
        let a = Bf16Autocast::hold();
        assert!(Bf16Autocast::is_active());
        let b = Bf16Autocast::hold();
        drop(a);
        assert!(Bf16Autocast::is_active(), "the second holder keeps it");
        drop(b);
        assert_eq!(crate::ffi::autocast::cuda_dtype(), before);
    }

    #[test]
    fn the_loaded_libtorch_is_found_in_this_process() {
        // Calling into tch maps libtorch_cpu.so; its torch directory holds lib/libtorch_cpu.so.
        let _ = Cuda::is_available();
        let torch = loaded_torch_dir().expect("libtorch_cpu.so is mapped into every process that links tch");
        assert!(torch.join("lib/libtorch_cpu.so").is_file(), "{}", torch.display());
    }
}
