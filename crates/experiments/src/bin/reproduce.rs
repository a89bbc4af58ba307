//! `reproduce`: the paper's tables and figures at one scale (run by `cargo xtask reproduce`).
//!
//! Runbook:
//!
//! ```text
//! cargo xtask reproduce                  # small: the 4 headline variants x 4 seeds (8000 steps), retrieval, then docs/REPRODUCTION.md
//! cargo xtask reproduce --all            # also Tables 1-3, every Table 4 row, Figure 2's sweep, Newton's law (26 variants)
//! cargo xtask reproduce --seeds 6        # 6 seeds of the headline variants (the 4 already trained are reused)
//! cargo xtask reproduce --scale smoke    # seconds: the whole pipeline on generated text (the test suite runs it)
//! cargo xtask reproduce --scale gpu      # one GPU, larger models, T = 512
//! cargo xtask reproduce --only lssa,softmax   # train/evaluate only these variants (the report shows what exists)
//! ```
//!
//! Results: `runs/<scale>/<variant>/` (checkpoints, `metrics.jsonl`, `result.json`). A run with a
//! result is not redone, an interrupted one resumes from its checkpoint, so re-running the command
//! after a crash continues.
//!
//! Under a scheduler: SIGTERM, SIGINT or SIGUSR1 makes every training in flight save a checkpoint at
//! its next step (in `--nproc-per-node` ranks too: the launcher forwards the signal; retrieval's
//! models save their state too), no new run, evaluation or post-training model starts, and
//! `reproduce` prints the command that continues (the same one) and exits with status 75
//! ([`trainer::process::PREEMPTED_EXIT`]); a second SIGINT stops at once. Before it trains anything
//! it estimates the bytes its plan writes ([`experiments::disk`]) and refuses to start when the
//! output's file system has less free.
//!
//! The report goes to `docs/REPRODUCTION.md` (figures in `docs/figures/`) for the default scale,
//! `small`, to `docs/REPRODUCTION-<scale>.md` (figures in `docs/figures-<scale>/`) for the other
//! meaningful scales, and to `runs/<scale>/REPRODUCTION.md` (the `--out` directory) for `smoke` and
//! for any run with `--only` or `--set`. `--no-report` writes none (a GPU machine's staged runs,
//! `benches/gpu-session.sh science`, whose report is rendered where the results are brought back).
//!
//! The `paper` scale needs FineWeb-10B shards in `data/fineweb10B` and GPUs (8 in the paper): each run
//! is trained data-parallel over every GPU of the machine (`--nproc-per-node`, `--torchrun`), then
//! evaluated on the first.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use experiments::post::{Inputs, PostTraining};
use experiments::{report, runner, scale::Scale, spec};

