//! experiments: the paper's tables and figures as declarative data, the runner that trains and evaluates
//! what they need, and the reproduction report (tables, figures, comparison with the paper's numbers).
//!
//! Owns: experiment definitions, result files and the report. It is the only crate that writes tables
//! and figures.
//!
//! Must never depend on: anything that depends on it; it never implements training or attention maths
//! itself (it drives `trainer` and reads `attn-core`).
//!
//! - [`spec`]: `defs/<name>/experiment.toml` (+ README), embedded; the plan of runs and evaluations.
//! - [`scale`]: `smoke`, `small`, `gpu`, `paper`.
//! - [`runner`]: trains and evaluates, resumable, one `result.json` per run; stops on a signal with
//!   every training saved ([`runner::Stopped`]).
//! - [`disk`]: the bytes a plan will write, checked against the output's free space before a run.
//! - [`report`]: `REPRODUCTION.md`: its tables, sections and verdict text, built as [`doc`] sections.
//! - [`doc`]: the report as data (sections of text, tables, lists, figures) and its one Markdown
//!   renderer.
//! - [`plot`]: the report's figures from plain numbers (no experiment types: the runner draws
//!   attention maps with it, so it must not depend on the runner or the report).
//! - [`claims`]: the paper's headline claims (`defs/claims.toml`) and the Tables 1-3 ordering rule,
//!   judged from the runs.
//! - [`stats`]: exact t intervals of contrasts over seeds (paired by index) and validation spans, the
//!   seed-noise model of single-seed rows, the verdict rules with their p-values, Holm-Bonferroni, the
//!   permutation test.
//! - [`family`]: every verdict the report counts as one family: Holm-Bonferroni, shared readings,
//!   independent quantities.
//! - [`status`]: every part of the paper covered, and any not implemented, said plainly.
//! - [`downstream`]: lm-evaluation-harness-style multiple-choice scoring of user-supplied ARC, HellaSwag,
//!   PIQA, SciQ and MMLU files (`reproduce --downstream DIR`), in the report and in lm-eval's JSON.
//! - [`progress`]: bars on a terminal, plain lines in a log.
//! - [`retrieval`]: the retrieval benchmark: small models trained from scratch on associative recall in
//!   a grid of task regimes, exact recall by prompt length inside and beyond the training length, gate,
//!   verdicts per regime and their robustness.
//! - [`post`]: the post-training experiment kinds' common interface.
//! - [`sinks`]: attention-sink share and row entropy per layer, attention maps.
//! - [`newton`]: orbits, the orbit transformer and the symbolic regression of force laws.
//! - [`pilot`]: the pilot of training length (`docs/pilot/length.json`), its table and figure.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

pub mod claims;
pub mod disk;
pub mod doc;
pub mod downstream;
pub mod family;
pub mod newton;
pub mod pilot;
pub mod plot;
pub mod post;
pub mod progress;
pub mod report;
pub mod retrieval;
pub mod runner;
pub mod scale;
pub mod sinks;
pub mod spec;
pub mod stats;
pub mod status;
