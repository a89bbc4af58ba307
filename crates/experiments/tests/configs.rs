//! `configs/*.toml` are the reproduction scales' training recipes, so `trainer train --config
//! configs/small.toml` trains what `cargo xtask reproduce` trains (one variant, one seed).
//! `LSSA_BLESS_CONFIGS=1 cargo test -p experiments --test configs` rewrites them from the scales.

use std::path::{Path, PathBuf};

use experiments::scale::{Data, Scale};
use trainer::config::TrainConfig;

fn header(name: &str, scale: &Scale) -> String {
    format!(
        "# The `{name}` scale's training recipe, as `cargo xtask reproduce --scale {name}` trains each of its\n\
         # runs (crates/experiments/src/scale.rs; a test keeps the two equal):\n\
         # {}.\n\
         # For example:\n\
         #   trainer train --config configs/{name}.toml --set model.attention=lssa+rw15 --out-dir runs/lssar\n\
         # Every key is documented in crates/trainer/src/config.rs; `--set key=value` overrides any of them.\n\n",
        scale.about
    )
}

#[test]
fn shipped_configs_are_the_scales_recipes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for name in ["small", "small-short", "gpu", "paper"] {
        let scale = Scale::by_name(name).unwrap();
        let mut want = scale.train.clone();
        want.data_dir = match &scale.data {
            Data::Shards(d) => d.clone(),
            Data::Generated => unreachable!("{name} trains on shards"),
        };
        want.out_dir = PathBuf::from(format!("runs/{name}-train"));
        let path = root.join("configs").join(format!("{name}.toml"));
        if std::env::var_os("LSSA_BLESS_CONFIGS").is_some() {
            std::fs::write(&path, header(name, &scale) + &want.to_toml()).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let got = TrainConfig::from_toml_with_overrides(&text, &path.display().to_string(), &[]).unwrap();
        assert_eq!(
            got.to_toml(),
            want.to_toml(),
            "{} differs from the {name} scale (rewrite it with LSSA_BLESS_CONFIGS=1)",
            path.display()
        );
    }
}

/// The default scale's validation protocol is `trainer eval`'s defaults (65536 targets, spans of
/// 16 x T_train: the longest of its default lengths 1, 2, 4, 8, 16), so `trainer eval` on a
/// reproduction run's checkpoint prints the loss the report reads (the two call the same
/// `trainer::eval::ValidationSet`).
#[test]
fn the_default_reproduction_scores_what_trainer_eval_scores() {
    let small = Scale::by_name("small").unwrap();
    assert_eq!(small.val_targets, trainer::eval::DEFAULT_VAL_TARGETS);
    let plan = experiments::claims::all().unwrap().plan();
    let longest = plan.values().flatten().map(|k| k.multiple).max().unwrap();
    assert_eq!(longest, 16, "the headline plan's spans are 16 x T_train, as trainer eval's default lengths");
}
