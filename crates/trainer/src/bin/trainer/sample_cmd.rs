//! `trainer sample`: text from a checkpoint (plain, or one JSON document with `--json`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use gpt_model::model::Sampling;
use serde::Serialize;
use trainer::sample::{self as sampling, SampleOptions};
use trainer::train;

use crate::common::{DeviceArg, Header, SAMPLE_FORMAT, set_threads};

#[derive(clap::Args, Debug)]
pub(crate) struct SampleArgs {
    /// The checkpoint, a training state or a weights-only export.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The text to continue (the end-of-text token is put before it, as before every training
    /// document; `<|endoftext|>` alone samples unconditionally).
    #[arg(long, required_unless_present = "prompts", conflicts_with = "prompts")]
    prompt: Option<String>,
    /// A file of prompts, one per line (blank lines skipped; `-` reads standard input), generated in
    /// batches of prompts of equal token length.
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// New tokens per prompt, at most (prompt + new tokens must fit the window, see --length-scale).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Softmax temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    temperature: f64,
    /// Sample among the k most likely tokens only.
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling: among the most likely tokens whose probability reaches p, in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f64>,
    /// Seed: the same seed, checkpoint, prompts and options give the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating after the end-of-text token (default: a prompt stops there).
    #[arg(long)]
    ignore_eot: bool,
    /// Post-hoc re-weighting power p: the trained variant with `+rw p` at inference.
    #[arg(long)]
    reweight: Option<u32>,
    /// The window as a multiple s >= 1 of the training length: prompt + new tokens may reach
    /// s x T_train tokens (NTK-scaled RoPE at s > 1 unless --rope plain).
    #[arg(long, default_value_t = 1.0)]
    length_scale: f64,
    /// RoPE when --length-scale > 1.
    #[arg(long, value_enum, default_value_t = SampleRope::Ntk)]
    rope: SampleRope,
    /// Where the tokenizer is (default: the checkpoint's training data_dir; GPT-2 needs none): a shard
    /// directory or any directory holding its tokenizer.json.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Most prompts per batched generation.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Print one JSON document (format `lssa-sample`) instead of the text.
    #[arg(long)]
    json: bool,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// CPU threads for libtorch (0: its default, all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// `sample --rope`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SampleRope {
    /// NTK-scaled base beyond the training length.
    Ntk,
    /// The training RoPE.
    Plain,
}

#[derive(Serialize)]
struct SampleResult<'a> {
    #[serde(flatten)]
    header: Header,
    settings: SampleSettings,
    samples: &'a [sampling::Sample],
}

#[derive(Serialize)]
struct SampleSettings {
    max_tokens: usize,
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    seed: u64,
    stop_at_eot: bool,
    reweight: Option<u32>,
    length_scale: f64,
    rope: &'static str,
}

pub(crate) fn sample_cmd(a: SampleArgs) -> Result<()> {
    set_threads(a.threads);
    let prompts = match (&a.prompt, &a.prompts) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(file)) => sampling::read_prompts(file)?,
        (None, None) => bail!("give --prompt TEXT or --prompts FILE"),
    };
    let opts = SampleOptions {
        max_tokens: a.max_tokens,
        sampling: Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p },
        seed: a.seed,
        stop_at_eot: !a.ignore_eot,
        reweight: a.reweight,
        length_scale: a.length_scale,
        ntk: a.rope == SampleRope::Ntk,
        batch_size: a.batch_size,
    };
    // The options are checked before the (slow) load: a bad flag fails at once.
    opts.sampling.validate().map_err(|e| anyhow::anyhow!("{e}").context("sampling options"))?;
    let device = train::pick_device(a.device.into(), 0)?;
    let loaded = sampling::load(&a.checkpoint, a.data_dir.as_deref(), device)?;
    let samples = sampling::sample(&loaded.model, &loaded.tokenizer, &prompts, &opts)?;
    if a.json {
        let result = SampleResult {
            header: Header::new(SAMPLE_FORMAT, &a.checkpoint, &loaded.config),
            settings: SampleSettings {
                max_tokens: opts.max_tokens,
                temperature: opts.sampling.temperature,
                top_k: opts.sampling.top_k,
                top_p: opts.sampling.top_p,
                seed: opts.seed,
                stop_at_eot: opts.stop_at_eot,
                reweight: opts.reweight,
                length_scale: opts.length_scale,
                rope: if opts.ntk { "ntk" } else { "plain" },
            },
            samples: &samples,
        };
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        for (i, s) in samples.iter().enumerate() {
            if i > 0 {
                println!("---");
            }
            println!("{}{}", s.prompt, s.completion);
        }
    }
    Ok(())
}
