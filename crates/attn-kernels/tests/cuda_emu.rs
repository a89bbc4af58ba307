//! The CUDA kernels run in the CPU emulator (`cuda::emu`, `src/cuda/emu.h`) against attn-core's f64
//! reference: every kernel version (v1 SIMT, v2, v3 tensor-core forwards; v1 and v4 backwards),
//! every fused variant, the three dtypes, head dimensions 64, 128 and 48, awkward lengths, and
//! strided inputs through the raw entry point. The emulator executes the same source NVRTC
//! compiles (with the PTX instructions replaced by their documented semantics) and the same host
//! code, so a wrong fragment layout, pipeline, mask or reduction fails here without a GPU. The last
//! test plants such bugs and checks that they are caught. Lab v10 has its own file, `emu_v10.rs`.
//!
//! Needs the host C++ compiler (`$CXX` or `c++`), which building tch already requires.

use attn_core::Variant;
use attn_kernels::cpu::STATS_PER_ROW;
use attn_kernels::cuda::{Dtype, Kernel, Options, Version, emu};
use attn_kernels::{Params, RawTensor};
use emu::Lab;
use half::{bf16, f16};
use ndarray::Array4;

mod emu_cases;
use emu_cases::{
    Case, Job, Rng, bounds, case, case_b, case_of, check_backward, check_forward, kernel_jobs, kernel_jobs_b, rel_err,
    replace_first, round, run_all,
};

const ALL_FWD: [Kernel; 5] = [
    Kernel::Lab(Version::V1),
    Kernel::Lab(Version::V2),
    Kernel::Lab(Version::V3),
    Kernel::Lab(Version::V5),
    Kernel::Lab(Version::V8),
];
const TC_FWD: [Kernel; 3] = [Kernel::Lab(Version::V3), Kernel::Lab(Version::V5), Kernel::Lab(Version::V8)];
const BOTH_BWD: [Kernel; 5] = [
    Kernel::Lab(Version::V1),
    Kernel::Lab(Version::V3),
    Kernel::Lab(Version::V5),
    Kernel::Lab(Version::V7),
    Kernel::Lab(Version::V8),
];
const TC_BWD: [Kernel; 4] =
    [Kernel::Lab(Version::V3), Kernel::Lab(Version::V5), Kernel::Lab(Version::V7), Kernel::Lab(Version::V8)];

#[test]
fn every_kernel_version_matches_the_reference() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let mut jobs = Vec::new();
    // T = 200: two 128-row blocks (v3), four 64-row blocks (v2, v4), a partial last key tile.
    for name in ["lssa", "lssa+rw15", "softmax+rw15"] {
        jobs.extend(kernel_jobs(name, 200, 64, Dtype::Bf16, &ALL_FWD, &BOTH_BWD));
    }
    jobs.extend(kernel_jobs("softmax", 130, 64, Dtype::F16, &ALL_FWD, &BOTH_BWD));
    jobs.extend(kernel_jobs("lssa+rw3", 130, 128, Dtype::F16, &TC_FWD, &TC_BWD));
    jobs.extend(kernel_jobs("lssa+rw64", 77, 64, Dtype::Bf16, &TC_FWD, &TC_BWD));
    jobs.extend(kernel_jobs("lssa+rw1", 77, 64, Dtype::F16, &TC_FWD, &TC_BWD));
    // f32 and head dimensions without tensor-core kernels run v1.
    jobs.extend(kernel_jobs("lssa+rw15", 100, 64, Dtype::F32, &[Kernel::Auto], &[Kernel::Auto]));
    jobs.extend(kernel_jobs("lssa", 131, 48, Dtype::Bf16, &[Kernel::Auto], &[Kernel::Auto]));
    // Two batch entries of two heads: every kernel's batch and head strides.
    // Every kernel also runs its threads in reverse order between barriers (a missing barrier
    // shows as a different result).
    jobs.extend(kernel_jobs_b("lssa+rw15", 2, 70, 64, Dtype::Bf16, &ALL_FWD, &BOTH_BWD, &[false, true]));
    jobs.extend(kernel_jobs_b("softmax", 1, 150, 64, Dtype::F16, &ALL_FWD, &BOTH_BWD, &[true]));
    // v8 at head dimension 128: two warpgroups per block, one m64 half each, O in two N = 64 halves.
    jobs.extend(kernel_jobs("lssa", 200, 128, Dtype::Bf16, &[Kernel::Lab(Version::V8)], &[]));
    jobs.extend(kernel_jobs_b(
        "softmax+rw15",
        2,
        70,
        128,
        Dtype::Bf16,
        &[Kernel::Lab(Version::V8)],
        &[],
        &[false, true],
    ));
    // Awkward lengths: a single row, fewer rows than a quad, one past a block.
    for t in [1, 5, 129] {
        jobs.extend(kernel_jobs("lssa+rw15", t, 64, Dtype::Bf16, &TC_FWD, &TC_BWD));
    }
    run_all(jobs);
}

