//! Every CUDA kernel source compiles with NVRTC, for every fused variant, dtype and the head
//! dimensions with their own code paths, on machines without a GPU (NVRTC from the torch venv;
//! `cargo xtask setup` installs it). A syntax or template error fails here, not on a user's GPU.

use attn_core::Variant;
use attn_kernels::cuda::{self, Dtype};
use rayon::prelude::*;

/// Every stage-1 name of attn-core that has a CUDA kernel, plus re-weighted forms.
fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    for name in attn_core::STAGE1_NAMES {
        // sigmoid-bias needs its training length.
        let v: Variant = if name.starts_with("sigmoid-bias") {
            format!("{name}:t_train=1024").parse().unwrap()
        } else {
            name.parse().unwrap()
        };
        if cuda::Config::new(&v, 64).is_ok() {
            out.push(v);
        }
    }
    for name in ["lssa+rw15", "lssa+rw1", "lssa+rw3", "softmax+rw15", "sigmoid-rowbias-l1+rw15", "linear-l1+rw3"] {
        out.push(name.parse().unwrap());
    }
    out
}

fn nvrtc_or_skip() -> bool {
    match cuda::nvrtc_location() {
        Ok(dir) => {
            eprintln!("NVRTC from {}", dir.display());
            true
        }
        // CI installs the torch venv (cargo xtask setup) and so always has NVRTC; a bare
        // `cargo test` without it must say why nothing was compiled rather than pass silently.
        Err(e) if std::env::var_os("LSSA_REQUIRE_NVRTC").is_none() => {
            eprintln!("SKIPPED: {e}");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_fused_variant_compiles_for_every_dtype_and_arch() {
    if !nvrtc_or_skip() {
        return;
    }
    let vs = variants();
    // 20 stage-1 names minus inverse, recentered, recentered-l1 and relu-ln, plus 6 re-weighted forms.
    assert_eq!(vs.len(), 16 + 6, "variants with a CUDA kernel: {vs:?}");
    let mut jobs = Vec::new();
    for v in &vs {
        jobs.push((v.clone(), 64, Dtype::Bf16, "compute_90"));
    }
    for v in ["lssa", "lssa+rw15", "softmax"] {
        let v: Variant = v.parse().unwrap();
        for dt in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            for hd in [64, 128, 48] {
                for arch in cuda::ARCHES {
                    jobs.push((v.clone(), hd, dt, arch));
                }
            }
        }
    }
    let failures: Vec<String> = jobs
        .par_iter()
        .filter_map(|(v, hd, dt, arch)| match cuda::compile_ptx(v, *hd, *dt, arch) {
            Ok(ptx) => {
                let mut missing = Vec::new();
                for entry in ["lssa_inv_norms", "lssa_fwd_simt", "lssa_bwd_rows", "lssa_bwd_keys"] {
                    if !ptx.contains(&format!(".entry {entry}")) {
                        missing.push(entry);
                    }
                }
                let tc = cuda::has_tensor_core_forward(*hd, *dt);
                if tc && !(ptx.contains(".entry lssa_fwd_mma(") && ptx.contains("mma.sync.aligned.m16n8k16")) {
                    missing.push("lssa_fwd_mma with mma.sync");
                }
                if tc
                    && !(ptx.contains(".entry lssa_fwd_mma3(")
                        && ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans")
                        && ptx.contains("cp.async"))
                {
                    missing.push("lssa_fwd_mma3 with ldmatrix.trans and cp.async");
                }
                if (tc && *hd == 64) != ptx.contains(".entry lssa_fwd_mma5(") {
                    missing.push("lssa_fwd_mma5 exactly at head dimension 64");
                }
                if tc && !(ptx.contains(".entry lssa_bwd_rows_mma(") && ptx.contains(".entry lssa_bwd_keys_mma(")) {
                    missing.push("the tensor-core backward");
                }
                if !tc && ptx.contains("lssa_fwd_mma") {
                    missing.push("(no tensor-core kernel expected)");
                }
                (!missing.is_empty()).then(|| format!("{v} d={hd} {dt:?} {arch}: missing {missing:?}"))
            }
            Err(e) => Some(format!("{v} d={hd} {dt:?} {arch}: {e}")),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} compilations failed:\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n\n")
    );
}

#[test]
fn variants_without_a_cuda_kernel_say_why() {
    for name in ["recentered", "inverse", "relu-ln"] {
        let v: Variant = name.parse().unwrap();
        let err = cuda::Config::new(&v, 64).unwrap_err().to_string();
        assert!(err.contains("not fused"), "{name}: {err}");
    }
}

#[test]
fn without_a_gpu_calls_fail_with_a_clear_error() {
    if cuda::is_available() {
        return; // covered by the GPU tests
    }
    let q = ndarray::Array4::<f32>::ones((1, 1, 4, 64));
    let err = cuda::forward(&"lssa".parse().unwrap(), &q, &q, &q).unwrap_err().to_string();
    assert!(err.contains("CUDA"), "{err}");
}

#[test]
fn kernel_names_parse() {
    use cuda::Kernel;
    for (s, k) in
        [("auto", Kernel::Auto), ("V1", Kernel::Simt), ("v2", Kernel::TensorCoreV2), ("v3", Kernel::TensorCore)]
    {
        assert_eq!(s.parse::<Kernel>().unwrap(), k, "{s}");
    }
    assert_eq!(" v5 ".parse::<Kernel>().unwrap(), Kernel::TensorCoreV5);
    let err = "v4.5".parse::<Kernel>().unwrap_err().to_string();
    assert_eq!("V7".parse::<Kernel>().unwrap(), Kernel::TensorCoreV7);
    assert!(err.contains("auto, v1, v2, v3, v5 or v7"), "{err}");
}
