//! The command line of bench-cuda.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "CUDA kernel lab: correctness against attn-core, speed against libtorch SDPA")]
pub(crate) struct Args {
    /// What to run: check, speed, model, or all.
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
    /// `check`: only these kernel requests (`auto`, `v1` to `v9`; default: every lab pair), and the
    /// model check's bf16 fused runs with each; a case none of them runs (f32, d = 48 for the
    /// tensor-core versions) is skipped. `--kernels v7,v8` checks v5 + v7 and v8 + v9, what
    /// `benches/gpu-session.sh ship1` confirms before `Auto` switches.
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
}