#[test]
fn every_fused_variant_runs_on_tensor_cores() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let mut names: Vec<String> = Vec::new();
    for name in attn_core::variant::STAGE1_NAMES {
        let name = if name.starts_with("sigmoid-bias") { format!("{name}:t_train=64") } else { name.to_string() };
        let v: Variant = name.parse().unwrap();
        if attn_kernels::cuda::Config::new(&v, 64).is_ok() {
            names.push(name);
        }
    }
    // 23 names minus inverse, recentered, recentered-l1, relu-ln and relu-seqlen (refused by
    // `Config::new`: no CUDA kernel for the sequence-length divisor).
    assert_eq!(names.len(), 18, "stage-1 variants with a CUDA kernel: {names:?}");
    assert!(!names.iter().any(|n| n == "relu-seqlen") && names.iter().any(|n| n == "relu-rowlen"), "{names:?}");
    names.push("sigmoid-rowbias-l1+rw15".into());
    let mut jobs = Vec::new();
    for name in &names {
        jobs.extend(kernel_jobs(name, 77, 64, Dtype::Bf16, &TC_FWD, &TC_BWD));
        // f32 runs the SIMT kernels (v1), as the model's f32 CUDA tensors do.
        jobs.extend(kernel_jobs(name, 40, 64, Dtype::F32, &[Kernel::Auto], &[Kernel::Auto]));
    }
    run_all(jobs);
}

/// Host buffers in the raw layout: each row padded to `stride` elements.
struct Padded {
    bytes: Vec<u128>,
}

impl Padded {
    fn new(x: &Array4<f32>, stride: usize, dt: Dtype) -> Self {
        let (b, h, t, _) = x.dim();
        let n = b * h * t * stride;
        let mut raw = vec![0u8; n * 2 + 16];
        for ((bi, hi, ti, di), &v) in x.indexed_iter() {
            let bits = match dt {
                Dtype::F16 => f16::from_f32(v).to_bits(),
                _ => bf16::from_f32(v).to_bits(),
            };
            let at = 2 * (((bi * h + hi) * t + ti) * stride + di);
            raw[at..at + 2].copy_from_slice(&bits.to_le_bytes());
        }
        let bytes = raw.chunks(16).map(|c| u128::from_le_bytes(c.try_into().unwrap())).collect();
        Self { bytes }
    }
    /// An output buffer: every byte SENTINEL, so that writes outside the elements show.
    fn outputs(like: &Array4<f32>, stride: usize) -> Self {
        let (b, h, t, _) = like.dim();
        Self { bytes: vec![u128::from_le_bytes([SENTINEL; 16]); (b * h * t * stride * 2).div_ceil(16) + 1] }
    }
    /// The bytes outside the elements of `shape` that were written (padding columns, slack at the end).
    fn written_outside(&self, shape: (usize, usize, usize, usize), stride: usize) -> usize {
        let raw: Vec<u8> = self.bytes.iter().flat_map(|x| x.to_le_bytes()).collect();
        let d = shape.3;
        raw.iter()
            .enumerate()
            .filter(|&(at, &byte)| {
                let (row, col) = (at / 2 / stride, at / 2 % stride);
                let inside = row < shape.0 * shape.1 * shape.2 && col < d;
                !inside && byte != SENTINEL
            })
            .count()
    }
    fn raw<P>(&mut self, shape: (usize, usize, usize, usize), stride: usize) -> RawTensor<*mut P> {
        let (_, h, t, _) = shape;
        RawTensor { ptr: self.bytes.as_mut_ptr().cast(), strides: [h * t * stride, t * stride, stride] }
    }
    fn read(&self, shape: (usize, usize, usize, usize), stride: usize, dt: Dtype) -> Array4<f32> {
        let raw: Vec<u8> = self.bytes.iter().flat_map(|x| x.to_le_bytes()).collect();
        let (_, h, t, _) = shape;
        Array4::from_shape_fn(shape, |(bi, hi, ti, di)| {
            let at = 2 * (((bi * h + hi) * t + ti) * stride + di);
            let bits = u16::from_le_bytes([raw[at], raw[at + 1]]);
            match dt {
                Dtype::F16 => f16::from_bits(bits).to_f32(),
                _ => bf16::from_bits(bits).to_f32(),
            }
        })
    }
}

/// What output buffers hold before a kernel runs.
const SENTINEL: u8 = 0x7e;

