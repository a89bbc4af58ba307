//! What the subcommands share: the output format tags, `--device`, `--threads`, and the header of
//! every JSON output.

use std::path::PathBuf;

use serde::Serialize;
use trainer::config::DeviceChoice;

/// Format tag and version of `result.json` and `eval` output.
pub(crate) const RESULT_FORMAT: &str = "lssa-train-result";
pub(crate) const EVAL_FORMAT: &str = "lssa-eval";
pub(crate) const SAMPLE_FORMAT: &str = "lssa-sample";
pub(crate) const FORMAT_VERSION: u32 = 1;

/// `--device`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(crate) enum DeviceArg {
    /// The first GPU when CUDA works, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The first GPU (an error without CUDA).
    Cuda,
}

impl From<DeviceArg> for DeviceChoice {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Auto => DeviceChoice::Auto,
            DeviceArg::Cpu => DeviceChoice::Cpu,
            DeviceArg::Cuda => DeviceChoice::Cuda,
        }
    }
}

/// What every JSON output of `eval` and `sample` starts with.
#[derive(Serialize)]
pub(crate) struct Header {
    format: &'static str,
    format_version: u32,
    git_revision: String,
    command: String,
    checkpoint: PathBuf,
    variant: String,
    context_len: usize,
}

impl Header {
    pub(crate) fn new(format: &'static str, checkpoint: &std::path::Path, model: &gpt_model::ModelConfig) -> Header {
        Header {
            format,
            format_version: FORMAT_VERSION,
            git_revision: trainer::git_revision(),
            command: command_line(),
            checkpoint: checkpoint.to_path_buf(),
            variant: model.attention.to_string(),
            context_len: model.context_len,
        }
    }
}

pub(crate) fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

pub(crate) fn set_threads(threads: usize) {
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
}
