//! `trainer export`: the weights of a checkpoint alone, without the optimiser state, as our own
//! safetensors file or as a Hugging Face folder (`--format hf`, see `trainer::hf`).

use std::path::PathBuf;

use anyhow::Result;
use gpt_model::checkpoint::WEIGHTS_KIND;
use trainer::sample as sampling;

/// Prefix of the optimiser moments in a training checkpoint (`trainer::optim::AdamW::state`).
const OPTIM_PREFIX: &str = "optim.";

#[derive(clap::Args, Debug)]
pub(crate) struct ExportArgs {
    /// The checkpoint to read (a training state, or a weights-only export).
    #[arg(long)]
    checkpoint: PathBuf,
    /// What to write: `weights`, our weights-only safetensors file (a file; replaced if it exists,
    /// never the checkpoint itself), or `hf`, a folder that stock transformers loads (GPT-NeoX
    /// config, weights, tokenizer, generation config and a model card; written beside `--out` and
    /// renamed into place, replacing only an earlier export of ours).
    #[arg(long, value_enum, default_value_t = Format::Weights)]
    format: Format,
    /// The file (`weights`) or folder (`hf`) to write.
    #[arg(long)]
    out: PathBuf,
    /// With `--format hf`: where the tokenizer is (a shard directory, or one holding tokenizer.json);
    /// default the checkpoint's training data_dir (GPT-2's needs none).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

/// `export --format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// Our weights-only safetensors file.
    Weights,
    /// A Hugging Face folder (transformers' GPT-NeoX).
    Hf,
}

pub(crate) fn export_cmd(a: ExportArgs) -> Result<()> {
    let ckpt = sampling::open_checkpoint(&a.checkpoint)?;
    let cfg = ckpt.config()?; // a file without a model config is no checkpoint of ours
    if a.format == Format::Hf {
        if let Some(why) = trainer::hf::unexportable_reason(&cfg.attention) {
            anyhow::bail!("{}: {why}", a.checkpoint.display());
        }
        let tok = sampling::tokenizer_for(ckpt.metadata(), &a.checkpoint, a.data_dir.as_deref())?;
        let tensors: Vec<_> = ckpt.tensors("")?.into_iter().filter(|(n, _)| !n.starts_with(OPTIM_PREFIX)).collect();
        let prov = trainer::hf::Provenance { checkpoint: a.checkpoint.clone(), meta: ckpt.metadata().clone() };
        let files = trainer::hf::write_export(&a.out, &tensors, &cfg, &tok, &prov)?;
        println!(
            "trainer: wrote {} (Hugging Face, GPT-NeoX, attention `{}`): {}",
            a.out.display(),
            cfg.attention,
            files.iter().filter_map(|f| f.file_name()).map(|f| f.to_string_lossy()).collect::<Vec<_>>().join(", ")
        );
        if cfg.attention.to_string() != "softmax" {
            println!("trainer: load it after `import lssa.hf` (it registers `{}` with transformers)", cfg.attention);
        }
        return Ok(());
    }
    let names = ckpt.names()?;
    let optim = names.iter().filter(|n| n.starts_with(OPTIM_PREFIX)).count();
    // What describes the model and where it came from stays; the resume state goes.
    let mut meta = ckpt.metadata().clone();
    for key in ["optim_t", "data_position", "world_size"] {
        meta.remove(key);
    }
    if let Some(kind) = ckpt.kind().filter(|k| *k != WEIGHTS_KIND) {
        meta.insert("exported_from_kind".into(), kind.to_string());
    }
    meta.insert("exported_from".into(), a.checkpoint.display().to_string());
    meta.insert("export_git_revision".into(), trainer::git_revision());
    let written = ckpt.export(&a.out, &|name: &str| !name.starts_with(OPTIM_PREFIX), meta)?;
    let mib =
        |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len() as f64 / (1u64 << 20) as f64).unwrap_or(f64::NAN);
    println!(
        "trainer: wrote {} (weights only): {written} tensors, {:.1} MiB; left out {optim} optimiser tensors of {} ({:.1} MiB)",
        a.out.display(),
        mib(&a.out),
        a.checkpoint.display(),
        mib(&a.checkpoint)
    );
    Ok(())
}
