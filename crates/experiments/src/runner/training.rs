//! The training side of a run ([`super::train_run`] calls it): one attempt, in this process or in
//! ranks of child processes ([`Launch`]), each told the runner's stop flag, and the body of a rank
//! (`reproduce --train-rank`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use trainer::config::TrainConfig;
use trainer::process::StopFlag;
use trainer::train::{self, RunOptions, ShardSource, Single};

use super::{say, write_json};

/// Where training runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// In this process, on one CPU or one GPU.
    InProcess,
    /// In `nproc` child processes of this binary (`reproduce --train-rank CONFIG`), data-parallel
    /// over libtorch's process groups (NCCL on GPUs, Gloo on CPUs), started by the trainer's own
    /// launcher or by `torchrun`.
    Ranks {
        /// Processes on this machine.
        nproc: usize,
        /// Start them with `torchrun --standalone` (must be on PATH) instead of the built-in launcher.
        torchrun: bool,
    },
}

/// File written by rank 0 of a [`Launch::Ranks`] training: final loss and throughput.
pub(super) const RANK_SUMMARY_FILE: &str = "train-summary.json";

/// One training attempt of `cfg` (resuming from `resume`); returns the last step's loss and the
/// mean tokens per second. Once `stop` is set the training saves at its next step and ends with
/// [`train::Preempted`] (in ranks: each saves and exits with [`trainer::process::PREEMPTED_EXIT`], and
/// the launcher returns [`trainer::launch::LaunchError::Preempted`]).
pub(super) fn train_attempt(
    cfg: &TrainConfig,
    resume: Option<PathBuf>,
    launch: &Launch,
    command: &str,
    progress: &std::sync::Arc<crate::progress::Training>,
    lock: &std::sync::Arc<trainer::process::RunLock>,
    stop: Option<StopFlag>,
) -> Result<(f64, f64)> {
    match launch {
        Launch::InProcess => {
            let (batch, seq) = (cfg.batch_size, cfg.model.context_len);
            let mut data = ShardSource::open(&cfg.data_dir, batch, seq, 0, 1, cfg.seed, cfg.sampling)?;
            let progress = progress.clone();
            // The runner owns the directory: it resumes or clears it before calling.
            let opts = RunOptions {
                lock: train::DirLock::Held(lock.clone()),
                stop,
                resume,
                progress: false,
                val_tokens: Vec::new(),
                command: command.into(),
                overwrite: true,
                on_step: Some(train::StepHook(std::sync::Arc::new(move |m| progress.step(m)))),
                // The reproduction runs the measured kernels.
                cuda_kernel: Default::default(),
            };
            let run = train::train(cfg, &mut data, &Single, &opts)?;
            Ok((run.steps.last().map_or(f64::NAN, |s| s.loss), run.tokens_per_s))
        }
        Launch::Ranks { nproc, torchrun } => {
            std::fs::create_dir_all(&cfg.out_dir).with_context(|| format!("creating {}", cfg.out_dir.display()))?;
            let config = cfg.out_dir.join("rank-config.toml");
            trainer::data::io::write_atomic(&config, |w| w.write_all(cfg.to_toml().as_bytes()))?;
            let _ = std::fs::remove_file(cfg.out_dir.join(RANK_SUMMARY_FILE));
            let exe = std::env::current_exe().context("locating the reproduce binary")?;
            let mut args = vec!["--train-rank".to_string(), config.display().to_string()];
            if let Some(r) = &resume {
                args.extend(["--resume".to_string(), r.display().to_string()]);
            }
            if *torchrun {
                let mut cmd = std::process::Command::new("torchrun");
                cmd.args(["--standalone", &format!("--nproc-per-node={nproc}"), "--no-python"]).arg(&exe).args(&args);
                say(&format!("{}: {cmd:?}", cfg.model.attention));
                let status = cmd.status().context(
                    "starting torchrun (is it on PATH? it comes with the torch venv of `cargo xtask setup`)",
                )?;
                // torchrun forwards a stop signal to the ranks, which save and exit (their stop
                // handlers are installed): a failure then is the pre-emption.
                if !status.success()
                    && let Some(sig) = stop.and_then(|s| s.signal())
                {
                    return Err(super::Stopped { signal: trainer::process::signal_name(sig) }.into());
                }
                anyhow::ensure!(status.success(), "torchrun failed ({status})");
            } else {
                // A stop signal is forwarded to the ranks, which save at their step and exit.
                trainer::launch::spawn_stoppable(*nproc, &exe, &args, stop)?;
            }
            let summary: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(cfg.out_dir.join(RANK_SUMMARY_FILE))
                    .context("rank 0 wrote no training summary")?,
            )?;
            let num = |k: &str| summary[k].as_f64().unwrap_or(f64::NAN);
            Ok((num("final_train_loss"), num("tokens_per_s")))
        }
    }
}

/// The body of `reproduce --train-rank CONFIG`: one rank of a [`Launch::Ranks`] training, its
/// process group from torchrun's variables.
/// `stop` is the rank's own flag (`reproduce --train-rank` installs the stop handlers): a SIGTERM
/// from the launcher or torchrun makes every rank stop at the same step and rank 0 save there.
pub fn train_rank(config: &Path, resume: Option<PathBuf>, stop: Option<StopFlag>) -> Result<()> {
    let text = std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let cfg = TrainConfig::from_toml_with_overrides(&text, &config.display().to_string(), &[])?;
    let me = train::Rank::from_env()?;
    let coll = me.collective();
    let mut data = me.open_data(&cfg)?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    // Rank 0's progress as plain lines on the launcher's stderr.
    let progress = std::sync::Arc::new(crate::progress::Training::start(
        &format!("{} (rank 0 of {})", cfg.model.attention, coll.world_size()),
        cfg.max_steps,
    ));
    let on_step = Some(train::StepHook(std::sync::Arc::new(move |m| progress.step(m))));
    // The runner that launched this rank holds the directory's lock.
    let opts = RunOptions {
        lock: train::DirLock::HeldByParent,
        stop,
        resume,
        progress: false,
        val_tokens: Vec::new(),
        command,
        overwrite: true,
        on_step,
        cuda_kernel: Default::default(),
    };
    let run = train::train(&cfg, &mut data, coll, &opts)?;
    if coll.rank() == 0 {
        let summary = serde_json::json!({
            "final_train_loss": run.steps.last().map_or(f64::NAN, |s| s.loss),
            "tokens_per_s": run.tokens_per_s,
            "world_size": coll.world_size(),
        });
        write_json(&cfg.out_dir.join(RANK_SUMMARY_FILE), &summary)?;
    }
    Ok(())
}
