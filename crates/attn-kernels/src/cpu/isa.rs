//! Runtime CPU-feature detection ([`Isa`]) and the multiversioning pattern ([`multiversion!`](crate::multiversion)) that
//! compiles one kernel body three times (AVX-512, AVX2+FMA, portable) and picks one at run time.
//!
//! # Why multiversioning, and why not closures
//!
//! The crate is built for the baseline target (x86-64 = SSE2), so LLVM may only use AVX2/AVX-512
//! inside functions marked `#[target_feature(enable = ...)]`. Target features do **not** propagate
//! into callees that are not inlined, nor reliably into closures, so a `with_isa(isa, || ...)`
//! helper cannot carry them. The pattern is instead:
//!
//! 1. one `#[inline(always)]` body, written as plain scalar Rust over slices (the functions in
//!    `crate::cpu::math` are `#[inline(always)]` too, so they melt into it);
//! 2. three thin wrappers, `#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]`,
//!    `#[target_feature(enable = "avx2,fma")]` and plain, each just calling the body, so the body is
//!    inlined and auto-vectorised once per feature set;
//! 3. a dispatcher that `match`es on an [`Isa`] (checked with [`Isa::assert_supported`]) and calls
//!    the matching wrapper.
//!
//! [`multiversion!`](crate::multiversion) writes all of that from one function definition. The body is generic over a
//! `const FMA: bool` that the macro sets to `true` under AVX2/AVX-512 and to [`SCALAR_FMA`] on the
//! portable path: [`f32::mul_add`] is one instruction where FMA is enabled but a slow libm call
//! (which also blocks vectorisation) where it is not, so the math functions take the same flag and
//! use `a * b + c` when it is `false`. Consequence: AVX2 and AVX-512 give bit-identical results;
//! the portable path may differ from them by an ulp or two.
//!
//! ```
//! use attn_kernels::cpu::isa::Isa;
//!
//! attn_kernels::multiversion! {
//!     /// `ys[i] = xs[i] * scale + shift`, vectorised for `isa`, one fused multiply-add where `FMA`.
//!     pub fn scaled_shift<const FMA: bool>(isa: Isa, xs: &[f32], ys: &mut [f32], scale: f32, shift: f32) {
//!         for (y, &x) in ys.iter_mut().zip(xs) {
//!             *y = if FMA { x.mul_add(scale, shift) } else { x * scale + shift };
//!         }
//!     }
//! }
//!
//! let xs = [-1.0f32, 0.0, 1.0];
//! let mut ys = [0.0f32; 3];
//! for isa in Isa::all_supported() {
//!     scaled_shift(isa, &xs, &mut ys, 2.0, 0.5);
//!     assert_eq!(ys, [-1.5, 0.5, 2.5]);
//! }
//! scaled_shift(Isa::detect(), &xs, &mut ys, 2.0, 0.5); // what kernels normally pass
//! ```
//!
//! The generated function has the listed signature without the `<const FMA: bool>` (which only
//! names the flag for the body). The macro takes plain `name: Type` parameters, the first of type
//! [`Isa`]; for anything fancier (type generics, `where` clauses, `self`) write the three wrappers
//! by hand exactly as the macro's expansion does (see its source), keeping the body
//! `#[inline(always)]` and the wrappers thin.
//!
//! **Selecting the ISA.** [`Isa::detect`] returns the best supported ISA, cached; the environment
//! variable `ATTN_KERNELS_ISA=scalar|avx2|avx512|amx` overrides it (an unsupported or unknown value is
//! refused with a one-time warning on stderr). Tests should loop over [`Isa::all_supported`] so the
//! portable path is exercised too.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// Environment variable that overrides [`Isa::detect`]: `scalar`, `avx2`, `avx512` or `amx`.
pub const ISA_ENV_VAR: &str = "ATTN_KERNELS_ISA";

/// Whether the portable ([`Isa::Scalar`]) instantiation of a multiversioned body uses
/// [`f32::mul_add`] (`true`) or `a * b + c` (`false`).
///
/// `true` only where `mul_add` is a native instruction for the baseline target: aarch64, or x86-64
/// built with `-C target-feature=+fma` (e.g. `target-cpu=native`). Elsewhere `mul_add` is a libm
/// call that is ~10x slower and prevents vectorisation.
pub const SCALAR_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// An instruction-set level that the CPU kernels are compiled for; chosen at run time.
///
/// Ordered from best to most portable. Only [`Isa::Scalar`] exists in practice on non-x86-64
/// targets (the other variants are then never supported).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// [`Isa::Avx512`] with the long forward's score and value products (and its backward's
    /// recomputed scores) on Intel AMX tiles, in three bf16 parts a value and six products of
    /// parts, as accurate as the f32 products (`cpu::tile::amx`); everything else is the AVX-512
    /// code. Needs AMX-TILE, AMX-BF16 and AVX512-BF16 and, on Linux, the process's permission for
    /// the tile state (asked on first use).
    Amx,
    /// AVX-512 F/BW/DQ/VL (plus AVX2 and FMA): 16 f32 lanes.
    Avx512,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2Fma,
    /// The baseline target with no extra features (SSE2 on x86-64; NEON on aarch64). Always
    /// supported; uses fused multiply-add only where [`SCALAR_FMA`] says so.
    Scalar,
}