#[derive(Parser, Debug)]
#[command(name = "reproduce", about = "Reproduce the paper's tables and figures at one scale")]
struct Cli {
    /// The scale (docs/GUIDE.md describes each).
    #[arg(long, default_value = "small", value_parser = clap::builder::PossibleValuesParser::new(experiments::scale::SCALES))]
    scale: String,
    /// Results directory [default: runs/SCALE].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Report path [default: docs/REPRODUCTION.md for small, docs/REPRODUCTION-SCALE.md for gpu and
    /// paper; OUT/REPRODUCTION.md for smoke, or with --only or --set, so that a partial or changed run
    /// never overwrites the committed report]. Figures go beside it, in `figures/` (`figures-SCALE/`
    /// for a scale other than small).
    #[arg(long, conflicts_with = "no_report")]
    report: Option<PathBuf>,
    /// Train and evaluate, write every `result.json`, and write no report (nor its figures): for runs
    /// staged on another machine, whose report is rendered with `--report-only` where they are
    /// brought back (`benches/gpu-session.sh science`).
    #[arg(long, conflicts_with = "report_only")]
    no_report: bool,
    /// Only these trained variants (comma-separated attn-core names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Language-model runs trained at once [default: 1 on a GPU or under 4 cores, else one per 4
    /// cores, at least 2, at most 4]; the retrieval benchmark's small models run 2 at once from 2 cores.
    #[arg(long)]
    jobs: Option<usize>,
    /// Seeds (initialisation and data order) of every variant a headline claim reads
    /// (`defs/claims.toml`); the other variants get one. Raising it later trains only the new seeds
    /// [default: the scale's, from the power calculations in docs/PILOT.md: 4 at `small`, 7 at `small-short`].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    seeds: Option<u32>,
    /// Everything: besides the default's headline rows (the variants the claims read, at every length
    /// of Table 4 and Figure 1, their sinks) and the retrieval benchmark, also Tables 1-3, the other
    /// Table 4 rows, Figure 2's post-hoc sweep and Newton's law.
    #[arg(long, conflicts_with = "claims_only")]
    all: bool,
    /// `key=value` overrides of the scale's training config (TOML values; dotted keys reach into
    /// the model table), e.g. `--set max_steps=3000`. Runs whose config changes are retrained.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Train each run data-parallel in this many processes on this machine (NCCL on GPUs, Gloo on
    /// CPUs) [default: the number of GPUs for the paper scale, else 1 (in this process)].
    #[arg(long)]
    nproc_per_node: Option<usize>,
    /// Start those processes with `torchrun --standalone` instead of the built-in launcher.
    #[arg(long)]
    torchrun: bool,
    /// Internal: run one rank of a data-parallel training from this resolved config and exit.
    #[arg(long, hide = true, value_name = "CONFIG")]
    train_rank: Option<PathBuf>,
    /// Internal, with --train-rank: the checkpoint to resume from.
    #[arg(long, hide = true, requires = "train_rank")]
    resume: Option<PathBuf>,
    /// Train and evaluate only what the headline claims read (`defs/claims.toml`): their variants,
    /// their lengths and post-hoc powers; no sweep, sinks, retrieval or physics. For pilots of a
    /// scale, and for a quick answer to the paper's main questions.
    #[arg(long)]
    claims_only: bool,
    /// Write the report from the results already in the output directory, whatever code computed
    /// them (the report lists the revisions it mixes); train and evaluate nothing.
    #[arg(long)]
    report_only: bool,
    /// Print the plan (runs and evaluations) and stop.
    #[arg(long)]
    plan: bool,
    /// Score the downstream section's models on the multiple-choice files in DIR
    /// (`arc_easy.jsonl`, `arc_challenge.jsonl`, `hellaswag.jsonl`, `piqa.jsonl`, `sciq.jsonl`,
    /// `mmlu.jsonl`; any subset). Nothing is downloaded.
    #[arg(long, value_name = "DIR")]
    downstream: Option<PathBuf>,
}

/// Test-only: the free bytes the disk-space check sees instead of asking the file system (the
/// binary-level test of the refusal; no user sets it).
const TEST_FREE_BYTES_ENV: &str = "LSSA_TEST_FREE_BYTES";

/// The command that continues a stopped reproduction, as the user typed it: `cargo xtask
/// reproduce` sets it before it becomes this program; else this program's own command line.
const COMMAND_ENV: &str = "LSSA_REPRODUCE_COMMAND";

