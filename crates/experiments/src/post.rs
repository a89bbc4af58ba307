//! The experiments that run after the language models are trained, or beside them on their own
//! models: each kind ([`Kind::Retrieval`], [`Kind::Downstream`], [`Kind::Physics`]) is one
//! [`PostTraining`] value that runs its experiments, keeps its results and builds its report section
//! (as [`crate::doc`] blocks).
//! `reproduce` and the report handle every such kind by one loop over these values, so a new kind is
//! its [`Kind`] variant (`spec.rs`), its module implementing [`PostTraining`], and one line in the
//! list `reproduce` builds (`bin/reproduce.rs`).

use std::path::Path;

use anyhow::Result;

use crate::doc::Block;
use crate::runner::Runs;
use crate::scale::Scale;
use crate::spec::{Experiment, Kind};

/// What a post-training experiment may read when it runs.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The scale of the reproduction.
    pub scale: &'a Scale,
    /// The reproduction's output directory (`runs/<scale>`): trained models, caches.
    pub out: &'a Path,
    /// The trained runs, by variant.
    pub results: &'a Runs,
    /// The folder of user-supplied task data (`--downstream DIR`), if any.
    pub downstream_dir: Option<&'a Path>,
    /// Set by a stop signal (`reproduce`'s handlers): a kind that trains models of its own checks it
    /// before starting each and then returns [`crate::runner::Stopped`]; models already finished
    /// stay cached (and retrieval's models in training save their state and continue next time).
    pub stop: Option<trainer::process::StopFlag>,
}

/// Where a section's figures go.
#[derive(Clone, Copy, Debug)]
pub struct Figures<'a> {
    /// The directory the figure files are written to.
    pub dir: &'a Path,
    /// The same directory relative to the report, for links.
    pub rel: &'a str,
}

/// One kind of post-training experiment.
pub trait PostTraining {
    /// The experiment kind whose `defs/*/experiment.toml` entries this runs and reports.
    fn kind(&self) -> Kind;

    /// The name `--only` accepts to run this kind's experiments alone, if it has one.
    fn only_name(&self) -> Option<&'static str> {
        None
    }

    /// Whether its rows' language models must be trained first (so `--only NAME` trains them too).
    fn needs_trained_rows(&self) -> bool {
        true
    }

    /// Whether this invocation can run it at all (downstream scoring needs `--downstream DIR`).
    fn available(&self, inputs: &Inputs<'_>) -> bool {
        let _ = inputs;
        true
    }

    /// What to append to a section's regenerate command besides `--only` (`" --downstream DIR"`).
    fn regenerate_extra(&self) -> &'static str {
        ""
    }

    /// Runs experiment `e` (of this kind) and keeps its results for [`PostTraining::section`].
    fn run(&mut self, e: &Experiment, inputs: &Inputs<'_>) -> Result<()>;

    /// Seconds of work its results took (added to the report's total run time).
    fn wall_s(&self) -> f64;

    /// Verdict or observation lines for the report's summary (empty when nothing ran).
    fn verdicts(&self) -> Vec<String>;

    /// The verdicts it adds to the report's family (Holm-Bonferroni, shared readings); observations
    /// that are not verdicts on a claim add none.
    fn counted(&self) -> Vec<crate::family::Counted> {
        Vec::new()
    }

    /// Experiment `e`'s section of the report: its blocks after the README and regenerate line (the
    /// report adds the title, those two and renders it with the rest), drawing its figures on the way.
    fn section(&self, e: &Experiment, figures: Figures<'_>) -> Result<Vec<Block>>;
}

/// The [`PostTraining`] of `kind` in `all`, if `kind` is a post-training kind.
pub fn find(all: &[Box<dyn PostTraining>], kind: Kind) -> Option<&dyn PostTraining> {
    all.iter().find(|p| p.kind() == kind).map(|p| p.as_ref())
}
