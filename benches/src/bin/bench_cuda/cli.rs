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
    /// `speed`: also time LSSA and LSSAR written for PyTorch's FlexAttention (`benches/flex_lssa.py`,
    /// compiled, in a child process with the Python of this libtorch) at the same shapes.
    #[arg(long)]
    pub(crate) flex: bool,
}