fn main() {
    // Before anything else: it may run this program again with libgomp's spin count set.
    trainer::process::limit_openmp_spinning();
    // The process's allocator setting, as `trainer`'s main makes it (the library's `train` does not).
    trainer::process::keep_freed_memory();
    if let Err(e) = run() {
        // Stopped by a signal with everything saved: a status of its own for a requeue script.
        if runner::is_stop(&e) {
            eprintln!("reproduce: {e:#}");
            if std::env::args().nth(1).as_deref() != Some("--train-rank") {
                let dir = std::env::current_dir().map_or_else(|_| ".".to_string(), |d| d.display().to_string());
                eprintln!("reproduce: continue with the same command (in {dir}): {}", resume_command());
            }
            std::process::exit(trainer::process::PREEMPTED_EXIT);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The command line that continues this reproduction ([`COMMAND_ENV`], else this program's own,
/// each argument quoted for a POSIX shell where it needs it).
fn resume_command() -> String {
    if let Ok(c) = std::env::var(COMMAND_ENV) {
        return c;
    }
    let quote = |a: String| {
        if !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+@%".contains(&b)) {
            a
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    };
    std::env::args().map(quote).collect::<Vec<_>>().join(" ")
}

fn run() -> Result<()> {
    let mut cli = Cli::parse();
    // What trains answers a stop signal by saving (`--plan` and `--report-only` keep the defaults).
    let stop = if cli.plan || cli.report_only { None } else { Some(trainer::process::install_stop_handlers()?) };
    // A subset (`--only`) or a changed recipe (`--set`) is not the committed reproduction: its report
    // goes beside its runs, never over docs/REPRODUCTION.md.
    let partial = !cli.only.is_empty() || !cli.set.is_empty();
    // The revision every run of this invocation records: the tree as it was when it started.
    trainer::git_revision();
    if let Some(config) = &cli.train_rank {
        // One rank: a SIGTERM from the launcher (or torchrun) saves at the step all ranks agree on.
        return runner::train_rank(config, cli.resume.clone(), stop);
    }
    let scale = scale_of(&cli)?;
    let claims = experiments::claims::all()?;
    let Plan { experiments, mut plan, seeds, mut sink_plan } = plan_of(&cli, &scale, &claims)?;
    // The experiments after (or beside) training. A new kind of experiment is one more line here.
    let mut post: Vec<Box<dyn PostTraining>> = vec![
        Box::<experiments::retrieval::Experiments>::default(),
        Box::<experiments::downstream::Experiments>::default(),
        Box::<experiments::newton::report::Experiments>::default(),
    ];
    let selected = selected_post(&cli, &post);
    if !cli.only.is_empty() {
        apply_only(&mut cli, &post, &selected, &experiments, &mut plan, &mut sink_plan)?;
    }
    eprintln!("reproduce: scale {} ({}); {}", scale.name, scale.about, gpt_model::runtime::describe());
    if cli.plan {
        for (v, needs) in &plan {
            println!("{v}: {} seeds, {} evaluations", seeds.get(v.as_str()).copied().unwrap_or(1), needs.len());
        }
        return Ok(());
    }
    let launch = launch_of(&cli, &scale)?;
    let out = cli.out.clone().unwrap_or_else(|| PathBuf::from("runs").join(scale.name));
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let (shown, base_command) = shown_commands(&cli, &scale);
    let start = Instant::now();
    let jobs = cli.jobs.unwrap_or_else(|| runner::default_jobs(tch::Cuda::is_available()));
    // Seeds after the first: the claims' evaluations and every length without post-hoc re-weighting.
    let claim_keys: std::collections::BTreeSet<spec::EvalKey> = claims.plan().into_values().flatten().collect();
    let later = |k: &spec::EvalKey| k.posthoc.is_none() || claim_keys.contains(k);
    if !cli.report_only {
        // Before anything is trained: room for everything the plan writes.
        let post_runs: Vec<&spec::Experiment> = experiments
            .iter()
            .filter(|e| post.iter().zip(&selected).any(|(p, on)| *on && p.kind() == e.kind))
            .collect();
        check_disk(&scale, &plan, &seeds, &sink_plan, &experiments, &post_runs, jobs, &out)?;
    }
    let results = if cli.report_only {
        runner::load_all(&scale, &plan, &seeds, &out)?
    } else {
        runner::run_all(&scale, &plan, &seeds, &later, &out, &command, jobs, &launch, &sink_plan, stop)?
    };
    let inputs =
        Inputs { scale: &scale, out: &out, results: &results, downstream_dir: cli.downstream.as_deref(), stop };
    for (p, _) in post.iter_mut().zip(&selected).filter(|(p, on)| **on && p.available(&inputs)) {
        let kind = p.kind();
        for e in experiments.iter().filter(|e| e.kind == kind) {
            // After a stop signal no further experiment starts.
            runner::check_stop(stop)?;
            p.run(e, &inputs)?;
        }
    }
    if cli.no_report {
        eprintln!("reproduce: results in {}; no report (--no-report)", out.display());
    } else {
        let (report_path, figures_dir) =
            report_location(cli.report.as_deref(), scale.name, scale.meaningful && !partial, &out);
        // Figures live beside the report, so the link to them is the directory's own name.
        let figures_rel = figures_dir.file_name().map_or("figures".into(), |n| n.to_string_lossy().to_string());
        let others = other_reports(scale.name, &report_path);
        let ctx = report::Context {
            scale: &scale,
            command: &shown,
            base_command: &base_command,
            git_revision: &trainer::git_revision(),
            // Training plus evaluation of every run, including earlier invocations of an interrupted
            // reproduction, summed (runs trained at once each count).
            wall_s: results
                .values()
                .flatten()
                .map(|r| r.train_wall_s + r.eval_wall_s)
                .chain(post.iter().map(|p| p.wall_s()))
                .sum::<f64>()
                .max(start.elapsed().as_secs_f64()),
            figures_rel: &figures_rel,
            post: &post,
            others: &others,
        };
        report::write(&experiments, &results, &ctx, &report_path, &figures_dir).context("writing the report")?;
        eprintln!("reproduce: wrote {} ({:.1} min)", report_path.display(), start.elapsed().as_secs_f64() / 60.0);
    }
    print_verdicts(&claims, &experiments, &results);
    Ok(())
}

/// Refuses to start when `out`'s file system has less free than the plan still writes there
/// ([`experiments::disk`]); says how much it writes.
#[allow(clippy::too_many_arguments)]
fn check_disk(
    scale: &Scale,
    plan: &BTreeMap<spec::TrainedVariant, Vec<spec::EvalKey>>,
    seeds: &BTreeMap<String, usize>,
    sink_plan: &BTreeMap<String, Vec<spec::SinkKey>>,
    experiments: &[spec::Experiment],
    post_runs: &[&spec::Experiment],
    jobs: usize,
    out: &std::path::Path,
) -> Result<()> {
    let estimate = experiments::disk::estimate(scale, plan, seeds, sink_plan, experiments, post_runs, jobs)?;
    let needed = experiments::disk::check(&estimate, out, &free_space)?;
    eprintln!(
        "reproduce: disk: the plan writes about {} ({}); {} still to write under {}",
        experiments::disk::human(estimate.total()),
        estimate.breakdown(),
        experiments::disk::human(needed),
        out.display()
    );
    Ok(())
}

/// The free bytes of `out`'s file system ([`trainer::process::free_bytes`]; [`TEST_FREE_BYTES_ENV`]
/// in tests).
fn free_space(out: &std::path::Path) -> Result<u64> {
    match std::env::var(TEST_FREE_BYTES_ENV) {
        Ok(v) => v.parse().with_context(|| format!("{TEST_FREE_BYTES_ENV}={v}: not a number of bytes")),
        Err(_) => trainer::process::free_bytes(out),
    }
}

/// The scale of `--scale`, with the training config's `--set` overrides; refuses those the runner
/// sets per run.
fn scale_of(cli: &Cli) -> Result<Scale> {
    let mut scale = Scale::by_name(&cli.scale)?;
    if !cli.set.is_empty() {
        let name = format!("the {} scale with --set", scale.name);
        let before = scale.train.clone();
        scale.train = trainer::config::TrainConfig::from_toml_with_overrides(&scale.train.to_toml(), &name, &cli.set)?;
        // What the runner sets per run cannot be overridden: refuse rather than ignore.
        if scale.train.out_dir != before.out_dir {
            bail!("--set out_dir: every run has its own directory under --out; give --out DIR instead");
        }
        if scale.train.model.attention != before.model.attention {
            bail!("--set model.attention: every experiment sets its rows' variants; choose runs with --only instead");
        }
        // `--set data_dir=DIR` trains on DIR instead of the scale's data.
        if scale.train.data_dir != before.data_dir {
            scale.data = experiments::scale::Data::Shards(scale.train.data_dir.clone());
        }
    }
    Ok(scale)
}

/// What an invocation trains and evaluates, before `--only`.
struct Plan {
    /// The experiments it runs.
    experiments: Vec<spec::Experiment>,
    /// Each trained variant's evaluations.
    plan: BTreeMap<spec::TrainedVariant, Vec<spec::EvalKey>>,
    /// Seeds of the variants the claims read (the others get one).
    seeds: BTreeMap<String, usize>,
    /// Each trained variant's attention-sink measurements.
    sink_plan: BTreeMap<String, Vec<spec::SinkKey>>,
}

/// The experiments, runs and evaluations of `--all`, `--claims-only` or the default, which spends
/// the budget on what the headline claims read.
fn plan_of(cli: &Cli, scale: &Scale, claims: &experiments::claims::Claims) -> Result<Plan> {
    let experiments = if cli.all {
        spec::all()?
    } else {
        let powers: Vec<u32> = claims.claim.iter().flat_map(|c| c.terms.iter().filter_map(|t| t.posthoc)).collect();
        spec::headline(spec::all()?, &claims.variants(), &powers, &claims.ordering.experiments)
    };
    let seeds_n = cli.seeds.map_or(scale.headline_seeds, |n| n as usize);
    let mut sink_plan_off = false;
    let mut plan = spec::plan(&experiments);
    for (v, needs) in claims.plan() {
        let have = plan.entry(v).or_default();
        have.extend(needs);
        have.sort();
        have.dedup();
    }
    if cli.claims_only {
        plan = claims.plan();
        for needs in plan.values_mut() {
            needs.sort();
            needs.dedup();
        }
        sink_plan_off = true;
    }
    let seeds: BTreeMap<String, usize> = claims.variants().into_iter().map(|v| (v, seeds_n)).collect();
    let mut sink_plan = spec::sink_plan(&experiments);
    if sink_plan_off {
        sink_plan.clear();
    }
    Ok(Plan { experiments, plan, seeds, sink_plan })
}

/// Which post-training kinds this invocation runs: none with `--report-only`; a kind without its
/// own `--only` name whenever it is available (downstream, given `--downstream DIR`); the others by
/// default, or when `--only` names them, never with `--claims-only`.
fn selected_post(cli: &Cli, post: &[Box<dyn PostTraining>]) -> Vec<bool> {
    post.iter()
        .map(|p| {
            !cli.report_only
                && p.only_name()
                    .is_none_or(|n| !cli.claims_only && (cli.only.is_empty() || cli.only.iter().any(|v| v == n)))
        })
        .collect()
}

/// Narrows the plans to `--only`'s variants, to which it first adds the trained rows of the
/// selected post-training kinds that need them; refuses a name that nothing trains.
fn apply_only(
    cli: &mut Cli,
    post: &[Box<dyn PostTraining>],
    selected: &[bool],
    experiments: &[spec::Experiment],
    plan: &mut BTreeMap<spec::TrainedVariant, Vec<spec::EvalKey>>,
    sink_plan: &mut BTreeMap<String, Vec<spec::SinkKey>>,
) -> Result<()> {
    let only_names: Vec<&str> = post.iter().filter_map(|p| p.only_name()).collect();
    for (p, _) in post.iter().zip(selected).filter(|(p, on)| **on && p.only_name().is_some() && p.needs_trained_rows())
    {
        // Its rows' models must be trained too.
        for e in experiments.iter().filter(|e| e.kind == p.kind()) {
            cli.only.extend(e.rows.iter().map(|r| r.train.to_string()));
        }
    }
    for v in cli.only.iter().filter(|v| !only_names.contains(&v.as_str())) {
        if !plan.contains_key(v.as_str()) {
            bail!(
                "--only {v}: no experiment trains `{v}`; planned: {}, and {} (experiments with their own selection)",
                plan.keys().map(|k| k.as_str()).collect::<Vec<_>>().join(", "),
                only_names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" / ")
            );
        }
    }
    plan.retain(|k, _| cli.only.iter().any(|o| k == o.as_str()));
    sink_plan.retain(|k, _| cli.only.contains(k));
    Ok(())
}

/// Where training runs: in this process, or in `--nproc-per-node` ranks (by default every GPU for
/// the paper scale, which refuses a machine without one).
fn launch_of(cli: &Cli, scale: &Scale) -> Result<runner::Launch> {
    let gpus = if tch::Cuda::is_available() { tch::Cuda::device_count() as usize } else { 0 };
    let nproc = match (cli.nproc_per_node, scale.name) {
        (Some(n), _) => n,
        (None, "paper") if gpus == 0 => {
            bail!("the paper scale trains on GPUs (8 in the paper) and this machine has none; see the README")
        }
        (None, "paper") => gpus,
        (None, _) => 1,
    };
    if nproc == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    Ok(if nproc > 1 || cli.torchrun {
        runner::Launch::Ranks { nproc, torchrun: cli.torchrun }
    } else {
        runner::Launch::InProcess
    })
}

/// The command the report shows, and the same without `--claims-only` and `--only` (the command
/// that reproduces the whole report).
fn shown_commands(cli: &Cli, scale: &Scale) -> (String, String) {
    let mut shown = if scale.name == "small" {
        "cargo xtask reproduce".to_string()
    } else {
        format!("cargo xtask reproduce --scale {}", scale.name)
    };
    for kv in &cli.set {
        shown.push_str(&format!(" --set {kv}"));
    }
    if let Some(n) = cli.nproc_per_node {
        shown.push_str(&format!(" --nproc-per-node {n}"));
    }
    if cli.torchrun {
        shown.push_str(" --torchrun");
    }
    if let Some(n) = cli.seeds.filter(|&n| n as usize != scale.headline_seeds) {
        shown.push_str(&format!(" --seeds {n}"));
    }
    if cli.all {
        shown.push_str(" --all");
    }
    let base_command = shown.clone();
    if cli.claims_only {
        shown.push_str(" --claims-only");
    }
    if !cli.only.is_empty() {
        shown.push_str(&format!(" --only {}", cli.only.join(",")));
    }
    (shown, base_command)
}

/// Every claim's verdict on its whole-window readings (or why it was not judged), and every
/// ordering's, on standard output.
fn print_verdicts(claims: &experiments::claims::Claims, experiments: &[spec::Experiment], results: &runner::Runs) {
    for j in experiments::claims::judge(claims, results) {
        for r in &j.readings {
            if r.measure == experiments::claims::Measure::Whole {
                let rope = r.rope.map_or(String::new(), |r| format!(" ({r:?} RoPE)"));
                println!(
                    "- {}{rope}: {} {} ({})",
                    j.claim.name,
                    r.judgement.verdict.word(),
                    r.interval.show(),
                    r.judgement.why
                );
            }
        }
        if let Some(why) = &j.missing {
            println!("- {}: not judged: {why}", j.claim.name);
        }
    }
    for o in experiments::claims::judge_orderings(claims, experiments, results) {
        println!("- {} ordering: {} ({})", o.experiment, o.verdict.word(), o.why);
    }
}

/// Where the report and its figures go: `report` when given (figures beside it); the committed
/// report of `scale` in `docs/` for a full run of a meaningful scale (`committed`); else the run
/// directory. Beside a report of its own, a scale's figures directory is its own
/// ([`report::committed_names`]), so no two scales' reports draw over each other's figures.
fn report_location(
    report: Option<&std::path::Path>,
    scale: &str,
    committed: bool,
    out: &std::path::Path,
) -> (PathBuf, PathBuf) {
    let (file, figures) = report::committed_names(scale);
    match report {
        Some(p) => (p.to_path_buf(), p.parent().map(|d| d.join(&figures)).unwrap_or_else(|| PathBuf::from(&figures))),
        None if committed => (PathBuf::from("docs").join(file), PathBuf::from("docs").join(figures)),
        None => (out.join("REPRODUCTION.md"), out.join("figures")),
    }
}

/// The committed reports of the other meaningful scales, as the report at `report_path` links them:
/// each scale's name and, when its report exists beside this one, the link to it.
fn other_reports(scale: &str, report_path: &std::path::Path) -> Vec<report::OtherReport> {
    let dir = report_path.parent().unwrap_or_else(|| std::path::Path::new("."));
    experiments::scale::SCALES
        .iter()
        .filter(|&&s| s != scale && Scale::by_name(s).is_ok_and(|s| s.meaningful))
        .map(|&s| {
            let (file, _) = report::committed_names(s);
            let link = dir.join(&file).exists().then_some(file);
            report::OtherReport { scale: s.to_string(), link }
        })
        // `small-short` is the default's recipe trained shorter, kept for comparison: named only where
        // its report exists, never as a larger scale still to come.
        .filter(|o| o.link.is_some() || o.scale != "small-short")
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn only_a_full_run_writes_the_committed_report() {
        let out = std::path::Path::new("runs/small");
        assert_eq!(report_location(None, "small", true, out).0, PathBuf::from("docs/REPRODUCTION.md"));
        // `--only`, `--set` or the smoke scale: beside the runs.
        assert_eq!(report_location(None, "small", false, out), (out.join("REPRODUCTION.md"), out.join("figures")));
        // `--report` wins, figures beside it.
        let mine = std::path::Path::new("/tmp/x/R.md");
        assert_eq!(
            report_location(Some(mine), "small", true, out),
            (mine.to_path_buf(), PathBuf::from("/tmp/x/figures"))
        );
    }

    #[test]
    fn each_scale_has_its_own_report_and_figures() {
        let out = std::path::Path::new("runs/gpu");
        let (gpu, gpu_figures) = report_location(None, "gpu", true, out);
        assert_eq!(
            (gpu.as_path(), gpu_figures.as_path()),
            (Path::new("docs/REPRODUCTION-gpu.md"), Path::new("docs/figures-gpu"))
        );
        let (small, small_figures) = report_location(None, "small", true, out);
        assert_ne!(gpu, small);
        assert_ne!(gpu_figures, small_figures);
        // A report put in docs/ by hand keeps the scale's figures apart from the small report's.
        let (_, beside) = report_location(Some(Path::new("docs/elsewhere.md")), "gpu", true, out);
        assert_eq!(beside, PathBuf::from("docs/figures-gpu"));
    }

    #[test]
    fn a_report_links_the_other_scales_reports_that_exist_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("REPRODUCTION.md");
        let others = other_reports("small", &small);
        // gpu and paper, neither written yet: named, not linked.
        assert_eq!(others.iter().map(|o| o.scale.as_str()).collect::<Vec<_>>(), ["gpu", "paper"]);
        assert!(others.iter().all(|o| o.link.is_none()), "{others:?}");
        std::fs::write(dir.path().join("REPRODUCTION-gpu.md"), "").unwrap();
        let others = other_reports("small", &small);
        assert_eq!(others[0].link.as_deref(), Some("REPRODUCTION-gpu.md"));
        // And back: the gpu report links the small one, which is there.
        std::fs::write(&small, "").unwrap();
        let back = other_reports("gpu", &dir.path().join("REPRODUCTION-gpu.md"));
        assert_eq!(
            back.iter().map(|o| (o.scale.as_str(), o.link.as_deref())).collect::<Vec<_>>(),
            [("small", Some("REPRODUCTION.md")), ("paper", None)]
        );
        // The shorter recipe's report, once written, is linked from the default's.
        std::fs::write(dir.path().join("REPRODUCTION-small-short.md"), "").unwrap();
        let others = other_reports("small", &small);
        assert_eq!(
            others.iter().map(|o| (o.scale.as_str(), o.link.as_deref())).collect::<Vec<_>>(),
            [
                ("small-short", Some("REPRODUCTION-small-short.md")),
                ("gpu", Some("REPRODUCTION-gpu.md")),
                ("paper", None)
            ]
        );
    }
}