/// A KV cache and grouped-query attention run the SIMT kernels (v1), the only ones that take them,
/// whatever the dtype (`Auto` routes there; a tensor-core version asked for by name is refused): `q`
/// holds the last rows of the sequence, 4 query heads share 2 key heads, against attn-core's reference
/// of the same call. Blocks also run in reverse order, as a missing barrier or a race would show.
#[test]
fn kv_cache_and_grouped_heads_run_the_simt_kernels() {
    let mut jobs: Vec<Job> = Vec::new();
    for (name, dt, t_q, t_k, d) in [
        ("lssa+rw15", Dtype::F32, 1, 70, 64),
        ("lssa", Dtype::Bf16, 13, 70, 64),
        ("softmax", Dtype::F16, 40, 40, 48),
        ("relu-l1+rw3", Dtype::F32, 5, 37, 64),
        ("lssa+rw15", Dtype::Bf16, 33, 100, 128),
    ] {
        let mut rng = Rng(0x9e37_79b9 ^ (t_q * 1000 + t_k) as u64);
        let scale = if name.starts_with("softmax") { 0.5 } else { 0.8 };
        let (q, k) = (rng.array((2, 4, t_q, d), scale, dt), rng.array((2, 2, t_k, d), scale, dt));
        let (vv, g) = (rng.array((2, 2, t_k, d), 1.0, dt), rng.array((2, 4, t_q, d), 1.0, dt));
        let c = std::sync::Arc::new(case_of(name.parse().unwrap(), dt, q, k, vv, g));
        for (kernel, reverse) in [(Kernel::Auto, false), (Kernel::Lab(Version::V1), true)] {
            let label = format!("{name} {dt:?} T={t_q} of {t_k} d={d} {} reverse={reverse}", kernel.name());
            let (c1, c2) = (c.clone(), c.clone());
            jobs.push((format!("{label} forward"), Box::new(move || check_forward(&c1, kernel, reverse))));
            jobs.push((format!("{label} backward"), Box::new(move || check_backward(&c2, kernel, reverse))));
        }
        if dt != Dtype::F32 && d == 64 {
            let c3 = c.clone();
            jobs.push((
                format!("{name} {dt:?}: v3 refused"),
                Box::new(move || match check_forward(&c3, Kernel::Lab(Version::V3), false) {
                    Err(e) if e.contains("v1 only") => Ok(()),
                    other => Err(format!("expected v3 to be refused by name, got {other:?}")),
                }),
            ));
        }
    }
    run_all(jobs);
}

/// Forward and backward through the raw entry points on rows padded to `stride` elements; fails if
/// a kernel wrote outside the elements of an output (into the padding or past the end).
fn raw_run(c: &Case, stride: usize, kernel: Kernel) -> attn_kernels::Result<[Array4<f32>; 4]> {
    let shape = c.q.dim();
    let (mut q, mut k, mut v, mut g) = (
        Padded::new(&c.q, stride, c.dt),
        Padded::new(&c.k, stride, c.dt),
        Padded::new(&c.vv, stride, c.dt),
        Padded::new(&c.g, stride, c.dt),
    );
    let (mut o, mut dq, mut dk, mut dv) = (
        Padded::outputs(&c.q, stride),
        Padded::outputs(&c.q, stride),
        Padded::outputs(&c.q, stride),
        Padded::outputs(&c.q, stride),
    );
    let mut stats = vec![0f32; shape.0 * shape.1 * shape.2 * STATS_PER_ROW];
    let p = Params {
        batch: shape.0,
        heads: shape.1,
        kv_heads: shape.1,
        seq_len: shape.2,
        kv_len: shape.2,
        head_dim: shape.3,
        q: q.raw::<std::ffi::c_void>(shape, stride).as_const(),
        k: k.raw::<std::ffi::c_void>(shape, stride).as_const(),
        v: v.raw::<std::ffi::c_void>(shape, stride).as_const(),
        o: o.raw(shape, stride),
        stats: stats.as_mut_ptr(),
        rw_aux: std::ptr::null_mut(),
        d_out: g.raw::<std::ffi::c_void>(shape, stride).as_const(),
        dq: dq.raw(shape, stride),
        dk: dk.raw(shape, stride),
        dv: dv.raw(shape, stride),
        dtype: c.dt,
    };
    // SAFETY: every pointer is a live host buffer of the shape and strides given, in `c.dt`.
    unsafe {
        emu::forward_raw(&c.v, &p, c.dt, kernel)?;
        emu::backward_raw(&c.v, &p, c.dt, kernel)?;
    }
    for (name, x) in [("o", &o), ("dq", &dq), ("dk", &dk), ("dv", &dv)] {
        let n = x.written_outside(shape, stride);
        assert_eq!(n, 0, "{kernel:?}, stride {stride}: {n} bytes of {name} written outside its elements");
    }
    Ok([
        o.read(shape, stride, c.dt),
        dq.read(shape, stride, c.dt),
        dk.read(shape, stride, c.dt),
        dv.read(shape, stride, c.dt),
    ])
}

#[test]
fn strided_inputs_get_the_kernel_that_can_read_them() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let c = case_b("lssa+rw15", 2, 100, 64, Dtype::Bf16, 7);
    let (bo, bg) = bounds(&c);
    let check = |out: [Array4<f32>; 4], what: &str| {
        let e = [
            rel_err(&out[0], &c.o),
            rel_err(&out[1], &c.grads.dq),
            rel_err(&out[2], &c.grads.dk),
            rel_err(&out[3], &c.grads.dv),
        ];
        assert!(e[0] <= bo && e[1..].iter().all(|&x| x <= bg), "{what}: errors (o, dq, dk, dv) {e:?}");
    };
    // 16-byte aligned rows: v3 and v4.
    check(raw_run(&c, 72, Kernel::Lab(Version::V3)).unwrap(), "stride 72, v3 + v4");
    check(raw_run(&c, 72, Kernel::Lab(Version::V5)).unwrap(), "stride 72, v5 + v6");
    check(raw_run(&c, 72, Kernel::Lab(Version::V7)).unwrap(), "stride 72, v5 + v7");
    check(raw_run(&c, 72, Kernel::Lab(Version::V8)).unwrap(), "stride 72, v8 + v9");
    // Rows 4-byte aligned only: Auto runs v2 and the v1 backward; v3 is refused with a reason.
    check(raw_run(&c, 66, Kernel::Auto).unwrap(), "stride 66, auto");
    for k in [Kernel::Lab(Version::V3), Kernel::Lab(Version::V5), Kernel::Lab(Version::V8)] {
        let err = raw_run(&c, 66, k).unwrap_err().to_string();
        assert!(err.contains("no tensor-core forward"), "{err}");
    }
    // Odd strides: only the SIMT kernels can read them.
    check(raw_run(&c, 65, Kernel::Auto).unwrap(), "stride 65, auto");
    let err = raw_run(&c, 65, Kernel::Lab(Version::V2)).unwrap_err().to_string();
    assert!(err.contains("v2"), "{err}");
}

