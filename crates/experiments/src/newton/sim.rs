//! Newtonian gravity in the plane: n bodies, velocity Verlet (symplectic, second order), the data of
//! the Newton's-law experiment. Units are free; `g` is the gravitational constant of the system.

use rand::Rng;

/// One point mass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Body {
    /// Mass (positive).
    pub mass: f64,
    /// Position.
    pub pos: [f64; 2],
    /// Velocity.
    pub vel: [f64; 2],
}

/// Bodies under mutual gravity.
#[derive(Clone, Debug, PartialEq)]
pub struct System {
    /// The gravitational constant.
    pub g: f64,
    /// The bodies.
    pub bodies: Vec<Body>,
}

/// A simulated orbit, sampled every `dt`.
#[derive(Clone, Debug)]
pub struct Trajectory {
    /// The gravitational constant it was simulated with.
    pub g: f64,
    /// Time between samples.
    pub dt: f64,
    /// The bodies' masses.
    pub masses: Vec<f64>,
    /// Positions, `[sample][body]`.
    pub pos: Vec<Vec<[f64; 2]>>,
    /// Exact accelerations at those positions, `[sample][body]`.
    pub acc: Vec<Vec<[f64; 2]>>,
}

/// The acceleration of every body: `a_i = sum_j g m_j (x_j - x_i) / |x_j - x_i|^3`.
pub fn accelerations(g: f64, bodies: &[Body]) -> Vec<[f64; 2]> {
    let mut acc = vec![[0.0; 2]; bodies.len()];
    for i in 0..bodies.len() {
        for j in i + 1..bodies.len() {
            let d = [bodies[j].pos[0] - bodies[i].pos[0], bodies[j].pos[1] - bodies[i].pos[1]];
            let r2 = d[0] * d[0] + d[1] * d[1];
            let inv_r3 = 1.0 / (r2 * r2.sqrt());
            for c in 0..2 {
                acc[i][c] += g * bodies[j].mass * d[c] * inv_r3;
                acc[j][c] -= g * bodies[i].mass * d[c] * inv_r3;
            }
        }
    }
    acc
}

/// Kinetic plus potential energy.
pub fn energy(system: &System) -> f64 {
    let b = &system.bodies;
    let mut e: f64 = b.iter().map(|b| 0.5 * b.mass * (b.vel[0] * b.vel[0] + b.vel[1] * b.vel[1])).sum();
    for i in 0..b.len() {
        for j in i + 1..b.len() {
            e -= system.g * b[i].mass * b[j].mass / distance(b[i].pos, b[j].pos);
        }
    }
    e
}

/// Total momentum.
pub fn momentum(system: &System) -> [f64; 2] {
    let mut p = [0.0; 2];
    for b in &system.bodies {
        p[0] += b.mass * b.vel[0];
        p[1] += b.mass * b.vel[1];
    }
    p
}

/// Euclidean distance.
pub fn distance(a: [f64; 2], b: [f64; 2]) -> f64 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sqrt()
}

/// Advances `system` by `samples - 1` intervals of `dt` (each split into `substeps` Verlet steps) and
/// returns the `samples` states, the first being the initial one. `system` ends at the last state.
pub fn simulate(system: &mut System, dt: f64, samples: usize, substeps: usize) -> Trajectory {
    assert!(dt > 0.0 && substeps > 0, "dt and substeps must be positive");
    let h = dt / substeps as f64;
    let mut acc = accelerations(system.g, &system.bodies);
    let mut traj = Trajectory {
        g: system.g,
        dt,
        masses: system.bodies.iter().map(|b| b.mass).collect(),
        pos: Vec::with_capacity(samples),
        acc: Vec::with_capacity(samples),
    };
    for s in 0..samples {
        traj.pos.push(system.bodies.iter().map(|b| b.pos).collect());
        traj.acc.push(acc.clone());
        if s + 1 == samples {
            break;
        }
        for _ in 0..substeps {
            for (b, a) in system.bodies.iter_mut().zip(&acc) {
                for c in 0..2 {
                    b.vel[c] += 0.5 * h * a[c];
                    b.pos[c] += h * b.vel[c];
                }
            }
            acc = accelerations(system.g, &system.bodies);
            for (b, a) in system.bodies.iter_mut().zip(&acc) {
                for c in 0..2 {
                    b.vel[c] += 0.5 * h * a[c];
                }
            }
        }
    }
    traj
}

