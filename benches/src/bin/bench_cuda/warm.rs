//! `warm`: compiles the kernel modules that `check` (for `--kernels`), the Python suite's CUDA tests
//! (`--python-suite FILE`, under `Kernel::Auto`) and a model of `--variants` at `--head-dims` (its
//! bf16 training and f32 evaluation, under `Auto`) load, on `--compile-threads` threads, into the PTX
//! cache (`$LSSA_PTX_CACHE`; `attn_kernels::cuda`'s `ptx_cache`), so that those runs find each module
//! there instead of compiling it at first use, one at a time (0.9-2.2 s per `Auto` module, much more
//! for the lab's; on 2026-11-27 `check`'s 48 modules took 198 s on 16 threads of the GPU machine).
//!
//! With `--arch` (`compute_90a` for an H100 or H200) it needs no GPU, only NVRTC: the cache can be
//! filled on the machine that builds the binaries and carried to the GPU machine
//! (`benches/gpu-session.sh`'s header), where the same source, architecture, options and NVRTC
//! version hash to the same files. Without `--arch` it runs on the GPU and also loads each module
//! into the driver, whose own cache then holds its machine code.

use anyhow::{Context as _, Result, bail};
use attn_core::Variant;
use attn_kernels::cuda::{self, Dtype, Kernel};

use crate::check;
use crate::cli::Args;
use crate::transcript::say;

/// The CUDA cases of the Python suite's `test_cuda.py`: the variants of its `CUDA_FUSED` list and the
/// head dimensions of its `SHAPES` list of `(T, d)` pairs, read from the file's text (the tests run
/// every one in every dtype, under the session's kernel request).
pub(crate) fn python_cases(text: &str) -> Result<(Vec<String>, Vec<usize>)> {
    let list = |name: &str| -> Result<&str> {
        let start = text.find(&format!("\n{name} = [")).with_context(|| format!("no `{name} = [` list"))?;
        let body = &text[start + name.len() + 5..];
        // The list ends at the first `]` that closes it (a `(T, d)` pair holds none).
        let end = body.find(']').with_context(|| format!("`{name}` is not closed"))?;
        Ok(&body[..end])
    };
    let variants: Vec<String> = list("CUDA_FUSED")?.split('"').skip(1).step_by(2).map(str::to_string).collect();
    let mut dims = Vec::new();
    for pair in list("SHAPES")?.split('(').skip(1) {
        let d = pair.split(')').next().and_then(|p| p.split(',').nth(1)).map(str::trim);
        let d: usize = d.with_context(|| format!("`SHAPES`: cannot read `({pair}`"))?.parse()?;
        if !dims.contains(&d) {
            dims.push(d);
        }
    }
    if variants.is_empty() || dims.is_empty() {
        bail!("the suite lists no CUDA variants ({variants:?}) or head dimensions ({dims:?})");
    }
    Ok((variants, dims))
}

/// Every module to compile: `check`'s for its requests, then the Python suite's and `--variants`'
/// under `Auto`, each (variant, head dimension, dtype, generation) once.
fn jobs(args: &Args) -> Result<Vec<(Variant, usize, Dtype, Kernel)>> {
    let mut all: Vec<(Variant, usize, Dtype, Kernel)> = Vec::new();
    if !args.kernels.is_empty() {
        for (v, _, d, dt) in check::cases(args)? {
            all.extend(check::requests(args, d, dt).into_iter().map(|k| (v.clone(), d, dt, k)));
        }
    }
    let mut auto: Vec<(Vec<String>, Vec<usize>)> = Vec::new();
    if let Some(file) = &args.python_suite {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        auto.push(python_cases(&text).with_context(|| format!("{}", file.display()))?);
    }
    if !args.variants.is_empty() {
        let dims = args.head_dims.iter().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>()?;
        auto.push((args.variants.clone(), dims));
    }
    for (variants, dims) in auto {
        for name in variants {
            let v: Variant = name.parse()?;
            for &d in &dims {
                for dt in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                    all.push((v.clone(), d, dt, Kernel::Auto));
                }
            }
        }
    }
    let mut seen = Vec::new();
    all.retain(|(v, d, dt, k)| {
        let key = (v.to_string(), *d, *dt, k.generation());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    Ok(all)
}

/// The architecture of `--arch`, as the kernels name it.
fn arch(name: &str) -> Result<&'static str> {
    cuda::ARCHES.iter().copied().find(|a| *a == name).with_context(|| {
        format!("--arch {name}: expected one of {} (compute_90a for an H100 or H200)", cuda::ARCHES.join(", "))
    })
}

/// Compiles every module of [`jobs`] into the PTX cache; fails when one does not compile.
pub(crate) fn warm(args: &Args) -> Result<()> {
    let arch = args.arch.as_deref().map(arch).transpose()?;
    let todo = jobs(args)?;
    if todo.is_empty() {
        bail!("nothing to compile: give --kernels (check's modules), --python-suite FILE and/or --variants");
    }
    let cache = std::env::var("LSSA_PTX_CACHE").unwrap_or_else(|_| "the default (~/.cache/lssa/ptx)".into());
    let threads = args.compile_threads.clamp(1, todo.len());
    say!(
        "warm: {} modules for {} on {threads} threads into {cache}",
        todo.len(),
        arch.map_or("this GPU".to_string(), |a| format!("{a} (NVRTC only, no GPU)"))
    );
    let started = std::time::Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some((v, d, dt, k)) = todo.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    let done = match arch {
                        Some(a) => cuda::compile_ptx(v, *d, *dt, a, k.generation()).map(drop),
                        // Loads the module into the driver too.
                        None => cuda::versions(v, *d, *dt, *k).map(drop),
                    };
                    if let Err(e) = done {
                        failed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("{v} d={d} {dt:?} {}: {e}", k.name()));
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    say!("warm: {} modules in {:.1} s, {} failed", todo.len(), started.elapsed().as_secs_f64(), failed.len());
    for f in &failed {
        say!("  {f}");
    }
    if !failed.is_empty() {
        bail!("{} modules did not compile", failed.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Python suite's own file, read as `warm` reads it: every variant it tests on CUDA and every
    /// head dimension of its shapes, so the cache it fills is the one the tests load.
    #[test]
    fn warm_reads_the_python_suites_cuda_cases() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/lssa-py/tests/test_cuda.py");
        let text = std::fs::read_to_string(&path).unwrap();
        let (variants, dims) = python_cases(&text).unwrap();
        // Each is a variant name the kernels compile, and the file's test parametrises over the lists.
        for v in &variants {
            let v: Variant = v.parse().unwrap();
            assert!(cuda::Config::new(&v, 64).is_ok(), "{v} has no CUDA kernel");
        }
        assert!(variants.iter().any(|v| v == "lssa+rw15") && variants.iter().any(|v| v == "softmax"), "{variants:?}");
        let mut sorted = dims.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [48, 64, 128]);
        assert!(text.contains("@pytest.mark.parametrize(\"name\", CUDA_FUSED)"));
        assert!(text.contains("@pytest.mark.parametrize(\"t,d\", SHAPES)"));
        // A file without the lists is refused, naming what is missing.
        let err = python_cases("x = 1\n").unwrap_err();
        assert!(format!("{err:#}").contains("CUDA_FUSED"), "{err:#}");
    }
}
