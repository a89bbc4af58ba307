//! The kernel request types every other module of `cuda` reads: which kernels run ([`Kernel`], by
//! lab [`Version`]), the ndarray entry points' [`Options`] and the largest head dimension. A leaf
//! below `mod.rs` (a face that only re-exports): it uses `compile`'s [`Generation`] and nothing that
//! uses it back (`xtask/tests/tidy.rs`).

use super::compile::Generation;
use crate::error::{Error, Result};
use crate::params::Dtype;

/// The largest head dimension the CUDA kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// Which kernels run: [`Kernel::Auto`], the measured default, or (with the `lab` feature) one
/// version of the kernel lab by its number, for benchmarks and the emulator tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Kernel {
    /// The fastest measured kernels that apply: forward v5 at head dimension 64 and v3 at 128
    /// (16-byte aligned rows), else v2 (even strides), else v1; backward v7 where v3 or v5 is the
    /// forward, else v1.
    #[default]
    Auto,
    /// The forward and backward pair of the lab that holds this version (`LAB.md`), refused where a
    /// tensor-core version does not apply to the dtype, head dimension or strides:
    ///
    /// | request | forward | backward |
    /// |---|---|---|
    /// | v1 | v1 | v1 |
    /// | v2 | v2 | v1 |
    /// | v3, v4 | v3 | v4 |
    /// | v5, v6 | v5 (v3 at d = 128) | v6 |
    /// | v7 | v5 (v3 at d = 128) | v7 |
    /// | v8, v9 | v8 on sm_90, else as v7 | v9 at d = 64 on sm_90, else v7 |
    /// | v10 | v10 at d = 64 on sm_90, else as v7 | v7 |
    ///
    /// Versions 5 to 10 pass the emulator; on the GPU (`docs/bench/cuda.md`) v5 to v7 pass every check
    /// case and v8 failed at d = 64 (its fix is not yet re-run there); v10 has not run on a GPU yet.
    #[cfg(feature = "lab")]
    Lab(Version),
}

#[cfg(feature = "lab")]
impl Kernel {
    /// Every distinct request: [`Kernel::Auto`], then one per pair of the lab, in order.
    pub const ALL: [Kernel; 8] = [
        Kernel::Auto,
        Kernel::Lab(Version::V1),
        Kernel::Lab(Version::V2),
        Kernel::Lab(Version::V3),
        Kernel::Lab(Version::V5),
        Kernel::Lab(Version::V7),
        Kernel::Lab(Version::V8),
        Kernel::Lab(Version::V10),
    ];
}

impl Kernel {
    /// The request's name as [`FromStr`](std::str::FromStr) reads it (and [`Kernel::ENV`]):
    /// `auto`, or the lab version `v1` to `v10`.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::Auto => "auto",
            #[cfg(feature = "lab")]
            Kernel::Lab(v) => v.name(),
        }
    }

    /// The generation whose module this request runs from: the least one holding every kernel the
    /// request can select (on any device, for any strides).
    pub const fn generation(self) -> Generation {
        match self.lab_version() {
            // Auto falls back to v2 and v1 for rows that are not 16-byte aligned.
            None | Some(Version::V7) => Generation::First,
            Some(Version::V1) => Generation::Simt,
            Some(Version::V2) => Generation::V2,
            Some(Version::V3 | Version::V4 | Version::V5 | Version::V6 | Version::V8 | Version::V9 | Version::V10) => {
                Generation::Lab
            }
        }
    }

    /// The environment variable that names the kernel request of a process: `auto`, or `v1` to `v10`
    /// (as [`FromStr`](std::str::FromStr) reads them) in a build with the `lab` feature.
    pub const ENV: &'static str = "LSSA_CUDA_KERNEL";

    /// The request [`Kernel::ENV`] names, or [`Kernel::Auto`] where it is unset: the one place the
    /// variable is read (the libtorch bridge and the Python extension ask here, once each). A
    /// version in a build without the `lab` feature, or a name that is no request, is an error that
    /// says so.
    pub fn from_env() -> Result<Self> {
        Self::from_var(std::env::var(Self::ENV))
    }

    /// [`Kernel::from_env`] on the variable's value.
    fn from_var(var: std::result::Result<String, std::env::VarError>) -> Result<Self> {
        let named = |what: String| Error::BadParams(format!("{}: {what}", Self::ENV));
        match var {
            Ok(s) => s.parse().map_err(|e| match e {
                Error::BadParams(what) => named(what),
                e => e,
            }),
            Err(std::env::VarError::NotPresent) => Ok(Kernel::Auto),
            Err(e) => Err(named(e.to_string())),
        }
    }

    /// The lab version asked for; `None` for [`Kernel::Auto`].
    pub(crate) const fn lab_version(self) -> Option<Version> {
        match self {
            Kernel::Auto => None,
            #[cfg(feature = "lab")]
            Kernel::Lab(v) => Some(v),
        }
    }
}

impl std::str::FromStr for Kernel {
    type Err = Error;

