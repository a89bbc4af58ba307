//! `reproduce`: the paper reproduction (run by `cargo xtask reproduce`).
//!
//! Today it checks that the toolchain and libtorch work and states, part by part, what is not
//! implemented yet. It never prints a result it did not compute.

use anyhow::{Result, bail};

fn main() -> Result<()> {
    let mut scale = "small".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--scale" => scale = args.next().unwrap_or_default(),
            other => bail!("unknown argument `{other}` (expected --scale smoke|small|gpu|paper)"),
        }
    }
    if !["smoke", "small", "gpu", "paper"].contains(&scale.as_str()) {
        bail!("unknown scale `{scale}`: expected one of smoke, small, gpu, paper");
    }
    println!("reproduce (scale: {scale})");
    println!("runtime: {}", gpt_model::runtime::describe());
    println!("\nparts of the paper:");
    print!("{}", experiments::status::report());
    let missing = experiments::status::PARTS.iter().filter(|p| p.missing.is_some()).count();
    println!(
        "\n{missing} of {} parts are not implemented yet: no results were produced, and none are shown.",
        experiments::status::PARTS.len()
    );
    Ok(())
}