/// Error from parsing an [`Isa`] name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown ISA {0:?}: expected one of \"amx\", \"avx512\", \"avx2\", \"scalar\"")]
pub struct ParseIsaError(pub String);

impl Isa {
    /// Every variant, best first.
    pub const ALL: [Isa; 4] = [Isa::Amx, Isa::Avx512, Isa::Avx2Fma, Isa::Scalar];

    /// The short lower-case name (`"amx"`, `"avx512"`, `"avx2"`, `"scalar"`), as accepted by
    /// [`FromStr`] and [`ISA_ENV_VAR`].
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512 => "avx512",
            Isa::Avx2Fma => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether this CPU can run code compiled for `self`. Cheap (a cached atomic load per feature);
    /// called by every [`multiversion!`](crate::multiversion) dispatch.
    #[inline]
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.is_supported() && crate::cpu::tile::amx::enabled(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512dq")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Amx | Isa::Avx2Fma | Isa::Avx512 => false,
        }
    }

    /// The vector instruction set of `self`'s code: [`Isa::Avx512`] for [`Isa::Amx`] (whose
    /// element-wise code, and every product not on its tiles, is AVX-512's), else `self`.
    /// Dispatchers of vector code match on this.
    #[inline]
    pub const fn simd(self) -> Isa {
        match self {
            Isa::Amx => Isa::Avx512,
            other => other,
        }
    }

    /// Returns `self`, panicking if the CPU does not support it. Dispatchers call this before
    /// entering `#[target_feature]` code, which would be undefined behaviour on such a CPU.
    #[inline]
    #[track_caller]
    pub fn assert_supported(self) -> Isa {
        assert!(self.is_supported(), "ISA {self} is not supported by this CPU (supported: {:?})", Isa::all_supported());
        self
    }

    /// The best ISA this CPU supports, ignoring [`ISA_ENV_VAR`].
    pub fn best_supported() -> Isa {
        Isa::ALL.into_iter().find(|isa| isa.is_supported()).unwrap_or(Isa::Scalar)
    }

    /// Every ISA this CPU supports, best first; always ends with [`Isa::Scalar`]. Tests loop over
    /// this to exercise every code path.
    pub fn all_supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.is_supported()).collect()
    }

    /// The ISA kernels should use: [`ISA_ENV_VAR`] if set to a supported ISA, otherwise the best
    /// supported one. Resolved once per process (the first call reads the environment and prints
    /// any warning); later calls are a load.
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let requested = std::env::var(ISA_ENV_VAR).ok();
            let (isa, warning) = resolve(requested.as_deref(), Isa::is_supported);
            if let Some(warning) = warning {
                eprintln!("attn-kernels: {warning}");
            }
            isa
        })
    }
}

/// Resolves an optional requested ISA name against a support predicate: the requested ISA if it
/// parses and is supported, else the best supported ISA plus a warning saying why.
fn resolve(requested: Option<&str>, supported: impl Fn(Isa) -> bool) -> (Isa, Option<String>) {
    let best = Isa::ALL.into_iter().find(|&isa| supported(isa)).unwrap_or(Isa::Scalar);
    let Some(requested) = requested.map(str::trim).filter(|s| !s.is_empty()) else {
        return (best, None);
    };
    match requested.parse::<Isa>() {
        Ok(isa) if supported(isa) => (isa, None),
        Ok(isa) => (best, Some(format!("{ISA_ENV_VAR}={requested}: this CPU lacks {isa}; using {best}"))),
        Err(e) => (best, Some(format!("{ISA_ENV_VAR}: {e}; using {best}"))),
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = ParseIsaError;

    /// Parses `amx`, `avx512`, `avx2` (or `avx2fma`) and `scalar`, case-insensitively.
    fn from_str(s: &str) -> Result<Isa, ParseIsaError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "amx" => Ok(Isa::Amx),
            "avx512" => Ok(Isa::Avx512),
            "avx2" | "avx2fma" => Ok(Isa::Avx2Fma),
            "scalar" => Ok(Isa::Scalar),
            _ => Err(ParseIsaError(s.to_owned())),
        }
    }
}