/// A source edit for `Lab::edit`: the first `from` becomes `to` (which must be there).
#[test]
fn the_emulator_catches_planted_kernel_bugs() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let c = case("lssa", 200, 64, Dtype::Bf16, 11);
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V3) };
    let run = |edit: &dyn Fn(String) -> String| {
        emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { edit: Some(edit), ..Lab::default() })
    };
    // The unedited source passes: what fails below fails because of the edit.
    assert!(rel_err(&run(&|s| s).unwrap(), &c.o) < bounds(&c).0);
    let planted: [(&str, &str, &str, Option<&str>); 4] = [
        // v3 multiplies the current K/V tile without waiting for its copy.
        ("cp_wait<1>();\n            } else {", "cp_wait<2>();\n            } else {", "pipeline wait", None),
        // V's fragments loaded without the transpose.
        ("ldsm4t(bf, Vs +", "ldsm4(bf, Vs +", "ldmatrix without .trans", None),
        // Half of a warp skips a full-mask shuffle (the bug that hung the SIMT kernels at d = 48).
        ("    s = warp_sum(s);", "    if (lane < 16) s = warp_sum(s);", "divergent shuffle", Some("deadlock")),
        // Shared-memory rows padded by 8 bytes instead of 16.
        ("#define KP3 (HD + 8)", "#define KP3 (HD + 4)", "misaligned rows", Some("16-byte aligned")),
    ];
    for (from, to, what, message) in planted {
        match (run(&replace_first(from, to)), message) {
            (Ok(o), None) => {
                let e = rel_err(&o, &c.o);
                assert!(e > 0.05, "{what}: planted bug not caught (error {e:.2e})");
            }
            (Err(e), Some(m)) => assert!(e.to_string().contains(m), "{what}: {e}"),
            (r, _) => panic!("{what}: unexpected outcome {:?}", r.map(|o| rel_err(&o, &c.o))),
        }
    }
    // v5 with the keys' inverse norms copied in the next tile's copy group: read before they land.
    let edit = replace_first(
        "load_ink_async(inkS[stage], p, bh, kt * BK5, BK5);\n            cp_commit();",
        "cp_commit();\n            load_ink_async(inkS[stage], p, bh, kt * BK5, BK5);",
    );
    let opts5 = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V5) };
    let o = emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts5, &Lab { edit: Some(&edit), ..Lab::default() }).unwrap();
    let e = rel_err(&o, &c.o);
    assert!(e > 0.05, "v5 reading the norms before their copy lands not caught (error {e:.2e})");
    // The v6 rows kernel leaving no records: its keys kernel reads the workspace unwritten (NaN in
    // the emulator, garbage on a GPU).
    let edit = replace_first("((RowK6*)p.rowk)[(long long)bh2 * p.T + rows[q]] = out;", "");
    let lab = Lab { edit: Some(&edit), ..Lab::default() };
    let gr = emu::backward_lab(&c.v, &c.q, &c.k, &c.vv, &c.g, &opts5, &lab).unwrap();
    let e = rel_err(&gr.dk, &c.grads.dk);
    assert!(e.is_nan() || e > 0.05, "v6 keys kernel without the rows' records not caught (dk error {e:.2e})");
    // The v6 backward with the sigmoid of negative scores taken as that of positive ones
    // (2^(max(y, 0) - softplus2(y)) = sigmoid(|x|)).
    let edit = replace_first("gp = ex2_fast(y - sp2);", "gp = ex2_fast(fmaxf(y, 0.f) - sp2);");
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V5) };
    let lab = Lab { edit: Some(&edit), ..Lab::default() };
    let gr = emu::backward_lab(&c.v, &c.q, &c.k, &c.vv, &c.g, &opts, &lab).unwrap();
    let e = rel_err(&gr.dq, &c.grads.dq);
    assert!(e > 0.05, "wrong sigmoid in the v6 backward not caught (dq error {e:.2e})");
    // v9 (wgmma backward): dS read as a K-major A operand.
    let edit = replace_first("wgmma64_ss<1, 1>(&dqt", "wgmma64_ss<0, 1>(&dqt");
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V8) };
    let lab = Lab { edit: Some(&edit), ..Lab::default() };
    let gr = emu::backward_lab(&c.v, &c.q, &c.k, &c.vv, &c.g, &opts, &lab).unwrap();
    let e = rel_err(&gr.dq, &c.grads.dq);
    assert!(e > 0.05, "dS as K-major in the v9 backward not caught (dq error {e:.2e})");
    assert!(rel_err(&gr.dk, &c.grads.dk) < bounds(&c).1, "v9: dk does not depend on the dq product");
    // v8 (wgmma): V read with the descriptor's two offsets swapped, or the scores used before
    // the wgmma that computes them is waited for.
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V8) };
    let planted: [(&str, &str, &str); 2] = [
        (
            "wg_desc(rows + kb * 16 * HD + nh * 512, HD * 16, 128)",
            "wg_desc(rows + kb * 16 * HD + nh * 512, 128, HD * 16)",
            "V's descriptor",
        ),
        ("                wg_wait<1>(); // S0\n", "", "wgmma wait"),
    ];
    for (from, to, what) in planted {
        let edit = replace_first(from, to);
        let lab = Lab { edit: Some(&edit), ..Lab::default() };
        match emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &lab) {
            Ok(o) => {
                let e = rel_err(&o, &c.o);
                assert!(e.is_nan() || e > 0.05, "v8 {what}: planted bug not caught (error {e:.2e})");
            }
            // Reported: the swapped offsets reach past the shared memory at the last tile.
            Err(e) => assert!(e.to_string().contains("wgmma"), "v8 {what}: {e}"),
        }
    }
    // v8 without the proxy fence between its cp.async tiles and the wgmma that reads them: the
    // result would be right in any emulation of values alone; the emulator reports the missing fence.
    let edit = replace_first(
        "        cp_wait<0>();\n        fence_async_smem();\n        __syncthreads();\n        if (has_next)",
        "        cp_wait<0>();\n        __syncthreads();\n        if (has_next)",
    );
    let lab = Lab { edit: Some(&edit), ..Lab::default() };
    let err = emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &lab).unwrap_err().to_string();
    assert!(err.contains("fence.proxy.async"), "v8 without its proxy fence: {err}");
    // v9 without the fence between its dS stores and the dq wgmma that reads them.
    let edit = replace_first(
        "            fence_async_smem();\n            __syncthreads();\n            // dq (queries x HD)",
        "            __syncthreads();\n            // dq (queries x HD)",
    );
    let lab = Lab { edit: Some(&edit), ..Lab::default() };
    let err = emu::backward_lab(&c.v, &c.q, &c.k, &c.vv, &c.g, &opts, &lab).unwrap_err().to_string();
    assert!(err.contains("fence.proxy.async"), "v9 without its dS proxy fence: {err}");
}

