//! Every CUDA kernel source compiles with NVRTC, for every fused variant, dtype and the head
//! dimensions with their own code paths, on machines without a GPU (NVRTC from the torch venv;
//! `cargo xtask setup` installs it). A syntax or template error fails here, not on a user's GPU.

use attn_core::Variant;
use attn_kernels::cuda::{self, Dtype, Generation, Kernel, Version};
use rayon::prelude::*;

mod ptxas;
use ptxas::{Usage, table};

/// Every stage-1 name of attn-core that has a CUDA kernel, plus re-weighted forms.
fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    for name in attn_core::variant::STAGE1_NAMES {
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

/// NVRTC and ptxas (the torch venv's `torch/bin/ptxas`), or `None` after saying why the test is
/// skipped (a failure where `LSSA_REQUIRE_NVRTC` is set, as in CI).
fn ptxas_or_skip() -> Option<std::path::PathBuf> {
    if !nvrtc_or_skip() {
        return None;
    }
    let found = ptxas::find();
    if found.is_none() {
        assert!(std::env::var_os("LSSA_REQUIRE_NVRTC").is_none(), "no ptxas (torch/bin/ptxas of the torch venv)");
        eprintln!("SKIPPED: no ptxas");
    }
    found
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
/// exactly the kernels it can launch (v1, v2, v5 and v7 at d = 64; v3 for v5 at d = 128), none of
/// v4, v6 or the lab's warpgroup kernels (v8, v9, the probe), even on sm_90a; the kernels a module
/// defines are the ones the host expects there (`Kern::present`); and every generation compiles on
/// its own (a later file may use an earlier one's helpers, never the reverse).
#[test]
fn each_generation_compiles_alone_and_holds_only_its_kernels() {
    if !nvrtc_or_skip() {
        return;
    }
    const SIMT: [&str; 4] = ["lssa_inv_norms", "lssa_fwd_simt", "lssa_bwd_rows", "lssa_bwd_keys"];
    let expect = |g: Generation, hd: usize| -> Vec<&str> {
        let mut e = SIMT.to_vec();
        if g >= Generation::V2 {
            e.push("lssa_fwd_mma");
        }
        if g >= Generation::First {
            e.extend(if hd == 64 {
                ["lssa_fwd_mma5", "lssa_fwd_stats5", "lssa_fwd_rw5"].as_slice()
            } else {
                &["lssa_fwd_mma3"]
            });
            e.extend(["lssa_bwd_rowstats7", "lssa_bwd_keys_mma7", "lssa_bwd_dq7"]);
        }
        e
    };
    // The whole lab (and so `Generation::Lab`) is checked by the test above; re-weighting has the
    // most code paths.
    let cases: Vec<(Generation, usize)> =
        [Generation::Simt, Generation::V2, Generation::First].into_iter().flat_map(|g| [(g, 64), (g, 128)]).collect();
    let failures: Vec<String> = cases
        .par_iter()
        .filter_map(|&(g, hd)| {
            let ptx = match cuda::compile_ptx(&"lssa+rw15".parse().unwrap(), hd, Dtype::Bf16, "compute_90a", g) {
                Ok(p) => p,
                Err(e) => return Some(format!("{g:?} d={hd}: {e}")),
            };
            let got = entries(&ptx);
            let want: std::collections::BTreeSet<String> = expect(g, hd).iter().map(|s| s.to_string()).collect();
            let present: std::collections::BTreeSet<String> =
                cuda::kernels_present(hd, Dtype::Bf16, false, g).into_iter().map(str::to_string).collect();
            (got != want || present != want)
                .then(|| format!("{g:?} d={hd}: entries {got:?}, the host expects {present:?}, the test {want:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The default request and v7 load the first generation; the other tensor-core pairs the lab.
    for k in [Kernel::Auto, Kernel::Lab(Version::V7)] {
        assert_eq!(k.generation(), Generation::First, "{k:?}");
    }
    for v in [Version::V3, Version::V4, Version::V5, Version::V6, Version::V8, Version::V9, Version::V10] {
        assert_eq!(Kernel::Lab(v).generation(), Generation::Lab, "{v:?}");
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
    assert_eq!("v10".parse::<Kernel>().unwrap(), Kernel::Lab(Version::V10));
    assert!(err.contains("auto or v1 to v10"), "{err}");
    assert!("v11".parse::<Kernel>().is_err());
    for k in Kernel::ALL {
        assert_eq!(k.name().parse::<Kernel>().unwrap(), k, "{}", k.name());
    }
}

/// Whether `Kernel::Auto` can launch `kernel` of its own module (`Generation::First`) for a variant.
/// That module holds only what Auto launches (`each_generation_compiles_alone_and_holds_only_its_kernels`),
/// but v5's forward serves the variants without re-weighting and its statistics and second sweep
/// those with it (`launch.rs`).
fn auto_launches(kernel: &str, reweighted: bool) -> bool {
    match kernel {
        "lssa_fwd_mma5" => !reweighted,
        "lssa_fwd_stats5" | "lssa_fwd_rw5" => reweighted,
        _ => true,
    }
}

/// The spills of kernels `Kernel::Auto` launches that ptxas (the torch venv's, CUDA 13.0) reports:
/// `(kernel, specialisation, bytes of spill stores, bytes of stack frame)`. None may grow and none
/// may be added; one that no longer spills, or that Auto no longer launches, must be removed, so the
/// list only shrinks. It went from 44 (issue 47) to 9 with v5 + v7 as Auto's and v5's statistics
/// re-read, and to none: IEEE divisions became `rcp_fast` (their slow path is a call, around which
/// ptxas spilled in v2 and v7), mish's tanh(softplus) one exp and one reciprocal, v7's keys kernel
/// packs W and dS as A fragments entry by entry, the tensor-core tiles' ldmatrix rows are 32-bit
/// shared addresses plus constants (`SAddr`: ptxas folds the constants into the instruction instead
/// of holding a register per offset), and v7's rows kernel rebuilds its record at its end. ptxas of
/// CUDA 13 settles at occupancy steps (32 / 40 registers for the SIMT kernels, 168 for the rows
/// kernel) and spills a cold value to stay on one, so a change elsewhere can bring a spill back:
/// this list and the check say where.
const KNOWN_AUTO_SPILLS: [(&str, &str, u32, u32); 0] = [];

/// The spills of the lab's gated warpgroup kernels (the v9 backward, v8 without re-weighting, at
/// d = 64), as [`KNOWN_AUTO_SPILLS`]. The check before issue 47 missed v9's keys kernel for softmax
/// (20 bytes at 255 registers: it looked for "0 bytes spill stores", which "20 bytes spill stores"
/// contains); it left when the keys kernel started packing W and dS as A fragments entry by entry.
const KNOWN_LAB_SPILLS: [(&str, &str, u32, u32); 0] = [];

/// What one ptxas run is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The whole lab (`Generation::Lab`) at a few specialisations: `wgmma` serialisation and the v8 /
    /// v9 spills fail the test, the other numbers are printed.
    Lab,
    /// `Generation::First`, what `Kernel::Auto` loads, for every fused variant: a spill in a kernel
    /// Auto can launch fails the test.
    Auto,
}

struct PtxasJob {
    role: Role,
    variant: String,
    head_dim: usize,
    dtype: Dtype,
    arch: &'static str,
    sm: &'static str,
}

impl PtxasJob {
    fn what(&self) -> String {
        format!("{} d={} {:?} {}", self.variant, self.head_dim, self.dtype, self.sm)
    }

    fn reweighted(&self) -> bool {
        self.variant.contains("+rw")
    }
}

/// The rows of a table: each report labelled by its specialisation.
fn labelled<'a>(rows: &[(&PtxasJob, &'a [Usage])]) -> Vec<(String, &'a [Usage])> {
    rows.iter().map(|(j, u)| (j.what(), *u)).collect()
}

/// NVRTC checks the C++, not the PTX inside `asm` statements (mma.sync, ldmatrix, cp.async,
/// wgmma): ptxas assembles the PTX for the real architectures here, so a malformed instruction
/// fails CI rather than the first GPU run. Also the resource check, as tables on stderr (visible
/// with `--nocapture`): registers, spills and local memory of every kernel
///
/// - that `Kernel::Auto` can launch (`Generation::First`), for every fused variant at head
///   dimensions 64 and 128, bf16 on sm_90a and f16 on sm_80: any spill beyond
///   [`KNOWN_AUTO_SPILLS`] fails;
/// - of the whole lab at a few specialisations: the v9 backward, v8 without re-weighting and v10 must
///   not spill at head dimension 64 beyond [`KNOWN_LAB_SPILLS`], and ptxas must not serialise their
///   wgmma (it does, with a warning, when registers an in-flight wgmma uses are touched; or injects
///   waits, with a note).
#[test]
fn the_inline_ptx_assembles_for_sm80_and_sm90a() {
    let Some(ptxas) = ptxas_or_skip() else { return };
    let started = std::time::Instant::now();
    let dir = std::env::temp_dir().join(format!("lssa-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let job = |role, variant: &str, head_dim, dtype, arch, sm| PtxasJob {
        role,
        variant: variant.to_string(),
        head_dim,
        dtype,
        arch,
        sm,
    };
    let mut jobs = Vec::new();
    for v in ["lssa", "lssa+rw15", "softmax"] {
        jobs.push(job(Role::Lab, v, 64, Dtype::Bf16, "compute_90a", "sm_90a"));
        jobs.push(job(Role::Lab, v, 64, Dtype::F16, "compute_80", "sm_80"));
    }
    jobs.push(job(Role::Lab, "lssa+rw3", 128, Dtype::Bf16, "compute_90a", "sm_90a"));
    jobs.push(job(Role::Lab, "lssa", 128, Dtype::Bf16, "compute_90a", "sm_90a"));
    jobs.push(job(Role::Lab, "lssa", 64, Dtype::F16, "compute_90a", "sm_90a"));
    let targets = [(Dtype::Bf16, "compute_90a", "sm_90a"), (Dtype::F16, "compute_80", "sm_80")];
    for v in variants() {
        let v = v.to_string();
        for (dt, arch, sm) in targets {
            for hd in [64, 128] {
                jobs.push(job(Role::Auto, &v, hd, dt, arch, sm));
            }
        }
    }
    let results: Vec<Result<Vec<Usage>, String>> = jobs
        .par_iter()
        .enumerate()
        .map(|(i, j)| {
            let what = j.what();
            let generation = if j.role == Role::Auto { Generation::First } else { Generation::Lab };
            let ptx = cuda::compile_ptx(&j.variant.parse().unwrap(), j.head_dim, j.dtype, j.arch, generation)
                .map_err(|e| format!("{what}: {e}"))?;
            let (src, out) = (dir.join(format!("{i}.ptx")), dir.join(format!("{i}.cubin")));
            std::fs::write(&src, ptx).unwrap();
            let mut cmd = std::process::Command::new(&ptxas);
            cmd.args([format!("-arch={}", j.sm), "-v".into()]).arg(&src).arg("-o").arg(&out);
            let r = cmd.output().unwrap();
            let log = String::from_utf8_lossy(&r.stderr).to_string() + &String::from_utf8_lossy(&r.stdout);
            if !r.status.success() {
                return Err(format!("{what}: ptxas failed:\n{log}"));
            }
            // "wgmma.mma_async instructions are serialized", "warpgroup.arrive is injected": ptxas
            // had to add waits because registers an in-flight wgmma uses were touched.
            // (The layout probes, lssa_wg_probe and lssa_tma_probe, are not kernels whose speed matters.)
            let waits: Vec<&str> = log
                .lines()
                .filter(|l| (l.contains("serialized") || l.contains("injected")) && !l.contains("_probe'"))
                .collect();
            if !waits.is_empty() {
                return Err(format!("{what}: ptxas serialised or fenced wgmma itself:\n{}", waits.join("\n")));
            }
            Ok(ptxas::usages(&log))
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    let mut failures: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().cloned()).collect();
    let done: Vec<(&PtxasJob, &[Usage])> =
        jobs.iter().zip(&results).filter_map(|(j, r)| r.as_ref().ok().map(|u| (j, u.as_slice()))).collect();
    let legend = "(registers; where not 0, ` s<spill stores>/<spill loads> l<stack frame>` in bytes)";
    // Spills of kernels a specialisation compiles but never launches: listed, not gated.
    let mut idle = Vec::new();

    // Kernel::Auto: no spill in anything it can launch beyond the known ones.
    let auto: Vec<(&PtxasJob, &[Usage])> = done.iter().filter(|(j, _)| j.role == Role::Auto).copied().collect();
    let launched = |j: &PtxasJob, k: &str| auto_launches(k, j.reweighted());
    let title = format!(
        "ptxas -v of Generation::First, what Kernel::Auto loads {legend}; in parentheses where Auto never launches it:"
    );
    eprintln!("{}", table(&title, &labelled(&auto), &|row, k| launched(auto[row].0, k)));
    let mut spilling = 0;
    for (j, us) in &auto {
        for u in us.iter() {
            let known = KNOWN_AUTO_SPILLS.iter().find(|(k, what, _, _)| *k == u.kernel && *what == j.what());
            match known {
                Some(_) if !launched(j, &u.kernel) => failures.push(format!(
                    "{}: Kernel::Auto no longer launches {}: remove it from KNOWN_AUTO_SPILLS",
                    j.what(),
                    u.kernel
                )),
                _ if !launched(j, &u.kernel) => {
                    if u.spills() {
                        idle.push(format!("  {}: {}", j.what(), u.describe()));
                    }
                }
                Some(_) if !u.spills() => failures.push(format!(
                    "{}: {} no longer spills: remove it from KNOWN_AUTO_SPILLS",
                    j.what(),
                    u.kernel
                )),
                None if !u.spills() => {}
                Some((_, _, stores, stack)) if u.spill_stores <= *stores && u.stack <= *stack => spilling += 1,
                Some((_, _, stores, stack)) => failures.push(format!(
                    "{}: {}: more than the known {stores} bytes of spill stores and {stack} bytes of stack frame",
                    j.what(),
                    u.describe()
                )),
                None => failures.push(format!("{}: {} spills (Kernel::Auto launches it)", j.what(), u.describe())),
            }
        }
    }
    let unseen: Vec<String> = KNOWN_AUTO_SPILLS
        .iter()
        .filter(|(k, what, _, _)| !auto.iter().any(|(j, us)| j.what() == *what && us.iter().any(|u| u.kernel == *k)))
        .map(|(k, what, _, _)| format!("{what} {k}"))
        .collect();
    if !unseen.is_empty() {
        failures.push(format!("KNOWN_AUTO_SPILLS names kernels this check did not assemble: {unseen:?}"));
    }
    eprintln!(
        "Kernels Kernel::Auto launches that spill: {spilling}, none beyond KNOWN_AUTO_SPILLS (which may only \
         shrink).\n"
    );

    if !idle.is_empty() {
        eprintln!("Spills of kernels compiled where they are never launched (not gated):\n{}\n", idle.join("\n"));
    }

    // The whole lab at a few specialisations: printed; v8 and v9 must not spill where they did not.
    let lab: Vec<(&PtxasJob, &[Usage])> = done.iter().filter(|(j, _)| j.role == Role::Lab).copied().collect();
    eprintln!("{}", table(&format!("ptxas -v of Generation::Lab {legend}:"), &labelled(&lab), &|_, _| true));
    for (j, us) in &lab {
        // v10 at every specialisation: its consumers hold 240 registers after setmaxnreg, its
        // producer 24 (ptxas reports the kernel's count at launch; the split is v10's own).
        let gated: &[&str] = if j.reweighted() {
            &["lssa_bwd_keys_wg9", "lssa_fwd_stats10", "lssa_fwd_rw10"]
        } else {
            &["lssa_fwd_wg8", "lssa_bwd_keys_wg9", "lssa_fwd_ws10"]
        };
        for u in us.iter().filter(|u| gated.contains(&u.kernel.as_str())) {
            match KNOWN_LAB_SPILLS.iter().find(|(k, what, _, _)| *k == u.kernel && *what == j.what()) {
                Some(_) if !u.spills() => failures.push(format!(
                    "{}: {} no longer spills: remove it from KNOWN_LAB_SPILLS",
                    j.what(),
                    u.kernel
                )),
                Some((_, _, stores, stack)) if u.spill_stores <= *stores && u.stack <= *stack => {}
                None if !u.spills() => {}
                _ => failures.push(format!("{}: {} spills", j.what(), u.describe())),
            }
        }
    }
    eprintln!("{} NVRTC compiles and ptxas runs in {:.1} s", jobs.len(), started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The warpgroup kernels (v8, v9, v10) as ptxas assembles them for sm_90a: no `wgmma` in a loop reads
/// a register operand that the loop overwrites after it (`ptxas::sass`; the fault that made v8 wrong
/// on the H100 and H200 at d = 64), and v10's producer names no register beyond the 24 its
/// `setmaxnreg.dec` kept. Needs ptxas and cuobjdump (the torch venv's torch and Triton).
#[test]
fn the_wgmma_register_operands_survive_their_loops() {
    let Some(ptxas) = ptxas_or_skip() else { return };
    let Some(cuobjdump) = ptxas::sass::cuobjdump(&ptxas) else {
        assert!(
            std::env::var_os("LSSA_REQUIRE_NVRTC").is_none(),
            "no cuobjdump (Triton's, beside the torch venv's ptxas)"
        );
        eprintln!("SKIPPED: no cuobjdump");
        return;
    };
    let dir = std::env::temp_dir().join(format!("lssa-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [("lssa", 64), ("lssa+rw15", 64), ("softmax", 64), ("linear", 64), ("lssa", 128), ("lssa+rw3", 128)];
    let results: Vec<Result<usize, String>> = cases
        .par_iter()
        .enumerate()
        .map(|(i, (v, hd))| {
            let what = format!("{v} d={hd} Bf16 sm_90a");
            let ptx = cuda::compile_ptx(&v.parse().unwrap(), *hd, Dtype::Bf16, "compute_90a", Generation::Lab)
                .map_err(|e| format!("{what}: {e}"))?;
            // v8's kernels (its forward, and the re-weighting's statistics and second sweep), v9's and
            // v10's (at d = 64).
            let wg: Vec<String> = entries(&ptx)
                .into_iter()
                .filter(|e| e.ends_with('8') || e.ends_with('9') || e.ends_with("10"))
                .collect();
            let (src, cubin) = (dir.join(format!("{i}.ptx")), dir.join(format!("{i}.cubin")));
            std::fs::write(&src, ptx).unwrap();
            let run = |cmd: &mut std::process::Command| {
                let out = cmd.output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                out.status
                    .success()
                    .then_some(text)
                    .ok_or_else(|| format!("{what}: {cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
            };
            run(std::process::Command::new(&ptxas)
                .arg("-arch=sm_90a")
                .arg(&src)
                .arg("-o")
                .arg(&cubin)
                .arg("-e")
                .arg(wg.join(",")))?;
            let sass = run(std::process::Command::new(&cuobjdump).arg("-sass").arg(&cubin))?;
            if *hd == 64 && !sass.contains("Function : lssa_fwd_ws10") {
                return Err(format!("{what}: no v10 forward in the SASS"));
            }
            // v10's producer warp keeps to the 24 registers it kept.
            let mut found = ptxas::sass::registers_past_dealloc(&sass);
            if *hd == 64 && sass.matches("USETMAXREG.DEALLOC.CTAPOOL 0x18").count() < 3 {
                found.push("v10's three kernels should each give registers back (setmaxnreg.dec 24)".into());
            }
            found.extend(ptxas::sass::clobbered_loop_operands(&sass));
            if !found.is_empty() {
                return Err(format!("{what}:\n  {}", found.join("\n  ")));
            }
            Ok(sass.matches("HGMMA").count())
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    let failures: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().cloned()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The check read real warpgroup code in every case (v10's at d = 64: checked above).
    assert!(results.iter().all(|r| matches!(r, Ok(n) if *n > 0)), "a case assembled no wgmma: {results:?}");
}
