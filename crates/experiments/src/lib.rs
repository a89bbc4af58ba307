//! experiments: the paper's tables and figures as declarative data, the runner that trains and evaluates
//! what they need, and the reproduction report (tables, figures, comparison with the paper's numbers).
//!
//! Owns: experiment definitions, result files and the report. It is the only crate that writes tables
//! and figures.
//!
//! Must never depend on: anything that depends on it; it never implements training or attention maths
//! itself (it drives `trainer` and reads `attn-core`).

pub mod status;
