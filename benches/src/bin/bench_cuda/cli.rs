//! The command line of bench-cuda.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "CUDA kernel lab: correctness against attn-core, speed against libtorch SDPA")]
pub(crate) struct Args {
    /// What to run: check, speed, model, all, or warm (compile the modules of `check --kernels` and of
    /// `--python-suite` into the PTX cache, on `--compile-threads` threads; with `--arch`, without a GPU).
    #[arg(default_value = "all")]
    pub(crate) what: String,
    /// JSON output.
    #[arg(long, default_value = "docs/bench/cuda.json")]
    pub(crate) out: std::path::PathBuf,
    /// Sequence lengths for `speed`.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1024, 2048, 4096, 8192, 16384, 32768])]
    pub(crate) lengths: Vec<i64>,
    /// Head dimensions for `speed`.
    #[arg(long, value_delimiter = ',', default_values_t = vec![64, 128])]
    pub(crate) head_dims: Vec<i64>,
    /// Timed repetitions (median reported).
    #[arg(long, default_value_t = 10)]
    pub(crate) reps: usize,
    /// `check`: print each step to stderr as it starts (to find a hang).
    #[arg(long)]
    pub(crate) trace: bool,
    /// `check`: only cases of these lengths (default: all).
    #[arg(long, value_delimiter = ',')]
    pub(crate) only_t: Vec<usize>,
    /// `check`: only these kernel requests (`auto`, `v1` to `v10`; default: every lab pair), and the
    /// model check's bf16 fused runs with each; a case none of them runs (f32, d = 48 for the
    /// tensor-core versions) is skipped. `--kernels v7,v8` checks v5 + v7 and v8 + v9, what
    /// `benches/gpu-session.sh ship1` confirms before `Auto` switches. `speed`: only these requests'
    /// rows of the lab table (SDPA and `Auto` are always timed).
    #[arg(long, value_delimiter = ',')]
    pub(crate) kernels: Vec<attn_kernels::cuda::Kernel>,
    /// `check`: threads that compile the cases' kernel modules ahead of the cases (NVRTC and the
    /// driver's JIT, a few seconds per lab module); 1 compiles each at first use instead.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(4, |n| n.get()).min(16))]
    pub(crate) compile_threads: usize,
    /// `speed`: also time LSSA and LSSAR written for PyTorch's FlexAttention (`benches/flex_lssa.py`,
    /// compiled, in a child process with the Python of this libtorch) at the same shapes.
    #[arg(long)]
    pub(crate) flex: bool,
    /// `warm`: compile for this architecture with NVRTC alone, no GPU needed (`compute_90a` for an
    /// H100 or H200) [default: the GPU's].
    #[arg(long)]
    pub(crate) arch: Option<String>,
    /// `warm`: also the modules of this Python test file's CUDA cases (`crates/lssa-py/tests/test_cuda.py`:
    /// its `CUDA_FUSED` variants at the head dimensions of its `SHAPES`, every dtype) under `Auto`.
    #[arg(long, value_name = "FILE")]
    pub(crate) python_suite: Option<std::path::PathBuf>,
    /// `warm`: also these variants' modules at `--head-dims` in every dtype under `Auto` (what a
    /// training and its f32 evaluation load: `benches/gpu-session.sh science`).
    #[arg(long, value_delimiter = ',')]
    pub(crate) variants: Vec<String>,
}
