//! AdamW with decoupled weight decay on matrices only, the warm-up + cosine learning-rate schedule,
//! and global-norm gradient clipping.
//!
//! tch's built-in optimisers keep their moments inside libtorch where a checkpoint cannot reach them,
//! so the update is driven from here (the AdamW of Loshchilov & Hutter with PyTorch's bias correction)
//! and its state is plain tensors that the trainer saves and restores exactly. The update itself runs
//! libtorch's fused AdamW kernel (the one `torch.optim.AdamW(fused=True)` runs) and the clipping its
//! multi-tensor ops, through a small C++ shim (`csrc/optim_shim.cpp`; tch does not bind them): one
//! pass over each tensor instead of a dozen ops with a temporary each.

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

/// AdamW's constants.
#[derive(Clone, Copy, Debug)]
struct Hyper {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl Slot {
    /// [`AdamW::step_unfused`]'s update of this slot, at update count `t`.
    fn update_unfused(&self, grad: &Tensor, lr: f64, h: Hyper, t: u64) {
        let bc1 = 1.0 - h.beta1.powi(t as i32);
        let bc2 = 1.0 - h.beta2.powi(t as i32);
        let g = grad.to_kind(Kind::Float);
        let (mut p, mut m, mut v) = (self.param.shallow_clone(), self.m.shallow_clone(), self.v.shallow_clone());
        if self.decay && h.weight_decay > 0.0 {
            let _ = p.g_mul_scalar_(1.0 - lr * h.weight_decay);
        }
        let _ = m.g_mul_scalar_(h.beta1);
        let _ = m.g_add_(&(&g * (1.0 - h.beta1)));
        let _ = v.g_mul_scalar_(h.beta2);
        let _ = v.g_add_(&(g.square() * (1.0 - h.beta2)));
        let denom = (&v / bc2).sqrt() + h.eps;
        let update = (&m / bc1) / denom * lr;
        let _ = p.g_sub_(&update.to_kind(p.kind()));
    }
}

/// The global L2 norm of `grads` (each tensor's in its dtype, their combination in float64).
fn norm_of(grads: &[Tensor]) -> Result<f64, String> {
    let _g = tch::no_grad_guard();
    let mut norm = 0.0;
    shim::check(unsafe { shim::lssa_optim_grad_norm(shim::ptrs(grads).as_ptr(), grads.len(), &mut norm) })?;
    Ok(norm)
}

/// The optimiser shim (`csrc/optim_shim.cpp`): libtorch's fused and multi-tensor kernels.
mod shim {
    use std::ffi::{CStr, c_char, c_void};

    use tch::Tensor;

    unsafe extern "C" {
        pub fn lssa_optim_adamw(
            params: *const *const c_void,
            grads: *const *const c_void,
            exp_avgs: *const *const c_void,
            exp_avg_sqs: *const *const c_void,
            n: usize,
            step: f64,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
        ) -> *mut c_char;
        pub fn lssa_optim_grad_norm(grads: *const *const c_void, n: usize, out: *mut f64) -> *mut c_char;
        pub fn lssa_optim_scale(tensors: *const *const c_void, n: usize, factor: f64) -> *mut c_char;
        pub fn lssa_optim_clear_grads(params: *const *const c_void, n: usize) -> *mut c_char;
        pub fn lssa_optim_gather_grads(
            params: *const *const c_void,
            n: usize,
            sources: *const *const c_void,
            shards: usize,
        ) -> *mut c_char;
        pub fn lssa_optim_free_error(msg: *mut c_char);
    }

    /// The `at::Tensor*` of each tensor (tch's tensors are heap `at::Tensor`s); valid while `ts` lives.
    pub fn ptrs(ts: &[Tensor]) -> Vec<*const c_void> {
        ts.iter().map(|t| t.as_ptr().cast::<c_void>()).collect()
    }

    /// The shim's error message, if any (and releases it).
    pub fn check(err: *mut c_char) -> Result<(), String> {
        if err.is_null() {
            return Ok(());
        }
        // SAFETY: a NUL-terminated string malloc'ed by the shim, released once by the shim's free.
        let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
        unsafe { lssa_optim_free_error(err) };
        Err(format!("optimiser: {msg}"))
    }
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

