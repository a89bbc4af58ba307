//! AdamW with decoupled weight decay on matrices only, the warm-up + cosine learning-rate schedule,
//! and global-norm gradient clipping.
//!
//! tch's built-in optimisers keep their moments inside libtorch where a checkpoint cannot reach them,
//! so the update is written out here (the textbook AdamW of Loshchilov & Hutter with PyTorch's bias
//! correction) and its state is plain tensors that the trainer saves and restores exactly.

use tch::{Kind, Tensor};

/// The learning rate at optimiser step `step` (0-based): linear warm-up from `lr / warmup` to `lr`
/// over `warmup` steps, then a cosine from `lr` to `lr · min_ratio` at the last step.
pub fn lr_at(step: usize, max_steps: usize, warmup: usize, lr: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let decay_steps = max_steps.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f64 / decay_steps as f64).min(1.0);
    let min_lr = lr * min_ratio;
    min_lr + 0.5 * (lr - min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// One parameter and its AdamW moments.
#[derive(Debug)]
pub struct Slot {
    /// The parameter's name in the VarStore.
    pub name: String,
    /// The parameter (shares storage with the model's).
    pub param: Tensor,
    /// First moment.
    pub m: Tensor,
    /// Second moment.
    pub v: Tensor,
    /// Whether weight decay applies (matrices: 2 or more dimensions).
    pub decay: bool,
}

/// AdamW over a fixed list of parameters.
#[derive(Debug)]
pub struct AdamW {
    /// Parameters with their moments, sorted by name.
    pub slots: Vec<Slot>,
    /// Updates applied so far (the bias-correction step count).
    pub t: u64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl AdamW {
    /// Zero moments for every `(name, parameter)`; weight decay on parameters with `dim >= 2`.
    pub fn new(mut params: Vec<(String, Tensor)>, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let slots = params
            .into_iter()
            .map(|(name, param)| {
                let m = param.zeros_like().to_kind(Kind::Float);
                let v = param.zeros_like().to_kind(Kind::Float);
                let decay = param.dim() >= 2;
                Slot { name, param, m, v, decay }
            })
            .collect();
        Self { slots, t: 0, beta1, beta2, eps, weight_decay }
    }

    /// The gradients' global L2 norm.
    pub fn grad_norm(&self) -> f64 {
        let _g = tch::no_grad_guard();
        let sq: f64 = self
            .slots
            .iter()
            .filter(|s| s.param.grad().defined())
            .map(|s| s.param.grad().to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[]))
            .sum();
        sq.sqrt()
    }

    /// Scales every gradient by `max_norm / norm` when `norm > max_norm > 0`; returns the norm before.
    pub fn clip_grad_norm(&self, max_norm: f64) -> f64 {
        let norm = self.grad_norm();
        if max_norm > 0.0 && norm > max_norm {
            let _g = tch::no_grad_guard();
            let scale = max_norm / (norm + 1e-6);
            for s in &self.slots {
                let mut g = s.param.grad();
                if g.defined() {
                    let _ = g.g_mul_scalar_(scale);
                }
            }
        }
        norm
    }

    /// One update with learning rate `lr`:
    /// `p -= lr·wd·p` (matrices), `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g²`,
    /// `p -= lr · (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)`.
    pub fn step(&mut self, lr: f64) {
        let _g = tch::no_grad_guard();
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        for s in &mut self.slots {
            let g = s.param.grad();
            if !g.defined() {
                continue;
            }
            let g = g.to_kind(Kind::Float);
            if s.decay && self.weight_decay > 0.0 {
                let _ = s.param.g_mul_scalar_(1.0 - lr * self.weight_decay);
            }
            let _ = s.m.g_mul_scalar_(self.beta1);
            let _ = s.m.g_add_(&(&g * (1.0 - self.beta1)));
            let _ = s.v.g_mul_scalar_(self.beta2);
            let _ = s.v.g_add_(&(g.square() * (1.0 - self.beta2)));
            let denom = (&s.v / bc2).sqrt() + self.eps;
            let update = (&s.m / bc1) / denom * lr;
            let _ = s.param.g_sub_(&update.to_kind(s.param.kind()));
        }
    }

    /// Sets every gradient to zero.
    pub fn zero_grad(&mut self) {
        for s in &mut self.slots {
            let mut g = s.param.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// The moments as named tensors (`optim.m.<name>`, `optim.v.<name>`) for a checkpoint.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.slots
            .iter()
            .flat_map(|s| {
                [
                    (format!("optim.m.{}", s.name), s.m.shallow_clone()),
                    (format!("optim.v.{}", s.name), s.v.shallow_clone()),
                ]
            })
            .collect()
    }

    /// Restores the moments from [`AdamW::state`]'s names and the step count `t`; every slot must be present.
    pub fn load_state(&mut self, named: &[(String, Tensor)], t: u64) -> Result<(), String> {
        let _g = tch::no_grad_guard();
        let find = |n: &str| named.iter().find(|(k, _)| k == n).map(|(_, v)| v);
        for s in &mut self.slots {
            for (which, dst) in [("m", &mut s.m), ("v", &mut s.v)] {
                let key = format!("optim.{which}.{}", s.name);
                let src = find(&key).ok_or_else(|| format!("missing optimiser state `{key}`"))?;
                if src.size() != dst.size() {
                    return Err(format!(
                        "optimiser state `{key}` has shape {:?}, expected {:?}",
                        src.size(),
                        dst.size()
                    ));
                }
                dst.copy_(&src.to_kind(Kind::Float).to_device(dst.device()));
            }
        }
        self.t = t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let (lr, steps, warm) = (1e-3, 100, 10);
        assert!((lr_at(0, steps, warm, lr, 0.1) - 1e-4).abs() < 1e-15);
        assert!((lr_at(9, steps, warm, lr, 0.1) - lr).abs() < 1e-15);
        assert!((lr_at(10, steps, warm, lr, 0.1) - lr).abs() < 1e-15);
        assert!((lr_at(55, steps, warm, lr, 0.1) - 0.55e-3).abs() < 1e-12, "halfway: mean of peak and floor");
        assert!((lr_at(100, steps, warm, lr, 0.1) - 1e-4).abs() < 1e-15);
        let mut prev = f64::INFINITY;
        for s in warm..steps {
            let x = lr_at(s, steps, warm, lr, 0.1);
            assert!(x <= prev);
            prev = x;
        }
    }

    #[test]
    fn one_step_matches_the_adamw_formula_and_decays_only_matrices() {
        let w = Tensor::from_slice(&[1.0f32, -2.0, 3.0, 0.5]).view([2, 2]).set_requires_grad(true);
        let b = Tensor::from_slice(&[0.5f32, -0.5]).set_requires_grad(true);
        let mut opt =
            AdamW::new(vec![("w".into(), w.shallow_clone()), ("b".into(), b.shallow_clone())], 0.9, 0.95, 1e-8, 0.1);
        // loss = sum(w^2) + sum(3 b): grads 2w and 3.
        let loss = w.square().sum(Kind::Float) + (&b * 3.0).sum(Kind::Float);
        loss.backward();
        let lr = 0.01;
        opt.step(lr);
        // First step: m/bc1 = g, v/bc2 = g^2, so the update is lr * g / (|g| + eps) = lr * sign(g).
        let want_w: Vec<f32> =
            [1.0f32, -2.0, 3.0, 0.5].iter().map(|&x| x * (1.0 - 0.01 * 0.1) - 0.01 * x.signum()).collect();
        let got_w = Vec::<f32>::try_from(w.detach().view([-1])).unwrap();
        for (g, e) in got_w.iter().zip(&want_w) {
            assert!((g - e).abs() < 1e-6, "{got_w:?} vs {want_w:?}");
        }
        let got_b = Vec::<f32>::try_from(b.detach()).unwrap();
        assert!((got_b[0] - 0.49).abs() < 1e-6 && (got_b[1] + 0.51).abs() < 1e-6, "no decay on vectors: {got_b:?}");
        // State round trip.
        let state = opt.state();
        let mut other = AdamW::new(
            vec![
                ("w".into(), Tensor::zeros([2, 2], (Kind::Float, Device::Cpu))),
                ("b".into(), Tensor::zeros([2], (Kind::Float, Device::Cpu))),
            ],
            0.9,
            0.95,
            1e-8,
            0.1,
        );
        other.load_state(&state, opt.t).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(other.slots[1].m.view([-1])).unwrap(),
            Vec::<f32>::try_from(opt.slots[1].m.view([-1])).unwrap()
        );
        assert!(other.load_state(&state[..1], 1).unwrap_err().contains("missing"));
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let w = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        let opt = AdamW::new(vec![("w".into(), w.shallow_clone())], 0.9, 0.95, 1e-8, 0.0);
        (&w * &w.detach()).sum(Kind::Float).backward(); // grad = w = (3, 4), norm 5
        assert!((opt.clip_grad_norm(1.0) - 5.0).abs() < 1e-6);
        assert!((opt.grad_norm() - 1.0).abs() < 1e-5);
    }
}
