//! TEST HELPER, not a user tool: one rank of the multi-process tests in `tests/dist.rs`, started by
//! `trainer::launch::spawn` with torchrun's variables.
//!
//! `dist_selftest <scenario> --expect-world N [--timeout-s S] [--bucket-bytes B]`, scenarios:
//!
//! - `collectives`: broadcast from the first and the last rank, bucketed all-reduce mean over tensors
//!   of several shapes and dtypes (one non-contiguous, one empty, one larger than a bucket), the f64
//!   sum and a barrier; every rank checks the results exactly (the values are multiples of 1/4, so
//!   every sum is exact and the mean is the same division on every side).
//! - `die`: one all-reduce, then rank 1 calls `std::process::exit(3)` and the others try a second one,
//!   which must fail.
//! - `stall`: one all-reduce, then rank 1 sleeps for two minutes and the others try a second one,
//!   which must time out.
//! - `single`: `WORLD_SIZE=1` must give no process group.
//!
//! Exit status 0 means every check passed on this rank.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tch::{Kind, Tensor};
use trainer::dist::{DistEnv, DistOptions, ProcessGroup};

/// The tensors of the all-reduce and broadcast checks: (dtype, shape, transposed after creation).
const SPECS: &[(Kind, &[i64], bool)] = &[
    (Kind::Float, &[3, 5], false),
    (Kind::Float, &[1000], false),
    (Kind::Double, &[7], false),
    (Kind::Float, &[33, 64], true), // a non-contiguous (64, 33) view
    (Kind::Float, &[0], false),
    (Kind::Float, &[40_000], false), // 160 kB: larger than the tests' 4 kB buckets
    (Kind::Double, &[2, 3, 4], false),
    (Kind::Float, &[1], false),
];

/// Rank `rank`'s tensor `k`: element `i` (in storage order) is a multiple of 1/4 in [-2, 2].
fn make(rank: usize, k: usize) -> Tensor {
    let (kind, shape, transposed) = SPECS[k];
    let numel: i64 = shape.iter().product();
    let values: Vec<f64> = (0..numel as usize).map(|i| ((i * 7 + k * 3 + rank * 5) % 17) as f64 * 0.25 - 2.0).collect();
    let t = Tensor::from_slice(&values).to_kind(kind).view_(shape);
    if transposed { t.transpose(0, 1) } else { t }
}

fn make_all(rank: usize) -> Vec<Tensor> {
    (0..SPECS.len()).map(|k| make(rank, k)).collect()
}

fn check_equal(what: &str, got: &[Tensor], want: &[Tensor]) -> Result<()> {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(g.size() == w.size() && g.kind() == w.kind(), "{what}: tensor {k} changed shape or dtype");
        ensure!(
            g.equal(w),
            "{what}: tensor {k} {:?} differs (max |diff| {})",
            w.size(),
            (g - w).abs().max().double_value(&[])
        );
    }
    Ok(())
}

fn collectives(pg: &ProcessGroup) -> Result<()> {
    let (rank, world) = (pg.rank(), pg.world_size());

    for root in [0, world - 1] {
        let tensors = make_all(rank);
        let _ = tensors[0].set_requires_grad(true); // a parameter: written without autograd
        ensure!(tensors[0].requires_grad());
        pg.broadcast_(&tensors, root)?;
        check_equal(&format!("broadcast from {root}"), &tensors, &make_all(root))?;
        ensure!(!tensors[3].is_contiguous(), "the transposed tensor must stay a view");
    }

    let tensors = make_all(rank);
    pg.all_reduce_mean_(&tensors)?;
    let want: Vec<Tensor> = (0..SPECS.len())
        .map(|k| {
            let sum = (1..world).fold(make(0, k), |acc, q| acc + make(q, k)); // exact: multiples of 1/4
            sum / world as f64
        })
        .collect();
    check_equal("all_reduce_mean_", &tensors, &want)?;

    let sum = pg.all_reduce_sum_f64(rank as f64 + 1.0)?;
    ensure!(sum == (world * (world + 1) / 2) as f64, "all_reduce_sum_f64 gave {sum}");

    let err = pg.broadcast_(&tensors, world).expect_err("a root outside the group must be refused");
    ensure!(err.to_string().contains("root"), "unexpected error: {err}");
    pg.barrier()?;
    Ok(())
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().context("usage: dist_selftest <scenario> --expect-world N [options]")?.clone();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let expect_world: usize = flag("--expect-world").context("--expect-world is required")?.parse()?;

    if scenario == "single" {
        ensure!(ProcessGroup::from_env()?.is_none(), "WORLD_SIZE=1 must give no process group");
        return Ok(());
    }
    let env = DistEnv::from_env()?.context("WORLD_SIZE > 1 expected from the launcher")?;
    ensure!(env.world_size == expect_world, "WORLD_SIZE {} but {expect_world} expected", env.world_size);
    let mut options = DistOptions::from_env()?;
    if let Some(s) = flag("--timeout-s") {
        options.timeout = Duration::from_secs_f64(s.parse()?);
    }
    if let Some(b) = flag("--bucket-bytes") {
        options.bucket_bytes = b.parse()?;
    }
    let pg = ProcessGroup::new(env, options)?;
    let rank = pg.rank();

    match scenario.as_str() {
        "collectives" => collectives(&pg)?,
        "die" | "stall" => {
            let grads = make_all(rank);
            pg.all_reduce_mean_(&grads)?;
            if rank == 1 {
                if scenario == "die" {
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_secs(120));
                bail!("rank 1 should have been killed by the launcher while it slept");
            }
            pg.all_reduce_mean_(&grads)?;
            bail!("the second all-reduce succeeded without rank 1");
        }
        other => bail!("unknown scenario {other:?}"),
    }
    Ok(()) // silent on success: the launcher forwards stderr into the test log
}

fn main() {
    if let Err(e) = run() {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}
