//! The pilot of training length (issue 58, docs/PILOT.md): reads the pilot's runs (one `reproduce`
//! output directory per training length, `DIR/steps-<N>/`), writes their summary to
//! `docs/pilot/length.json` (which the report embeds), draws `docs/figures/pilot_length.{png,svg}`
//! and prints the pilot's table as Markdown.
//!
//! ```text
//! cargo run --release -p experiments --example pilot_length -- runs/pilot-length
//! ```

use anyhow::{Context, Result};
use experiments::doc::{Section, to_markdown};
use experiments::pilot::LengthPilot;

const ABOUT: &str = "softmax, LSSAR (lssa+rw15) and LSSA (also read with p = 15 post hoc), pilot seeds 1337 and 1338, the small recipe (4 layers of width 128, T = 64, 1024 tokens per step, data/bpe2k) trained for each step count with the learning-rate schedule stretched to it, scored on the reproduction's 64K validation targets at 1x-16x under NTK and plain RoPE";
const COMMAND: &str = "reproduce --claims-only --only softmax,lssa+rw15,lssa --seeds 2 --set seed=1337 --set max_steps={steps} --out runs/pilot-length/steps-{steps}";

fn main() -> Result<()> {
    let dir = std::env::args().nth(1).context("usage: pilot_length RUNS_DIR")?;
    let pilot = LengthPilot::from_runs(std::path::Path::new(&dir), ABOUT, COMMAND)?;
    anyhow::ensure!(!pilot.points.is_empty(), "no result.json under {dir}/steps-*/");
    std::fs::write("docs/pilot/length.json", serde_json::to_string_pretty(&pilot)? + "\n")?;
    pilot.figure(std::path::Path::new("docs/figures/pilot_length"))?;
    let mut s = Section::new("Pilot of training length");
    s.push(pilot.table());
    print!("{}", to_markdown(&s, 2));
    Ok(())
}
