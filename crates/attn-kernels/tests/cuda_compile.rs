//! Every CUDA kernel source compiles with NVRTC, for every fused variant, dtype and the head
//! dimensions with their own code paths, on machines without a GPU (NVRTC from the torch venv;
//! `cargo xtask setup` installs it). A syntax or template error fails here, not on a user's GPU.

use attn_core::Variant;
use attn_kernels::cuda::{self, Dtype, Generation, Kernel, Version};
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
    // 23 stage-1 names minus inverse, recentered, recentered-l1, relu-ln and relu-seqlen (no CUDA
    // kernel for the sequence-length divisor), plus 6 re-weighted forms.
    assert_eq!(vs.len(), 18 + 6, "variants with a CUDA kernel: {vs:?}");
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
        .filter_map(|(v, hd, dt, arch)| match cuda::compile_ptx(v, *hd, *dt, arch, Generation::Lab) {
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
                let wg = tc && *arch == "compute_90a";
                if wg
                    != (ptx.contains(".entry lssa_fwd_wg8(") && ptx.contains("wgmma.mma_async.sync.aligned.m64n64k16"))
                {
                    missing.push("lssa_fwd_wg8 with wgmma exactly on compute_90a");
                }
                if (wg && *hd == 64) != ptx.contains(".entry lssa_bwd_keys_wg9(") {
                    missing.push("lssa_bwd_keys_wg9 exactly at head dimension 64 on compute_90a");
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

/// The `.entry` names of a PTX module.
fn entries(ptx: &str) -> std::collections::BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim().to_string())
        .collect()
}

/// A module compiles only the generations its `Kernel` request can select: what `Auto` loads holds
/// v1 to v4 and none of the lab's later kernels, and every generation compiles on its own (a later
/// file may use an earlier one's helpers, never the reverse).
#[test]
fn each_generation_compiles_alone_and_holds_only_its_kernels() {
    if !nvrtc_or_skip() {
        return;
    }
    const SIMT: [&str; 4] = ["lssa_inv_norms", "lssa_fwd_simt", "lssa_bwd_rows", "lssa_bwd_keys"];
    let expect = |g: Generation| -> Vec<&str> {
        let mut e = SIMT.to_vec();
        if g >= Generation::V2 {
            e.push("lssa_fwd_mma");
        }
        if g >= Generation::First {
            e.extend(["lssa_fwd_mma3", "lssa_bwd_rows_mma", "lssa_bwd_keys_mma"]);
        }
        e
    };
    // The whole lab (and so `Generation::Lab`) is checked by the test above; re-weighting has the
    // most code paths.
    let failures: Vec<String> = [Generation::Simt, Generation::V2, Generation::First]
        .par_iter()
        .filter_map(|g| {
            let ptx = match cuda::compile_ptx(&"lssa+rw15".parse().unwrap(), 64, Dtype::Bf16, "compute_90a", *g) {
                Ok(p) => p,
                Err(e) => return Some(format!("{g:?}: {e}")),
            };
            let got = entries(&ptx);
            let want: std::collections::BTreeSet<String> = expect(*g).iter().map(|s| s.to_string()).collect();
            (got != want).then(|| format!("{g:?}: entries {got:?}, expected {want:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The default request loads the first generation; only the lab's requests load the lab.
    assert_eq!(Kernel::Auto.generation(), Generation::First);
    assert_eq!(Kernel::Lab(Version::V3).generation(), Generation::First);
    for k in [Kernel::Lab(Version::V5), Kernel::Lab(Version::V7), Kernel::Lab(Version::V8)] {
        assert_eq!(k.generation(), Generation::Lab, "{k:?}");
    }
}

#[test]
fn variants_without_a_cuda_kernel_say_why() {
    for name in ["recentered", "inverse", "relu-ln", "relu-seqlen", "relu-seqlen+rw3"] {
        let v: Variant = name.parse().unwrap();
        let err = cuda::Config::new(&v, 64).unwrap_err();
        assert!(matches!(err, attn_kernels::Error::NotFused { .. }), "{name}: {err}");
        assert!(err.to_string().contains("not fused"), "{name}: {err}");
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
    for (s, k) in [
        ("auto", Kernel::Auto),
        ("V1", Kernel::Lab(Version::V1)),
        ("v2", Kernel::Lab(Version::V2)),
        ("v3", Kernel::Lab(Version::V3)),
    ] {
        assert_eq!(s.parse::<Kernel>().unwrap(), k, "{s}");
    }
    assert_eq!(" v5 ".parse::<Kernel>().unwrap(), Kernel::Lab(Version::V5));
    let err = "v4.5".parse::<Kernel>().unwrap_err().to_string();
    assert_eq!("V7".parse::<Kernel>().unwrap(), Kernel::Lab(Version::V7));
    assert_eq!("v8".parse::<Kernel>().unwrap(), Kernel::Lab(Version::V8));
    assert_eq!("v9".parse::<Kernel>().unwrap(), Kernel::Lab(Version::V9));
    assert_eq!("simt".parse::<Kernel>().unwrap(), Kernel::Lab(Version::V1));
    assert!(err.contains("auto or v1 to v9"), "{err}");
    assert!("v10".parse::<Kernel>().is_err());
    for k in Kernel::ALL {
        assert_eq!(k.name().parse::<Kernel>().unwrap(), k, "{}", k.name());
    }
}

/// ptxas, which the torch wheel ships next to libtorch (`torch/bin/ptxas`): `$LSSA_PTXAS`, then
/// `$LIBTORCH/bin`, then the CUDA toolkit.
fn ptxas() -> Option<std::path::PathBuf> {
    let mut c: Vec<std::path::PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("LSSA_PTXAS") {
        c.push(p.into());
    }
    if let Some(t) = std::env::var_os("LIBTORCH") {
        let t = std::path::PathBuf::from(t);
        c.push(t.canonicalize().unwrap_or(t).join("bin/ptxas"));
    }
    c.push("/usr/local/cuda/bin/ptxas".into());
    c.into_iter().find(|p| p.is_file())
}

/// NVRTC checks the C++, not the PTX inside `asm` statements (mma.sync, ldmatrix, cp.async,
/// wgmma): ptxas assembles the PTX for the real architectures here, so a malformed instruction
/// fails CI rather than the first GPU run. Also a resource check: the v9 backward, and v8 without
/// re-weighting, must not spill at head dimension 64, and ptxas must not serialise their wgmma (it
/// does, with a warning, when registers an in-flight wgmma uses are touched; or injects waits, with
/// a note). (With re-weighting v5
/// and v8 spill 12 to 16 bytes at 255 registers.)
#[test]
fn the_inline_ptx_assembles_for_sm80_and_sm90a() {
    if !nvrtc_or_skip() {
        return;
    }
    let Some(ptxas) = ptxas() else {
        assert!(std::env::var_os("LSSA_REQUIRE_NVRTC").is_none(), "no ptxas (torch/bin/ptxas of the torch venv)");
        eprintln!("SKIPPED: no ptxas");
        return;
    };
    let dir = std::env::temp_dir().join(format!("lssa-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut jobs = Vec::new();
    for v in ["lssa", "lssa+rw15", "softmax"] {
        jobs.push((v, 64, Dtype::Bf16, "compute_90a", "sm_90a"));
        jobs.push((v, 64, Dtype::F16, "compute_80", "sm_80"));
    }
    jobs.push(("lssa+rw3", 128, Dtype::Bf16, "compute_90a", "sm_90a"));
    jobs.push(("lssa", 128, Dtype::Bf16, "compute_90a", "sm_90a"));
    jobs.push(("lssa", 64, Dtype::F16, "compute_90a", "sm_90a"));
    let failures: Vec<String> = jobs
        .par_iter()
        .enumerate()
        .filter_map(|(i, (v, hd, dt, arch, sm))| {
            let what = format!("{v} d={hd} {dt:?} {sm}");
            let ptx = cuda::compile_ptx(&v.parse().unwrap(), *hd, *dt, arch, Generation::Lab)
                .map_err(|e| format!("{what}: {e}"))
                .ok()?;
            let (src, out) = (dir.join(format!("{i}.ptx")), dir.join(format!("{i}.cubin")));
            std::fs::write(&src, ptx).unwrap();
            let r = std::process::Command::new(&ptxas)
                .args([format!("-arch={sm}"), "-v".into()])
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .output()
                .unwrap();
            let log = String::from_utf8_lossy(&r.stderr).to_string() + &String::from_utf8_lossy(&r.stdout);
            if !r.status.success() {
                return Some(format!("{what}: ptxas failed:\n{log}"));
            }
            // "wgmma.mma_async instructions are serialized", "warpgroup.arrive is injected": ptxas
            // had to add waits because registers an in-flight wgmma uses were touched.
            // (The layout probe, lssa_wg_probe, is not a kernel whose speed matters.)
            let waits: Vec<&str> = log
                .lines()
                .filter(|l| (l.contains("serialized") || l.contains("injected")) && !l.contains("lssa_wg_probe"))
                .collect();
            if !waits.is_empty() {
                return Some(format!("{what}: ptxas serialised or fenced wgmma itself:\n{}", waits.join("\n")));
            }
            // ptxas reports "Compiling entry function 'NAME'", then its properties with the spills.
            let entries =
                if v.contains("+rw") { &["lssa_bwd_keys_wg9"][..] } else { &["lssa_fwd_wg8", "lssa_bwd_keys_wg9"] };
            for entry in entries {
                if let Some(at) = log.find(&format!("entry function '{entry}'")) {
                    let props = log[at..].lines().take(4).collect::<Vec<_>>().join("\n");
                    if !props.contains("0 bytes spill stores") {
                        return Some(format!("{what}: {entry} spills:\n{props}"));
                    }
                }
            }
            None
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