    /// The gradients' global L2 norm (each tensor's in its dtype, their combination in float64).
    pub fn grad_norm(&self) -> Result<f64, String> {
        norm_of(&self.grads())
    }

    /// Scales every gradient by `max_norm / norm` when `norm > max_norm > 0`; returns the norm before.
    pub fn clip_grad_norm(&self, max_norm: f64) -> Result<f64, String> {
        let grads = self.grads();
        let norm = norm_of(&grads)?;
        if max_norm > 0.0 && norm > max_norm {
            let _g = tch::no_grad_guard();
            let scale = max_norm / (norm + 1e-6);
            shim::check(unsafe { shim::lssa_optim_scale(shim::ptrs(&grads).as_ptr(), grads.len(), scale) })?;
        }
        Ok(norm)
    }

    /// The defined gradients, in slot order (what a data-parallel step averages over ranks).
    pub fn grads(&self) -> Vec<Tensor> {
        self.slots.iter().map(|s| s.param.grad()).filter(Tensor::defined).collect()
    }

    /// One update with learning rate `lr`, libtorch's fused AdamW kernel over every parameter that has
    /// a gradient (the formula of [`AdamW::step_unfused`], the update of `torch.optim.AdamW`); a
    /// parameter whose dtype differs from its moments' (a half-precision parameter) takes the unfused
    /// path.
    pub fn step(&mut self, lr: f64) -> Result<(), String> {
        let _g = tch::no_grad_guard();
        self.t += 1;
        for decay in [true, false] {
            let (mut p, mut g, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for s in self.slots.iter().filter(|s| s.decay == decay) {
                let grad = s.param.grad();
                if !grad.defined() {
                    continue;
                }
                if s.param.kind() != s.m.kind() || grad.kind() != s.m.kind() {
                    s.update_unfused(&grad, lr, self.hyper(), self.t);
                    continue;
                }
                p.push(s.param.shallow_clone());
                g.push(grad);
                m.push(s.m.shallow_clone());
                v.push(s.v.shallow_clone());
            }
            let wd = if decay { self.weight_decay } else { 0.0 };
            let (pp, gp, mp, vp) = (shim::ptrs(&p), shim::ptrs(&g), shim::ptrs(&m), shim::ptrs(&v));
            shim::check(unsafe {
                shim::lssa_optim_adamw(
                    pp.as_ptr(),
                    gp.as_ptr(),
                    mp.as_ptr(),
                    vp.as_ptr(),
                    p.len(),
                    self.t as f64,
                    lr,
                    self.beta1,
                    self.beta2,
                    wd,
                    self.eps,
                )
            })?;
        }
        Ok(())
    }

    /// [`AdamW::step`] written out tensor by tensor:
    /// `p -= lr·wd·p` (matrices), `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g²`,
    /// `p -= lr · (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)`: the definition the fused kernel is
    /// tested against (equal up to float rounding).
    pub fn step_unfused(&mut self, lr: f64) {
        let _g = tch::no_grad_guard();
        self.t += 1;
        for s in &self.slots {
            let g = s.param.grad();
            if g.defined() {
                s.update_unfused(&g, lr, self.hyper(), self.t);
            }
        }
    }

    fn hyper(&self) -> Hyper {
        Hyper { beta1: self.beta1, beta2: self.beta2, eps: self.eps, weight_decay: self.weight_decay }
    }

    /// Drops every gradient (`zero_grad(set_to_none=True)` in PyTorch): the next backward writes fresh
    /// gradients where zeroed ones would be filled and then added to.
    pub fn zero_grad(&mut self) -> Result<(), String> {
        let params: Vec<Tensor> = self.slots.iter().map(|s| s.param.shallow_clone()).collect();
        shim::check(unsafe { shim::lssa_optim_clear_grads(shim::ptrs(&params).as_ptr(), params.len()) })
    }

    /// Sets every parameter's gradient to the sum of the gradients of `shards[s][i]` (each shard's
    /// tensors in slot order) over the shards in order, and drops theirs: the step of one
    /// process's shards (`train::shards`). A shard's undefined gradient adds nothing.
    pub fn gather_grads(&self, shards: &[&[Tensor]]) -> Result<(), String> {
        let params: Vec<Tensor> = self.slots.iter().map(|s| s.param.shallow_clone()).collect();
        let n = params.len();
        if let Some(bad) = shards.iter().find(|s| s.len() != n) {
            return Err(format!("a shard has {} tensors for {n} parameters", bad.len()));
        }
        let pp = shim::ptrs(&params);
        let sp: Vec<_> = shards.iter().flat_map(|s| shim::ptrs(s)).collect();
        shim::check(unsafe { shim::lssa_optim_gather_grads(pp.as_ptr(), n, sp.as_ptr(), shards.len()) })
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
        opt.step(lr).unwrap();
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
        assert!((opt.clip_grad_norm(1.0).unwrap() - 5.0).abs() < 1e-6);
        assert!((opt.grad_norm().unwrap() - 1.0).abs() < 1e-5);
        assert!((opt.clip_grad_norm(2.0).unwrap() - 1.0).abs() < 1e-5, "under the bound: unchanged");
        assert!((opt.grad_norm().unwrap() - 1.0).abs() < 1e-5);
    }

    /// Parameters of several shapes (one unused, so it has no gradient) and their gradients after
    /// `loss = sum_i c_i · sum(p_i²)` with a different `c` per step.
    fn toy(seed: i64) -> (Vec<Tensor>, AdamW) {
        let shapes: [&[i64]; 4] = [&[3, 5], &[7], &[2, 3, 4], &[4]];
        let params: Vec<Tensor> = gpt_model::model::with_seed(seed, || {
            shapes.iter().map(|s| Tensor::randn(*s, (Kind::Float, Device::Cpu)).set_requires_grad(true)).collect()
        });
        let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.shallow_clone())).collect();
        (params, AdamW::new(named, 0.9, 0.95, 1e-8, 0.1))
    }