/// Defines a function that runs one `#[inline(always)]` body compiled for the [`Isa`] it is given.
///
/// Syntax: an ordinary `fn` item (attributes and doc comments allowed) with `<const FMA: bool>`
/// (any name) as its only generic parameter, a first parameter of type [`Isa`], further parameters
/// as `name: Type`, and an optional return type. The generated function drops the generic
/// parameter; inside the body, the flag is `true` under AVX2/AVX-512 and [`SCALAR_FMA`] on the
/// portable path, and is meant to be passed on to `crate::cpu::math` (`math::exp::<FMA>(x)`).
///
/// Attributes (doc comments, `#[allow(clippy::too_many_arguments)]`, ...) apply to the generated
/// dispatcher; the hidden inner functions allow `too_many_arguments` and `type_complexity`
/// themselves.
///
/// Panics if the CPU does not support the requested ISA (see [`Isa::assert_supported`]). See the
/// [module docs](crate::cpu::isa) for an example and the reasoning.
#[macro_export]
macro_rules! multiversion {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident < const $fma:ident : bool > (
            $isa:ident : $isa_ty:ty $(, $arg:ident : $arg_ty:ty)* $(,)?
        ) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$attr])*
        $vis fn $name($isa: $isa_ty $(, $arg: $arg_ty)*) $(-> $ret)? {
            // The inner functions mirror the outer signature, which the caller can `#[allow]` lints
            // on; these they cannot reach.
            #[inline(always)]
            #[allow(clippy::too_many_arguments, clippy::type_complexity)]
            fn __mv_body<const $fma: bool>($($arg: $arg_ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
            #[allow(clippy::too_many_arguments, clippy::type_complexity)]
            fn __mv_avx512($($arg: $arg_ty),*) $(-> $ret)? {
                __mv_body::<true>($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments, clippy::type_complexity)]
            fn __mv_avx2($($arg: $arg_ty),*) $(-> $ret)? {
                __mv_body::<true>($($arg),*)
            }

            #[allow(clippy::too_many_arguments, clippy::type_complexity)]
            fn __mv_scalar($($arg: $arg_ty),*) $(-> $ret)? {
                __mv_body::<{ $crate::cpu::isa::SCALAR_FMA }>($($arg),*)
            }

            match $crate::cpu::isa::Isa::assert_supported($isa) {
                // SAFETY: `assert_supported` checked that the CPU has every feature enabled on
                // the wrapper.
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::isa::Isa::Amx | $crate::cpu::isa::Isa::Avx512 => unsafe { __mv_avx512($($arg),*) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::isa::Isa::Avx2Fma => unsafe { __mv_avx2($($arg),*) },
                _ => __mv_scalar($($arg),*),
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for isa in Isa::ALL {
            assert_eq!(isa.to_string().parse::<Isa>(), Ok(isa));
            assert_eq!(isa.name().to_uppercase().parse::<Isa>(), Ok(isa));
        }
        assert_eq!("avx2fma".parse::<Isa>(), Ok(Isa::Avx2Fma));
        assert!("sse".parse::<Isa>().is_err());
    }

    #[test]
    fn detect_is_supported_and_listed() {
        let all = Isa::all_supported();
        assert_eq!(all.last(), Some(&Isa::Scalar));
        assert!(Isa::detect().is_supported());
        assert!(all.contains(&Isa::detect()));
        assert_eq!(all[0], Isa::best_supported());
        // `amx` implies `avx512` implies `avx2`: the list is a prefix-closed ladder.
        if Isa::Amx.is_supported() {
            assert!(Isa::Avx512.is_supported());
        }
        if Isa::Avx512.is_supported() {
            assert!(Isa::Avx2Fma.is_supported());
        }
    }

    #[test]
    fn env_override_is_honoured_or_refused() {
        let only_avx2 = |isa: Isa| !matches!(isa, Isa::Amx | Isa::Avx512);
        assert_eq!(resolve(None, only_avx2), (Isa::Avx2Fma, None));
        assert_eq!(resolve(Some(""), only_avx2), (Isa::Avx2Fma, None));
        assert_eq!(resolve(Some("scalar"), only_avx2), (Isa::Scalar, None));
        assert_eq!(resolve(Some(" AVX2 "), only_avx2), (Isa::Avx2Fma, None));
        let (isa, warning) = resolve(Some("avx512"), only_avx2);
        assert_eq!(isa, Isa::Avx2Fma);
        assert!(warning.unwrap().contains("lacks avx512"));
        let (isa, warning) = resolve(Some("neon"), |_| true);
        assert_eq!(isa, Isa::Amx);
        assert!(warning.unwrap().contains("unknown ISA"));
        assert_eq!(resolve(Some("avx512"), |isa| isa == Isa::Scalar).0, Isa::Scalar);
    }

    crate::multiversion! {
        /// Test helper: sum of `xs` through the dispatcher.
        fn dispatched_sum<const FMA: bool>(isa: Isa, xs: &[f32]) -> (f32, bool) {
            (xs.iter().sum(), FMA)
        }
    }

    #[test]
    fn multiversion_dispatches_every_supported_isa() {
        let xs = [1.0f32, 2.0, 3.0];
        for isa in Isa::all_supported() {
            let (sum, fma) = dispatched_sum(isa, &xs);
            assert_eq!(sum, 6.0);
            assert_eq!(fma, isa != Isa::Scalar || SCALAR_FMA);
        }
    }

    #[test]
    fn multiversion_refuses_unsupported_isa() {
        if let Some(&missing) = Isa::ALL.iter().find(|isa| !isa.is_supported()) {
            assert!(std::panic::catch_unwind(|| dispatched_sum(missing, &[1.0])).is_err());
        }
    }
}
