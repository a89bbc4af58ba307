//! `trainer export`: the weights of a checkpoint alone, without the optimiser state.

use std::path::PathBuf;

use anyhow::Result;
use gpt_model::checkpoint::WEIGHTS_KIND;
use trainer::sample as sampling;

/// Prefix of the optimiser moments in a training checkpoint (`trainer::optim::AdamW::state`).
const OPTIM_PREFIX: &str = "optim.";

#[derive(clap::Args, Debug)]
pub(crate) struct ExportArgs {
    /// The checkpoint to read (a training state; a weights-only file is copied).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The weights-only file to write (atomically; replaced if it exists, never the checkpoint itself).
    #[arg(long)]
    out: PathBuf,
}

pub(crate) fn export_cmd(a: ExportArgs) -> Result<()> {
    let ckpt = sampling::open_checkpoint(&a.checkpoint)?;
    ckpt.config()?; // a file without a model config is no checkpoint of ours
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