/// The PTX ISA's timing rules for asynchronous `wgmma` (LAB.md, "What the emulator checks"): a
/// planted break of each, in v8, is reported by name, where computing every wgmma at its wait would
/// have given a plausible (or even the right) result. LSSA, bf16, T = 200, d = 64.
#[test]
fn the_emulator_enforces_the_wgmma_timing_rules() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let c = case("lssa", 200, 64, Dtype::Bf16, 23);
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V8) };
    let run = |edit: &dyn Fn(String) -> String| {
        emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { edit: Some(edit), ..Lab::default() })
    };
    assert!(rel_err(&run(&|s| s).unwrap(), &c.o) < bounds(&c).0, "v8 as written passes every rule");
    const S_ISSUED: &str = "wg_rows_t_ss(s[mt], Qs + ((tile_row(mt) - i0) & ~63) * HD, Ks);\n                    wg_commit();\n                }\n";
    let planted: [(&str, String, &str, &str); 7] = [
        // No wgmma.fence before a thread's first wgmma (the scores' products of the first tile).
        (
            "wg_keep(s[mt]);\n                wg_fence();\n#pragma unroll\n                for (int mt = 0; mt < MT; mt++) {",
            "wg_keep(s[mt]);\n#pragma unroll\n                for (int mt = 0; mt < MT; mt++) {".into(),
            "no fence before the first wgmma",
            "with no wgmma.fence before it",
        ),
        // `.sync.aligned`: half the warpgroup gives Q's descriptor 16 bytes further on.
        (
            "wg_desc(arows + kk * 128, 128, HD * 16)",
            "wg_desc(arows + kk * 128 + (threadIdx.x & 64 ? 8 : 0), 128, HD * 16)".into(),
            "descriptors that differ within the warpgroup",
            "different shapes, flags or descriptors",
        ),
        // (a) O's second half written while its P V product is in flight.
        (
            "if (want_v) pv(1);",
            "if (want_v) { pv(1); oacc[1][0][0] = 0.f; }".into(),
            "in-flight accumulators written",
            "accumulator registers of an in-flight wgmma.mma_async were written",
        ),
        // (b) P packed into A's registers after the fence instead of before it.
        (
            "acc_to_a(pa, s[mt]);\n                    wg_fence();",
            "wg_fence();\n                    acc_to_a(pa, s[mt]);".into(),
            "A written after the fence",
            "reads A fragment registers written since the thread's last wgmma.fence",
        ),
        // (b) O rescaled between the fence and the P V product that adds to it (an online
        // softmax's rescale in the wrong place).
        (
            "wg_fence();\n                    wg_acc_rows(oacc[mt], pa, Vs);",
            "wg_fence();\n                    oacc[mt][0][0] *= 0.5f;\n                    wg_acc_rows(oacc[mt], pa, Vs);"
                .into(),
            "accumulators rescaled after the fence",
            "reads accumulator registers written since the thread's last wgmma.fence",
        ),
        // (c) A store into the K tile that the in-flight Q K^T reads.
        (
            S_ISSUED,
            format!("{S_ISSUED}                if (threadIdx.x == 0) ((u16*)Ks)[0] ^= 0x100;\n"),
            "store into an in-flight operand",
            "shared memory that an in-flight wgmma.mma_async reads was written",
        ),
        // (c) The next tile's copy landing in the stage that the in-flight Q K^T reads.
        (
            S_ISSUED,
            format!("{S_ISSUED}                issue(kt + 1 < nkt ? kt + 1 : kt, stage);\n                cp_wait<0>();\n"),
            "cp.async landing in an in-flight operand",
            "shared memory that an in-flight wgmma.mma_async reads was written",
        ),
    ];
    for (from, to, what, message) in planted {
        let edit = move |s: String| {
            assert!(s.contains(from), "the source no longer contains {from:?}");
            s.replacen(from, &to, 1)
        };
        match run(&edit) {
            Err(e) => assert!(e.to_string().contains(message), "{what}: {e}"),
            Ok(o) => panic!("{what}: not reported (error {:.2e})", rel_err(&o, &c.o)),
        }
    }
    // (a) The scores used before the wait that covers their product: the element-wise step reads the
    // poison and writes the scores' activations back over it, which the wait reports.
    let err = run(&replace_first("                wg_wait<1>(); // S0\n", "")).unwrap_err().to_string();
    assert!(err.contains("accumulator registers of an in-flight"), "scores read before their wait: {err}");
}

