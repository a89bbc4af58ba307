//! Readers of source text for the tidy checks, each a small parser of its own, kept apart so that
//! `tidy.rs` stays under the house limit of 800 lines. Their tests are in `tidy.rs`, beside the
//! checks that use them.

pub mod emu_guard;
pub mod module_graph;