    /// `auto`, or `v1` (also `simt`) to `v10`, case-insensitive; a version needs the `lab` feature.
    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim().to_ascii_lowercase();
        if name == "auto" {
            return Ok(Kernel::Auto);
        }
        let version = match name.as_str() {
            "simt" => Some(Version::V1),
            _ => Version::ALL.into_iter().find(|v| v.name() == name),
        };
        match version {
            #[cfg(feature = "lab")]
            Some(v) => Ok(Kernel::Lab(v)),
            #[cfg(not(feature = "lab"))]
            Some(v) => Err(Error::BadParams(format!(
                "CUDA kernel {}: the lab's versions need attn-kernels' `lab` feature; this build runs `auto`",
                v.name()
            ))),
            None => Err(Error::BadParams(format!("unknown CUDA kernel {s:?}: auto or v1 to v10"))),
        }
    }
}

/// Options of the ndarray entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The dtype the f32 inputs are converted to on upload (results come back as f32).
    pub dtype: Dtype,
    /// The forward kernel.
    pub kernel: Kernel,
}

impl Default for Options {
    fn default() -> Self {
        Self { dtype: Dtype::F32, kernel: Kernel::Auto }
    }
}

attn_core::listed_enum! {
    /// A kernel version of the lab, by its number (`src/cuda/LAB.md`): forwards v1, v2, v3, v5, v8 and v10,
    /// backwards v1, v4, v6, v7 and v9. What a launch resolves a [`Kernel`] to, and (with the `lab`
    /// feature) what a [`Kernel::Lab`] request names. One list: a new version is one line here.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Version {
        /// `lssa_fwd_simt`; `lssa_bwd_rows` + `lssa_bwd_keys`.
        V1 => "v1",
        /// `lssa_fwd_mma`.
        V2 => "v2",
        /// `lssa_fwd_mma3`.
        V3 => "v3",
        /// `lssa_bwd_rows_mma` + `lssa_bwd_keys_mma`.
        V4 => "v4",
        /// `lssa_fwd_mma5` (with re-weighting `lssa_fwd_stats5` + `lssa_fwd_rw5`).
        V5 => "v5",
        /// `lssa_bwd_rows_mma6` + `lssa_bwd_keys_mma6`.
        V6 => "v6",
        /// `lssa_bwd_rowstats7` + `lssa_bwd_keys_mma7` + `lssa_bwd_dq7`.
        V7 => "v7",
        /// `lssa_fwd_wg8` (with re-weighting `lssa_fwd_stats8` + `lssa_fwd_rw8`).
        V8 => "v8",
        /// `lssa_bwd_rowstats9` + `lssa_bwd_keys_wg9` + `lssa_bwd_dq7`.
        V9 => "v9",
        /// `lssa_fwd_ws10` (with re-weighting `lssa_fwd_stats10` + `lssa_fwd_rw10`): warp-specialised,
        /// TMA and mbarriers, sm_90a.
        V10 => "v10",
    }
}

impl Version {
    /// The lab's version number.
    pub const fn number(self) -> u32 {
        self as u32 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Production builds know the lab's names but refuse them, saying which feature runs them.
    #[test]
    fn lab_requests_need_the_lab_feature() {
        assert_eq!(" AUTO ".parse::<Kernel>().unwrap(), Kernel::Auto);
        assert_eq!(Kernel::default().name(), "auto");
        let v5 = "v5".parse::<Kernel>();
        #[cfg(feature = "lab")]
        assert_eq!(v5.unwrap(), Kernel::Lab(Version::V5));
        #[cfg(not(feature = "lab"))]
        {
            let err = v5.unwrap_err().to_string();
            assert!(err.contains("v5") && err.contains("`lab` feature"), "{err}");
        }
        let err = "v0".parse::<Kernel>().unwrap_err().to_string();
        assert!(err.contains("unknown CUDA kernel \"v0\""), "{err}");
    }

    /// `LSSA_CUDA_KERNEL` is read in one place, which names the variable in its errors.
    #[test]
    fn the_kernel_request_comes_from_one_variable() {
        let err = Kernel::from_var(Ok("v0".into())).unwrap_err().to_string();
        assert!(err.starts_with("invalid kernel parameters: LSSA_CUDA_KERNEL: unknown CUDA kernel"), "{err}");
        assert_eq!(Kernel::from_var(Ok(" auto ".into())).unwrap(), Kernel::Auto);
        assert_eq!(Kernel::from_var(Err(std::env::VarError::NotPresent)).unwrap(), Kernel::Auto);
        #[cfg(not(feature = "lab"))]
        {
            let err = Kernel::from_var(Ok("v7".into())).unwrap_err().to_string();
            assert!(err.contains("LSSA_CUDA_KERNEL: CUDA kernel v7") && err.contains("`lab` feature"), "{err}");
        }
        #[cfg(feature = "lab")]
        assert_eq!(Kernel::from_var(Ok("v7".into())).unwrap(), Kernel::Lab(Version::V7));
    }
}