/// Inputs where re-weighting is at its edges (T = 200, d = 64, one head): queries along one
/// direction u, keys 0..63 along u and the rest along -u, so rows below 64 are exactly uniform
/// (u_ij = 0 up to rounding: umax is a rounding residue, or 0 and the row falls back), later rows
/// put their mass on the first key tile (the others can be skipped), and ten zero queries in the
/// second 128-row block give uniform rows that fall back and need every tile.
fn degenerate(name: &str, dt: Dtype) -> Case {
    let (t, d) = (200, 64);
    let mut rng = Rng(13);
    let u: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
    let zero = |i: usize| (170..180).contains(&i);
    let q = Array4::from_shape_fn((1, 1, t, d), |(_, _, i, c)| if zero(i) { 0.0 } else { round(dt, u[c]) });
    let k = Array4::from_shape_fn((1, 1, t, d), |(_, _, j, c)| round(dt, if j < 64 { u[c] } else { -u[c] }));
    let (vv, g) = (rng.array((1, 1, t, d), 1.0, dt), rng.array((1, 1, t, d), 1.0, dt));
    case_of(name.parse().unwrap(), dt, q, k, vv, g)
}

/// The forward of every kernel on `degenerate` inputs. This found v5's first version folding
/// 1 / umax into its per-row constants, which cancels catastrophically where umax is a rounding
/// residue and turned the uniform rows into NaN (the emulator said so before any GPU did). The
/// backward is not checked here: its exact value is unbounded on these rows (it scales with
/// 1 / umax, and with 1 / |q| at the zero queries), so kernels and reference rightly disagree.
#[test]
fn degenerate_rows_on_every_forward_kernel() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let mut jobs: Vec<Job> = Vec::new();
    for name in ["lssa", "lssa+rw15", "lssa+rw1", "softmax+rw15"] {
        let c = std::sync::Arc::new(degenerate(name, Dtype::Bf16));
        for k in ALL_FWD.into_iter().chain([Kernel::Lab(Version::V10)]) {
            let c = c.clone();
            jobs.push((format!("degenerate {name} forward {k:?}"), Box::new(move || check_forward(&c, k, false))));
        }
    }
    run_all(jobs);
}

#[test]
fn reversed_thread_order_finds_a_missing_barrier() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    // v5's second sweep: thread 0 resets the block's skipping state, then every thread updates it
    // (a row that falls back to stage 1 turns skipping off). Without the barrier between the two,
    // the result depends on which threads run first; on `degenerate` inputs it matters.
    let c = degenerate("lssa+rw15", Dtype::Bf16);
    let from = "                anyFallback = 0;\n            }\n            __syncthreads();";
    let to = "                anyFallback = 0;\n            }";
    let edit = move |s: String| {
        assert_eq!(s.matches(from).count(), 3, "v2, v3 and v5 each reset the threshold once");
        // The last occurrence is v5's (v5_fwd.cu follows v2_fwd.cu and v3_fwd.cu).
        let at = s.rfind(from).unwrap();
        format!("{}{}{}", &s[..at], to, &s[at + from.len()..])
    };
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V5) };
    let err = |reverse: bool| {
        let o = emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { edit: Some(&edit), reverse, ..Lab::default() })
            .unwrap();
        rel_err(&o, &c.o)
    };
    // Thread 0 happens to run first in the forward order, so the race is invisible there.
    assert!(err(false) < bounds(&c).0, "forward order: {:.2e}", err(false));
    let e = err(true);
    assert!(e.is_nan() || e >= 0.05, "the missing barrier was not caught in reverse order (error {e:.2e})");
}