/// A random bound two-body system in its centre-of-mass frame: a primary of mass in [1, 10), a
/// companion of mass in [0.01, 1) (log-uniform), separation in [0.5, 2) and a tangential relative
/// velocity 0.8..1.2 times the circular one (eccentricity up to 0.44).
pub fn random_two_body(rng: &mut impl Rng, g: f64) -> System {
    let log_uniform = |rng: &mut dyn rand::RngCore, lo: f64, hi: f64| (rng.random_range(lo.ln()..hi.ln())).exp();
    let m1 = log_uniform(rng, 1.0, 10.0);
    let m2 = log_uniform(rng, 0.01, 1.0);
    let r = log_uniform(rng, 0.5, 2.0);
    let speed = (g * (m1 + m2) / r).sqrt() * rng.random_range(0.8..1.2);
    let angle: f64 = rng.random_range(0.0..std::f64::consts::TAU);
    let (sin, cos) = angle.sin_cos();
    // Relative position r along `angle`, relative velocity perpendicular; split by the mass ratio.
    let (w1, w2) = (m2 / (m1 + m2), m1 / (m1 + m2));
    let rel_pos = [r * cos, r * sin];
    let rel_vel = [-speed * sin, speed * cos];
    System {
        g,
        bodies: vec![
            Body { mass: m1, pos: [-w1 * rel_pos[0], -w1 * rel_pos[1]], vel: [-w1 * rel_vel[0], -w1 * rel_vel[1]] },
            Body { mass: m2, pos: [w2 * rel_pos[0], w2 * rel_pos[1]], vel: [w2 * rel_vel[0], w2 * rel_vel[1]] },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_circular_orbit_has_keplers_period_and_conserves_energy_and_momentum() {
        // A light body on a circle of radius 1 around a unit mass: period 2 pi sqrt(r^3 / (g M)).
        let (g, m, r) = (1.0f64, 1.0, 1.0);
        let v = (g * m / r).sqrt();
        let mut sys = System {
            g,
            bodies: vec![
                Body { mass: m, pos: [0.0, 0.0], vel: [0.0, 0.0] },
                Body { mass: 1e-9, pos: [r, 0.0], vel: [0.0, v] },
            ],
        };
        let period = std::f64::consts::TAU * (r.powi(3) / (g * m)).sqrt();
        let (e0, p0) = (energy(&sys), momentum(&sys));
        let n = 1000;
        let traj = simulate(&mut sys, period / n as f64, n + 1, 20);
        let end = traj.pos[n][1];
        assert!(distance(end, [r, 0.0]) < 1e-4, "after one period the body is back at (1, 0): {end:?}");
        let quarter = traj.pos[n / 4][1];
        assert!(distance(quarter, [0.0, r]) < 1e-4, "a quarter period: {quarter:?}");
        assert!((energy(&sys) - e0).abs() < 1e-9 * e0.abs().max(1e-9), "energy {} -> {}", e0, energy(&sys));
        let p1 = momentum(&sys);
        assert!((p1[0] - p0[0]).abs() < 1e-12 && (p1[1] - p0[1]).abs() < 1e-12);
    }

    #[test]
    fn accelerations_are_newtons_law() {
        let bodies = [
            Body { mass: 2.0, pos: [0.0, 0.0], vel: [0.0; 2] },
            Body { mass: 3.0, pos: [0.0, 2.0], vel: [0.0; 2] },
            Body { mass: 5.0, pos: [4.0, 0.0], vel: [0.0; 2] },
        ];
        let a = accelerations(0.5, &bodies);
        // Body 0: 0.5*3/4 towards +y, 0.5*5/16 towards +x.
        assert!((a[0][0] - 0.5 * 5.0 / 16.0).abs() < 1e-15 && (a[0][1] - 0.5 * 3.0 / 4.0).abs() < 1e-15);
        // Newton's third law: sum of m_i a_i is zero.
        for c in 0..2 {
            let f: f64 = bodies.iter().zip(&a).map(|(b, a)| b.mass * a[c]).sum();
            assert!(f.abs() < 1e-14, "{f}");
        }
    }

    #[test]
    fn random_two_body_systems_are_bound_and_centred() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..50 {
            let sys = random_two_body(&mut rng, 1.0);
            assert!(energy(&sys) < 0.0, "bound orbit");
            let p = momentum(&sys);
            assert!(p[0].abs() < 1e-12 && p[1].abs() < 1e-12);
            let com: f64 = sys.bodies.iter().map(|b| b.mass * b.pos[0]).sum();
            assert!(com.abs() < 1e-12);
        }
    }
}