    fn toy_backward(params: &[Tensor], step: usize) {
        let loss = params[..3]
            .iter()
            .enumerate()
            .map(|(i, p)| (p * p).sum(Kind::Float) * (1.0 + i as f64 + 0.3 * step as f64))
            .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |a, b| a + b);
        loss.backward();
    }

    #[test]
    fn the_fused_update_equals_the_written_out_formula_over_many_steps() {
        let (pf, mut fused) = toy(7);
        let (pu, mut unfused) = toy(7);
        for step in 0..20 {
            let lr = 1e-2 * (1.0 + step as f64 / 10.0);
            fused.zero_grad().unwrap();
            toy_backward(&pf, step);
            fused.step(lr).unwrap();
            for p in &pu {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            toy_backward(&pu, step);
            unfused.step_unfused(lr);
        }
        assert_eq!(fused.t, 20);
        for (a, b) in fused.slots.iter().zip(&unfused.slots) {
            for (x, y) in [(&a.param, &b.param), (&a.m, &b.m), (&a.v, &b.v)] {
                let diff = (x - y).abs().max().double_value(&[]);
                let scale = y.abs().max().double_value(&[]).max(1e-6);
                assert!(diff <= 1e-5 * scale, "{}: fused and written-out differ by {diff} (scale {scale})", a.name);
            }
        }
        // The unused parameter was never touched: no gradient, no decay, zero moments.
        let untouched = &fused.slots[3];
        assert!(!untouched.param.grad().defined());
        assert_eq!(untouched.m.abs().sum(Kind::Float).double_value(&[]), 0.0);
    }

    #[test]
    fn zero_grad_drops_gradients_and_the_next_backward_writes_fresh_ones() {
        let (params, mut opt) = toy(3);
        toy_backward(&params, 0);
        toy_backward(&params, 0); // accumulated: twice the gradient
        let twice = params[0].grad().copy();
        opt.zero_grad().unwrap();
        assert!(params.iter().all(|p| !p.grad().defined()));
        toy_backward(&params, 0);
        let once = params[0].grad();
        assert!((&twice - &once * 2.0).abs().max().double_value(&[]) < 1e-6);
        assert!(opt.grad_norm().unwrap() > 0.0);
    }
}