/// The work counts of the forward and of the backward alone with `kernel` on `c`.
fn profile_of(c: &Case, kernel: Kernel) -> (emu::Profile, emu::Profile) {
    let opts = Options { dtype: c.dt, kernel };
    let (f, fb) = (std::cell::Cell::new(emu::Profile::default()), std::cell::Cell::new(emu::Profile::default()));
    emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { profile: Some(&f), ..Lab::default() }).unwrap();
    emu::backward_lab(&c.v, &c.q, &c.k, &c.vv, &c.g, &opts, &Lab { profile: Some(&fb), ..Lab::default() }).unwrap();
    let (f, fb) = (f.get(), fb.get()); // backward_lab runs the forward first
    let b = emu::Profile {
        mma: fb.mma - f.mma,
        ldmatrix: fb.ldmatrix - f.ldmatrix,
        special: fb.special - f.special,
        ..emu::Profile::default()
    };
    (f, b)
}

/// The work counts behind the second generation's predictions, as a regression guard: they are
/// deterministic (the emulator counts instructions, it does not time them), so a change that
/// quietly brings back a second special-function op per score, or v3's shared-memory traffic,
/// fails here. LSSA, bf16, one head of T = 512, d = 64.
#[test]
fn the_second_generation_does_less_work() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let c = case_b("lssa", 1, 512, 64, Dtype::Bf16, 17);
    let profile = |kernel: Kernel| profile_of(&c, kernel);
    let ((f3, b4), (f5, b6), (_, b7), (f8, b9)) = (
        profile(Kernel::Lab(Version::V3)),
        profile(Kernel::Lab(Version::V5)),
        profile(Kernel::Lab(Version::V7)),
        profile(Kernel::Lab(Version::V8)),
    );
    // Scores the forward computes: 128-row blocks times 64-key tiles up to the diagonal, two heads.
    let tiles: u64 = (0..512 / 128).map(|qb| ((qb * 128 + 128 + 63) / 64).min(512 / 64) as u64).sum();
    let scores = (tiles * 128 * 64 * 2) as f64;
    // Entries one backward sweep computes: 64 x 64 tile pairs up to the diagonal, two heads.
    let entries = (8 * 9 / 2 * 64 * 64 * 2) as f64;
    let per = |n: u64, d: f64| n as f64 / d;
    // Besides its scores the forward takes one reciprocal per row in each of the row's 4 quad
    // threads (rcp_fast of the row sum: 1/512 per score and thread at this T, shrinking as 1/T).
    let row_rcp = (4 * 512 * 2) as f64 / scores;
    assert_eq!(f5.mma, f3.mma, "v5 does v3's tensor-core work");
    assert!(per(f5.ldmatrix, 1.0) <= 0.55 * f3.ldmatrix as f64, "ldmatrix: v3 {} v5 {}", f3.ldmatrix, f5.ldmatrix);
    let f5_per_score = per(f5.special, scores) - row_rcp;
    assert!(f5_per_score <= 1.02, "v5: {f5_per_score:.3} special-function ops per score besides the rows'");
    assert!(per(f3.special, scores) >= 1.3, "v3: {:.3} special-function ops per score", per(f3.special, scores));
    assert!(per(b6.special, 2.0 * entries) <= 1.02 * 2.0, "v6: {:.3} per entry", per(b6.special, 2.0 * entries));
    assert!(b4.special > b6.special, "v4 {} v6 {}", b4.special, b6.special);
    assert!(per(b7.mma, b6.mma as f64) <= 5.0 / 7.0 + 0.01, "mma: v6 {} v7 {}", b6.mma, b7.mma);
    assert!(per(b7.special, b6.special as f64) <= 0.52, "special: v6 {} v7 {}", b6.special, b7.special);
    // v8: v5's work, with Q, K and V read by the tensor cores from shared memory (no ldmatrix).
    assert_eq!(f8.mma, f5.mma, "v8 does v5's tensor-core work");
    assert_eq!(f8.special, f5.special, "v8 does v5's special-function work");
    assert_eq!(f8.ldmatrix, 0, "v8 reads Q from shared memory too");
    // v9: v7's work, with ldmatrix only for the keys' K and V fragments (2 x 4 per warp and tile pair).
    assert_eq!((b9.mma, b9.special), (b7.mma, b7.special), "v9 does v7's tensor-core and special-function work");
    assert_eq!(b9.ldmatrix, 2 * 36 * 4 * 2 * 4, "v9: 2 heads x 36 tile pairs x 4 warps x 2 x 4");
    // With re-weighting v9's row statistics sweep E_i on wgmma too: ldmatrix only for its Q and G
    // fragments, once per 64-row block (2 heads x 8 blocks x 4 warps x 2 x 4).
    let r = case_b("lssa+rw15", 1, 512, 64, Dtype::Bf16, 17);
    let ((_, r7), (_, r9)) = (profile_of(&r, Kernel::Lab(Version::V7)), profile_of(&r, Kernel::Lab(Version::V8)));
    assert_eq!((r9.mma, r9.special), (r7.mma, r7.special), "v9 does v7's work with re-weighting");
    assert_eq!(
        r9.ldmatrix,
        b9.ldmatrix + 2 * 8 * 4 * 2 * 4,
        "v9 with re-weighting: v7 {} v9 {}",
        r7.ldmatrix,
        r9.ldmatrix
    );
}

