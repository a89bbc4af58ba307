//! The retrieval benchmark's task cells and their plans, and a stopped training's continuation.

use super::*;

/// A training stopped at a step saves its weights and moments; the next call continues from
/// there and ends with the answers and losses of an uninterrupted training, bit for bit.
#[test]
fn a_stopped_training_continues_to_the_uninterrupted_result() {
    let s = Settings::for_scale("smoke");
    let v: crate::spec::TrainedVariant = "lssa".parse().unwrap();
    let whole = train_and_evaluate(&s, &v, 1, &[None], None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let partial = recipe::Partial { path: dir.path().join("p.safetensors"), provenance: "test".into() };
    let flag = trainer::process::StopFlag::new_static();
    let stop = Stopping { flag, partial: &partial, at_step: Some(5) };
    let err = train_and_evaluate(&s, &v, 1, &[None], Some(&stop)).unwrap_err();
    let stopped = err.downcast_ref::<trainer::train::Preempted>().expect("a pre-emption");
    assert_eq!(stopped.step, 5);
    assert!(partial.path.exists());
    // Another provenance (code or settings) does not continue it: it starts again, so a stop
    // at step 3 is reached.
    let copy = dir.path().join("q.safetensors");
    std::fs::copy(&partial.path, &copy).unwrap();
    let other = recipe::Partial { path: copy, provenance: "other".into() };
    let again = Stopping { flag, partial: &other, at_step: Some(3) };
    let err = train_and_evaluate(&s, &v, 1, &[None], Some(&again)).unwrap_err();
    assert_eq!(err.downcast_ref::<trainer::train::Preempted>().unwrap().step, 3);
    // The same provenance continues from step 5, so a stop at step 2 is never reached.
    let go_on = Stopping { flag, partial: &partial, at_step: Some(2) };
    let rest = train_and_evaluate(&s, &v, 1, &[None], Some(&go_on)).unwrap();
    assert_eq!(rest.answers, whole.answers);
    assert_eq!(rest.train_loss.to_bits(), whole.train_loss.to_bits(), "{} vs {}", rest.train_loss, whole.train_loss);
    assert_eq!(rest.recipe, whole.recipe);
}

#[test]
fn the_grid_is_two_placements_by_two_densities_and_ablations_run_where_marked() {
    let all = regimes().unwrap();
    let grid: Vec<(Placement, u32)> = all.iter().map(|r| (r.placement, r.distractors_permille)).collect();
    for cell in [(Placement::Spread, 0), (Placement::Spread, 250), (Placement::Far, 0), (Placement::Far, 250)] {
        assert!(grid.contains(&cell), "{cell:?} is missing from the grid");
    }
    assert_eq!(all.iter().filter(|r| r.ablations).count(), 1, "the pilot chose one regime for the ablations");
    let mut e = crate::spec::all().unwrap().into_iter().find(|e| e.kind == Kind::Retrieval).unwrap();
    let ablations: Vec<String> = e.rows.iter().filter(|r| r.ablation).map(|r| r.train.to_string()).collect();
    assert_eq!(ablations, ["lssa-exp", "softmax-logn"]);
    // `--all`: every cell, every row in every GPT-2 cell (the ablations not in the recipe cells),
    // each cell's own settings.
    let all = plans(&e, "small").unwrap();
    assert_eq!(all.len(), super::cells().unwrap().len());
    for p in &all {
        let gpt2 = p.regime.init() == Init::Gpt2;
        assert_eq!(p.settings.recipe.init, p.regime.init(), "{}", p.regime.name);
        assert_eq!(ablations.iter().all(|v| p.rows.contains_key(v.as_str())), gpt2, "{}", p.regime.name);
        assert_eq!(
            (p.settings.placement, p.settings.density_permille),
            (p.regime.placement, p.regime.distractors_permille)
        );
        assert_eq!(p.rows["lssa"], [None, Some(15)], "LSSA is also read with p = 15 post hoc");
    }
    // Both initialisations in the two regimes without distractors (the recipe axis).
    for r in ["spread-0", "far-0"] {
        for name in [r.to_string(), format!("{r}@torch-default")] {
            assert!(all.iter().any(|p| p.regime.name == name), "no cell {name}");
        }
    }
    // The default: the regimes not marked `all_only`, the ablations only where marked.
    e.scope = Scope::Headline;
    let default = plans(&e, "small").unwrap();
    assert!(default.iter().all(|p| !p.regime.all_only) && default.len() < all.len());
    for p in default {
        assert_eq!(ablations.iter().all(|v| p.rows.contains_key(v.as_str())), p.regime.ablations, "{}", p.regime.name);
        assert!(["softmax", "lssa", "lssa+rw15"].iter().all(|v| p.rows.contains_key(*v)));
    }
}