/// Special-function (MUFU: ex2, lg2, rcp) operations per score, by variant and kernel version,
/// from the emulator's counts (LAB.md, "Special-function cost", reads this table). Forward: per
/// score the kernel computes (its 128-row blocks times 64-key tiles up to the diagonal, masked
/// entries of diagonal tiles included) and per sweep (re-weighting has two); backward: all its
/// kernels together, per entry of its 64 x 64 tile pairs up to the diagonal. Asserts what LAB.md's
/// reading rests on: v5 pays one MUFU per score for LSSA (as softmax does per unmasked score), v3
/// more, and v7 half of v6's backward. bf16, one head of T = 256, d = 64.
#[test]
fn special_function_ops_per_score() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let t = 256usize;
    let tiles: usize = (0..t / 128).map(|qb| ((qb * 128 + 128).div_ceil(64)).min(t / 64)).sum();
    let scores = (tiles * 128 * 64 * 2) as f64; // two heads
    let entries = ((t / 64) * (t / 64 + 1) / 2 * 64 * 64 * 2) as f64;
    let mut table = String::from("variant      version  fwd/score  bwd/entry\n");
    let mut got = std::collections::BTreeMap::new();
    for name in ["softmax", "lssa", "lssa+rw15"] {
        let c = case_b(name, 1, t, 64, Dtype::Bf16, 29);
        let sweeps = if name.contains("+rw") { 2.0 } else { 1.0 };
        for (version, label) in [(Version::V3, "v3+v4"), (Version::V5, "v5+v6"), (Version::V7, "v5+v7")] {
            let (f, b) = profile_of(&c, Kernel::Lab(version));
            let (fs, be) = (f.special as f64 / (scores * sweeps), b.special as f64 / entries);
            table += &format!("{name:<12} {label:<8} {fs:>9.3} {be:>10.3}\n");
            got.insert((name, label), (fs, be));
        }
    }
    eprintln!("{table}");
    let ((v3, _), (v5, v6), (_, v7)) = (got[&("lssa", "v3+v4")], got[&("lssa", "v5+v6")], got[&("lssa", "v5+v7")]);
    // The forward's one reciprocal per row in each of its 4 quad threads (rcp_fast of the row sum)
    // is not a per-score cost: 0.02 per score at this T, shrinking as 1/T.
    let row_rcp = (4 * t * 2) as f64 / scores;
    assert!(
        (1.0..=1.03).contains(&(v5 - row_rcp)),
        "lssa: v5 forward {v5:.3} MUFU per score, {row_rcp:.3} of them the rows'"
    );
    assert!(v3 >= 1.3, "v3 pays a second MUFU per score for LSSA's softplus: {v3:.3}");
    // The backward's rows kernel builds each row's constants (row_k6: one rcp_fast, the l1 norm's,
    // without re-weighting) in each of the row's 4 quad threads and once more for its record.
    let bwd_row_rcp = (5 * t * 2) as f64 / entries;
    let (v6e, v7e) = (v6 - bwd_row_rcp, v7 - bwd_row_rcp);
    assert!(
        (2.0..=2.05).contains(&v7e) && (v6e / v7e - 2.0).abs() < 0.05,
        "lssa backward per entry besides the rows' {bwd_row_rcp:.3}: v6 {v6e:.3}, v7 {v7e:.3}"
    );
    // Softmax computes no exp for masked entries: per causal score it is the same one MUFU.
    let causal = (t * (t + 1) / 2 * 2) as f64;
    let soft = (got[&("softmax", "v5+v6")].0 * scores - row_rcp * scores) / causal;
    assert!((1.0..=1.03).contains(&soft), "softmax: v5 forward {soft:.3} MUFU per causal score besides the rows'");
}

/// The probe that a first GPU run uses to check v8 and v9's operand layouts tells them from their
/// likeliest misreadings in the emulator (whose wgmma follows the PTX ISA's canonical layouts).
#[test]
fn the_wgmma_probe_tells_the_layouts_apart() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let errs = emu::wgmma_probe().unwrap();
    assert_eq!(errs.len(), attn_kernels::cuda::WGMMA_PROBE_MODES.len());
    for ((what, assumed), e) in attn_kernels::cuda::WGMMA_PROBE_MODES.iter().zip(errs) {
        if *assumed {
            assert!(e < 1e-5, "{what}: error {e:.2e}");
        } else {
            assert!(e > 0.1, "{what}: a misreading matches (error {e:.2e})");
        }
    }
}

/// The probe that a first GPU run uses to check v10's TMA and swizzled-descriptor layouts tells
/// them from their likeliest misreadings in the emulator (whose TMA and wgmma follow the PTX ISA as
/// read in LAB.md).
#[test]
fn the_tma_probe_tells_the_layouts_apart() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let errs = emu::tma_probe().unwrap();
    assert_eq!(errs.len(), attn_kernels::cuda::TMA_PROBE_MODES.len());
    for ((what, assumed), e) in attn_kernels::cuda::TMA_PROBE_MODES.iter().zip(errs) {
        if *assumed {
            assert!(e < 1e-5, "{what}: error {e:.2e}");
        } else {
            assert!(e > 0.1, "{what}: a misreading matches (error {e:.2e})");
        }
    }
}
