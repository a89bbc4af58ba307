//! Data parallelism over libtorch's own c10d engine: a TCPStore rendezvous, a Gloo process group
//! (CPU tensors) and, in builds with the NCCL headers, an NCCL one (CUDA tensors).
//!
//! # Runbook
//!
//! Every rank runs the same binary; the environment says which rank it is. Two launchers set it:
//!
//! ```text
//! # torchrun (Python), one node, N processes; --no-python runs the binary itself:
//! torchrun --standalone --nproc-per-node=N --no-python target/release/trainer <trainer args>
//! # the trainer's own launcher, no Python needed (see `crate::launch`):
//! target/release/trainer --nproc-per-node N <trainer args>
//! # several nodes with torchrun: on every node, instead of --standalone,
//! #   --nnodes=M --rdzv-backend=c10d --rdzv-endpoint=<node 0 host>:29400 --rdzv-id=<job name>
//! ```
//!
//! `tests/ddp.rs` runs the last form with two nodes on one machine (the torchrun of the venv the
//! linked libtorch came from) and checks that they train exactly as one process with their global
//! batch does.
//!
//! Variables read (torchrun's names): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`
//! (optional), `MASTER_ADDR`, `MASTER_PORT`, and `TORCHELASTIC_USE_AGENT_STORE` /
//! `TORCHELASTIC_RESTART_COUNT`: with `TORCHELASTIC_USE_AGENT_STORE=True` torchrun's agent already
//! hosts the TCPStore, so every rank connects as a client and keeps its keys under
//! `/worker/attempt_<restart count>` (what `torch.distributed` does); otherwise rank 0 hosts it.
//! `GLOO_SOCKET_IFNAME` picks the network interface for Gloo (the first one if several are listed);
//! otherwise Gloo binds to 127.0.0.1 when `MASTER_ADDR` is a loopback address and to the address
//! this machine's hostname resolves to otherwise. Knobs of this module: `LSSA_DIST_TIMEOUT_S`
//! (default 300; the bound on every connect, collective and store wait) and `LSSA_DIST_BUCKET_MB`
//! (default 25; the all-reduce bucket size).
//!
//! `WORLD_SIZE` unset or `1` means a single process: [`ProcessGroup::from_env`] returns `None` and the
//! trainer runs without any of this. The trainer uses `LOCAL_RANK` to pick `cuda:LOCAL_RANK`.
//!
//! # Design
//!
//! The collectives are libtorch's (`c10d::ProcessGroupGloo`, `ProcessGroupNCCL`), reached through a
//! small C++ shim (`csrc/dist_shim.cpp`; ARCHITECTURE.md describes what crosses it). This module adds
//! what Python's DDP adds on top: gradients are flattened into buckets of about
//! [`DistOptions::bucket_bytes`] (consecutive tensors of one dtype and device), one all-reduce per
//! bucket, divided by the world size and copied back. The cost of this simplicity: no overlap of
//! communication with the backward pass (the all-reduce runs after `backward()` returns), and one
//! extra copy of the gradients per step. Every operation blocks until its work has finished or the
//! timeout has passed; after an error the group is unusable and the rank should exit (the launcher
//! then stops the others).
//!
//! All ranks must call the same operations, in the same order, with tensors of the same shapes,
//! dtypes and device types; that is the contract of every collective library.

use std::ffi::{CStr, CString, c_char};
use std::net::IpAddr;
use std::ops::Range;
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Kind, Tensor};

/// Default bound on every connect, collective and store wait (`LSSA_DIST_TIMEOUT_S`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default all-reduce bucket size (`LSSA_DIST_BUCKET_MB`): PyTorch DDP's default, 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Errors of the distributed layer. Every variant raised by a [`ProcessGroup`] names the operation and
/// the rank that saw it.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A variable the rendezvous needs is missing.
    #[error("{var} is not set ({why})")]
    MissingEnv {
        /// The variable.
        var: &'static str,
        /// Why it is needed.
        why: &'static str,
    },
    /// A variable holds a value that cannot be used.
    #[error("{var}={value:?}: {reason}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TCPStore rendezvous or the process group creation failed (or timed out).
    #[error("rank {rank}: creating the process group (store at {addr}:{port}) failed: {message}")]
    Init {
        /// This process's rank.
        rank: usize,
        /// The store's host.
        addr: String,
        /// The store's port.
        port: u16,
        /// libtorch's message.
        message: String,
    },
    /// A collective failed: a peer died, timed out, or libtorch rejected the input.
    #[error("rank {rank}: {op} failed: {message}")]
    Collective {
        /// The operation (`broadcast`, `all_reduce`, `barrier`).
        op: &'static str,
        /// This process's rank.
        rank: usize,
        /// libtorch's message.
        message: String,
    },
    /// An argument was rejected before anything was sent.
    #[error("rank {rank}: {op}: {what}")]
    Argument {
        /// The operation.
        op: &'static str,
        /// This process's rank.
        rank: usize,
        /// What is wrong, naming the argument.
        what: String,
    },
    /// A CUDA tensor reached a build whose shim was compiled without NCCL.
    #[error(
        "rank {rank}: {op} on a CUDA tensor: built without NCCL (the c10d shim is compiled with NCCL \
         only when the CUDA and NCCL headers are found; see crates/trainer/build.rs)"
    )]
    NoNccl {
        /// The operation.
        op: &'static str,
        /// This process's rank.
        rank: usize,
    },
    /// A tensor operation around a collective (flattening, copying back) failed.
    #[error("rank {rank}: {op}: {source}")]
    Tensor {
        /// The operation.
        op: &'static str,
        /// This process's rank.
        rank: usize,
        /// tch's error.
        source: tch::TchError,
    },
}

/// Who hosts the TCPStore the ranks meet at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0 hosts it at `MASTER_ADDR:MASTER_PORT` (the built-in launcher, plain env).
    Rank0Hosts,
    /// torchrun's agent hosts it (`TORCHELASTIC_USE_AGENT_STORE=True`); every rank is a client and
    /// keys live under `/worker/attempt_<restart_count>`.
    AgentStore {
        /// `TORCHELASTIC_RESTART_COUNT`.
        restart_count: u32,
    },
}

/// Which network device Gloo binds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlooDevice {
    /// The address this machine's hostname resolves to (loopback if it does not resolve).
    Default,
    /// A hostname or address (used for loopback rendezvous).
    Hostname(String),
    /// A network interface (`GLOO_SOCKET_IFNAME`).
    Interface(String),
}

/// The rendezvous described by the environment (torchrun's variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    /// `RANK`: this process's index among all processes.
    pub rank: usize,
    /// `WORLD_SIZE`: the number of processes, at least 2 here.
    pub world_size: usize,
    /// `LOCAL_RANK`: the index on this node (the CUDA device to use).
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`, when set: the number of processes on this node.
    pub local_world_size: Option<usize>,
    /// `MASTER_ADDR`: the TCPStore's host.
    pub master_addr: String,
    /// `MASTER_PORT`: the TCPStore's port.
    pub master_port: u16,
    /// Who hosts the store.
    pub rendezvous: Rendezvous,
    /// Where Gloo binds.
    pub gloo_device: GlooDevice,
}

impl DistEnv {
    /// Reads the process environment; see [`DistEnv::from_vars`].
    pub fn from_env() -> Result<Option<Self>, DistError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Parses torchrun's variables from `get` (a lookup by name). `Ok(None)` when `WORLD_SIZE` is
    /// unset or 1 (a single process). Errors name the variable and its value.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, DistError> {
        let get = |var: &str| get(var).map(|v| v.trim().to_string());
        let Some(world) = get("WORLD_SIZE") else { return Ok(None) };
        let world_size: usize = parse("WORLD_SIZE", &world)?;
        if world_size == 0 {
            return Err(bad("WORLD_SIZE", &world, "must be at least 1"));
        }
        if world_size == 1 {
            return Ok(None);
        }
        let required = |var: &'static str| {
            get(var).ok_or(DistError::MissingEnv { var, why: "WORLD_SIZE > 1 needs the whole rendezvous" })
        };
        let rank_s = required("RANK")?;
        let rank: usize = parse("RANK", &rank_s)?;
        if rank >= world_size {
            return Err(bad("RANK", &rank_s, &format!("must be below WORLD_SIZE={world_size}")));
        }
        let local_rank: usize = parse("LOCAL_RANK", &required("LOCAL_RANK")?)?;
        let local_world_size = match get("LOCAL_WORLD_SIZE") {
            Some(v) => {
                let n: usize = parse("LOCAL_WORLD_SIZE", &v)?;
                if local_rank >= n {
                    return Err(bad(
                        "LOCAL_RANK",
                        &local_rank.to_string(),
                        &format!("must be below LOCAL_WORLD_SIZE={n}"),
                    ));
                }
                Some(n)
            }
            None => None,
        };
        let master_addr = required("MASTER_ADDR")?;
        if master_addr.is_empty() {
            return Err(bad("MASTER_ADDR", &master_addr, "must name a host"));
        }
        let port_s = required("MASTER_PORT")?;
        let master_port: u16 = parse("MASTER_PORT", &port_s)?;
        if master_port == 0 {
            return Err(bad("MASTER_PORT", &port_s, "must be a port in 1..=65535"));
        }
        // torch.distributed compares with str(True) exactly.
        let rendezvous = if get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True") {
            let count = get("TORCHELASTIC_RESTART_COUNT").ok_or(DistError::MissingEnv {
                var: "TORCHELASTIC_RESTART_COUNT",
                why: "TORCHELASTIC_USE_AGENT_STORE=True keys the store by restart attempt",
            })?;
            Rendezvous::AgentStore { restart_count: parse("TORCHELASTIC_RESTART_COUNT", &count)? }
        } else {
            Rendezvous::Rank0Hosts
        };
        let gloo_device = match get("GLOO_SOCKET_IFNAME") {
            Some(names) if !names.is_empty() => {
                GlooDevice::Interface(names.split(',').next().unwrap_or_default().trim().to_string())
            }
            _ if master_addr == "localhost" => GlooDevice::Hostname("127.0.0.1".into()),
            _ if master_addr.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()) => {
                GlooDevice::Hostname(master_addr.clone())
            }
            _ => GlooDevice::Default,
        };
        Ok(Some(Self {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            rendezvous,
            gloo_device,
        }))
    }

    /// Whether this rank runs the TCPStore server.
    pub fn hosts_store(&self) -> bool {
        self.rank == 0 && self.rendezvous == Rendezvous::Rank0Hosts
    }

    /// The key prefix on the store (torchrun's per-attempt prefix, or none).
    pub fn store_prefix(&self) -> String {
        match self.rendezvous {
            Rendezvous::Rank0Hosts => String::new(),
            Rendezvous::AgentStore { restart_count } => format!("/worker/attempt_{restart_count}"),
        }
    }
}

fn bad(var: &'static str, value: &str, reason: &str) -> DistError {
    DistError::BadEnv { var, value: value.to_string(), reason: reason.to_string() }
}

fn parse<T: std::str::FromStr>(var: &'static str, value: &str) -> Result<T, DistError>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e: T::Err| bad(var, value, &format!("not a valid number ({e})")))
}

/// Tuning knobs of the process group (not part of the rendezvous).
#[derive(Debug, Clone, PartialEq)]
pub struct DistOptions {
    /// Bound on every connect, collective and store wait. Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Target size of one all-reduce bucket in bytes; a larger tensor gets a bucket of its own.
    /// Default [`DEFAULT_BUCKET_BYTES`].
    pub bucket_bytes: usize,
}

impl Default for DistOptions {
    fn default() -> Self {
        Self { timeout: DEFAULT_TIMEOUT, bucket_bytes: DEFAULT_BUCKET_BYTES }
    }
}

impl DistOptions {
    /// Defaults overridden by `LSSA_DIST_TIMEOUT_S` (seconds, fractions allowed) and
    /// `LSSA_DIST_BUCKET_MB` (MiB, fractions allowed).
    pub fn from_env() -> Result<Self, DistError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`DistOptions::from_env`] with the variables looked up by `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, DistError> {
        let mut options = Self::default();
        if let Some(v) = get("LSSA_DIST_TIMEOUT_S") {
            let secs: f64 = parse("LSSA_DIST_TIMEOUT_S", v.trim())?;
            if !(secs > 0.0 && secs < 1e9) {
                return Err(bad("LSSA_DIST_TIMEOUT_S", &v, "must be a positive number of seconds"));
            }
            options.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = get("LSSA_DIST_BUCKET_MB") {
            let mb: f64 = parse("LSSA_DIST_BUCKET_MB", v.trim())?;
            if !(mb > 0.0 && mb < 1e6) {
                return Err(bad("LSSA_DIST_BUCKET_MB", &v, "must be a positive number of MiB"));
            }
            options.bucket_bytes = ((mb * (1 << 20) as f64) as usize).max(1);
        }
        Ok(options)
    }
}

mod ffi {
    use std::ffi::{c_char, c_void};

    /// `LssaDistInit` in csrc/dist_shim.cpp, field for field.
    #[repr(C)]
    pub struct Init {
        pub master_addr: *const c_char,
        pub store_prefix: *const c_char,
        pub gloo_device_arg: *const c_char,
        pub timeout_ms: i64,
        pub rank: i32,
        pub world_size: i32,
        pub host_store: i32,
        pub gloo_device_kind: i32,
        pub master_port: u16,
    }

    /// `LssaDistPg`: opaque, owned by the shim.
    #[repr(C)]
    pub struct Pg {
        _private: [u8; 0],
    }

    unsafe extern "C" {
        pub fn lssa_dist_init_size() -> usize;
        pub fn lssa_dist_has_nccl() -> i32;
        pub fn lssa_dist_new(init: *const Init, out: *mut *mut Pg) -> *mut c_char;
        pub fn lssa_dist_free(pg: *mut Pg);
        pub fn lssa_dist_broadcast(pg: *mut Pg, tensor: *const c_void, root: i32) -> *mut c_char;
        pub fn lssa_dist_all_reduce_sum(pg: *mut Pg, tensor: *const c_void) -> *mut c_char;
        pub fn lssa_dist_barrier(pg: *mut Pg) -> *mut c_char;
        pub fn lssa_dist_free_error(msg: *mut c_char);
    }
}

/// Takes the shim's error string, if any, releasing it.
fn take_error(err: *mut c_char) -> Option<String> {
    if err.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string malloc'ed by the shim, released once by the shim's free.
    let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { ffi::lssa_dist_free_error(err) };
    Some(msg)
}

/// A c10d process group: this rank's membership of the job. Dropping it releases the group (and the
/// TCPStore server on the rank that hosts it).
pub struct ProcessGroup {
    raw: NonNull<ffi::Pg>,
    env: DistEnv,
    options: DistOptions,
}

// SAFETY: the shim's handle is not tied to the creating thread (c10d objects are used from any
// thread; their work runs on c10d's own threads). `ProcessGroup` is deliberately not `Sync`:
// collectives must be issued in one order, which one `&self` at a time guarantees.
unsafe impl Send for ProcessGroup {}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup").field("env", &self.env).field("options", &self.options).finish()
    }
}

impl ProcessGroup {
    /// Joins the job described by the environment ([`DistEnv::from_env`], [`DistOptions::from_env`]).
    /// `Ok(None)` for a single process (`WORLD_SIZE` unset or 1). Blocks until every rank has joined
    /// or the timeout has passed.
    pub fn from_env() -> Result<Option<Self>, DistError> {
        let Some(env) = DistEnv::from_env()? else { return Ok(None) };
        Self::new(env, DistOptions::from_env()?).map(Some)
    }

    /// Joins the job described by `env`: connects to (or hosts) the TCPStore and creates the Gloo
    /// group, all bounded by `options.timeout`.
    pub fn new(env: DistEnv, options: DistOptions) -> Result<Self, DistError> {
        let init_err = |message: String| DistError::Init {
            rank: env.rank,
            addr: env.master_addr.clone(),
            port: env.master_port,
            message,
        };
        // SAFETY: no arguments; reads a constant.
        let c_size = unsafe { ffi::lssa_dist_init_size() };
        if c_size != std::mem::size_of::<ffi::Init>() {
            return Err(init_err(format!(
                "the shim's LssaDistInit is {c_size} bytes but Rust's is {} (csrc/dist_shim.cpp and src/dist.rs disagree)",
                std::mem::size_of::<ffi::Init>()
            )));
        }
        let cstring = |s: &str| CString::new(s).map_err(|_| init_err(format!("{s:?} contains a NUL byte")));
        let addr = cstring(&env.master_addr)?;
        let prefix = cstring(&env.store_prefix())?;
        let (kind, arg) = match &env.gloo_device {
            GlooDevice::Default => (0, String::new()),
            GlooDevice::Hostname(h) => (1, h.clone()),
            GlooDevice::Interface(i) => (2, i.clone()),
        };
        let device_arg = cstring(&arg)?;
        let to_i32 = |v: usize, what: &str| i32::try_from(v).map_err(|_| init_err(format!("{what} {v} is too large")));
        let init = ffi::Init {
            master_addr: addr.as_ptr(),
            store_prefix: prefix.as_ptr(),
            gloo_device_arg: device_arg.as_ptr(),
            timeout_ms: i64::try_from(options.timeout.as_millis()).unwrap_or(i64::MAX).max(1),
            rank: to_i32(env.rank, "rank")?,
            world_size: to_i32(env.world_size, "world size")?,
            host_store: i32::from(env.hosts_store()),
            gloo_device_kind: kind,
            master_port: env.master_port,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `init` and the strings it points to outlive the call (the shim copies them);
        // `raw` receives a handle owned by the returned value.
        let err = unsafe { ffi::lssa_dist_new(&init, &mut raw) };
        if let Some(message) = take_error(err) {
            return Err(init_err(message));
        }
        let raw = NonNull::new(raw).ok_or_else(|| init_err("the shim returned no process group".into()))?;
        Ok(Self { raw, env, options })
    }

    /// Whether this build's shim has NCCL (collectives on CUDA tensors).
    pub fn has_nccl() -> bool {
        // SAFETY: no arguments; reads a constant.
        unsafe { ffi::lssa_dist_has_nccl() != 0 }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.env.rank
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.env.world_size
    }

    /// This process's index on its node (the CUDA device it should use).
    pub fn local_rank(&self) -> usize {
        self.env.local_rank
    }

    /// Whether this is rank 0 (the one that logs and writes checkpoints).
    pub fn is_main(&self) -> bool {
        self.env.rank == 0
    }

    /// The rendezvous this group was created from.
    pub fn env(&self) -> &DistEnv {
        &self.env
    }

    /// The options this group runs with.
    pub fn options(&self) -> &DistOptions {
        &self.options
    }

    /// Overwrites every tensor, in place, with rank `root`'s (used for the initial parameters from
    /// rank 0). Tensors may require grad (they are written without autograd) and need not be
    /// contiguous; they travel in buckets like [`ProcessGroup::all_reduce_mean_`].
    pub fn broadcast_(&self, tensors: &[Tensor], root: usize) -> Result<(), DistError> {
        const OP: &str = "broadcast";
        if root >= self.world_size() {
            return Err(self.argument(OP, format!("root {root} is not below the world size {}", self.world_size())));
        }
        let root = root as i32; // < world_size, which fits in i32 (checked in `new`)
        self.bucketed(OP, tensors, false, |flat| {
            // SAFETY: `flat` is a live tch tensor (an `at::Tensor*`) for the whole call.
            self.check(OP, unsafe { ffi::lssa_dist_broadcast(self.raw.as_ptr(), flat.as_ptr().cast(), root) })
        })
    }

    /// Replaces every tensor, in place, by its mean over the ranks (gradients after `backward()`).
    /// Tensors are flattened into buckets of about [`DistOptions::bucket_bytes`] (consecutive tensors
    /// of one dtype and device), one all-reduce (sum) per bucket, divided by the world size and
    /// copied back. Floating-point tensors only.
    pub fn all_reduce_mean_(&self, tensors: &[Tensor]) -> Result<(), DistError> {
        const OP: &str = "all_reduce";
        if let Some(i) = tensors.iter().position(|t| t.defined() && !t.is_floating_point()) {
            return Err(
                self.argument(OP, format!("tensor {i} has dtype {:?}; a mean needs floating point", tensors[i].kind()))
            );
        }
        self.bucketed(OP, tensors, true, |flat| {
            // SAFETY: `flat` is a live tch tensor (an `at::Tensor*`) for the whole call.
            self.check(OP, unsafe { ffi::lssa_dist_all_reduce_sum(self.raw.as_ptr(), flat.as_ptr().cast()) })
        })
    }

    /// The sum of `x` over the ranks, in f64 (for logging metrics such as the mean loss).
    pub fn all_reduce_sum_f64(&self, x: f64) -> Result<f64, DistError> {
        const OP: &str = "all_reduce";
        let t = Tensor::from_slice(&[x]);
        // SAFETY: `t` is a live tch tensor for the whole call.
        self.check(OP, unsafe { ffi::lssa_dist_all_reduce_sum(self.raw.as_ptr(), t.as_ptr().cast()) })?;
        t.f_double_value(&[0]).map_err(|source| DistError::Tensor { op: OP, rank: self.rank(), source })
    }

    /// Blocks until every rank has reached the barrier (or the timeout has passed).
    pub fn barrier(&self) -> Result<(), DistError> {
        // SAFETY: the handle is live.
        self.check("barrier", unsafe { ffi::lssa_dist_barrier(self.raw.as_ptr()) })
    }

    fn check(&self, op: &'static str, err: *mut c_char) -> Result<(), DistError> {
        match take_error(err) {
            None => Ok(()),
            Some(message) => Err(DistError::Collective { op, rank: self.rank(), message }),
        }
    }

    fn argument(&self, op: &'static str, what: String) -> DistError {
        DistError::Argument { op, rank: self.rank(), what }
    }

    /// Runs `collective` on each bucket of `tensors` (flattened), then (for a mean) divides by the
    /// world size, and writes the result back into the tensors.
    fn bucketed(
        &self,
        op: &'static str,
        tensors: &[Tensor],
        mean: bool,
        collective: impl Fn(&Tensor) -> Result<(), DistError>,
    ) -> Result<(), DistError> {
        let mut items = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if !t.defined() {
                return Err(self.argument(op, format!("tensor {i} is undefined (a parameter without a gradient?)")));
            }
            if t.device().is_cuda() && !Self::has_nccl() {
                return Err(DistError::NoNccl { op, rank: self.rank() });
            }
            items.push((t.kind(), t.device(), t.numel() * t.kind().elt_size_in_bytes()));
        }
        let tensor_err = |source| DistError::Tensor { op, rank: self.rank(), source };
        tch::no_grad(|| {
            for range in plan_buckets(&items, self.options.bucket_bytes) {
                let group: Vec<&Tensor> = tensors[range].iter().filter(|t| t.numel() > 0).collect();
                if group.is_empty() {
                    continue; // every rank skips it: the shapes agree
                }
                // A lone contiguous tensor is reduced where it is: a flat view, no copies.
                let in_place = group.len() == 1 && group[0].is_contiguous();
                let mut flat = if in_place {
                    group[0].f_view_([-1]).map_err(tensor_err)?
                } else {
                    let parts =
                        group.iter().map(|t| t.f_reshape([-1])).collect::<Result<Vec<_>, _>>().map_err(tensor_err)?;
                    Tensor::f_cat(&parts, 0).map_err(tensor_err)? // (sum of numels,)
                };
                collective(&flat)?;
                if mean {
                    let _ = flat.f_div_scalar_(self.world_size() as f64).map_err(tensor_err)?;
                }
                if !in_place {
                    let mut offset = 0;
                    for t in group {
                        let n = t.numel() as i64;
                        let part = flat.f_narrow(0, offset, n).and_then(|p| p.f_view_(t.size())).map_err(tensor_err)?;
                        t.shallow_clone().f_copy_(&part).map_err(tensor_err)?;
                        offset += n;
                    }
                }
            }
            Ok(())
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the handle came from `lssa_dist_new` and is released once, here.
        unsafe { ffi::lssa_dist_free(self.raw.as_ptr()) };
    }
}

/// Splits `items` (dtype, device, bytes) into buckets: runs of consecutive items with one dtype and
/// device, each closed before it would exceed `bucket_bytes` (an item larger than that gets a bucket
/// of its own). Empty items join the current bucket and cost nothing. Every rank computes the same
/// plan from the same shapes, which is what keeps the collectives matched.
pub fn plan_buckets(items: &[(Kind, Device, usize)], bucket_bytes: usize) -> Vec<Range<usize>> {
    let mut buckets = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, &(kind, device, size)) in items.iter().enumerate() {
        if i > start {
            let (k0, d0, _) = items[start];
            if k0 != kind || d0 != device || (bytes > 0 && size > 0 && bytes + size > bucket_bytes) {
                buckets.push(start..i);
                start = i;
                bytes = 0;
            }
        }
        bytes += size;
    }
    if start < items.len() {
        buckets.push(start..items.len());
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan as (start, end) pairs.
    fn plan(items: &[(Kind, usize)], cap: usize) -> Vec<(usize, usize)> {
        let items: Vec<_> = items.iter().map(|&(k, b)| (k, Device::Cpu, b)).collect();
        plan_buckets(&items, cap).into_iter().map(|r| (r.start, r.end)).collect()
    }

    type Case = (&'static [(Kind, usize)], usize, &'static [(usize, usize)]);

    #[test]
    fn buckets_fill_up_to_the_cap_and_split_on_dtype() {
        const F: Kind = Kind::Float;
        const D: Kind = Kind::Double;
        let cases: &[Case] = &[
            (&[], 10, &[]),
            (&[(F, 4)], 10, &[(0, 1)]),
            (&[(F, 4), (F, 4), (F, 4)], 10, &[(0, 2), (2, 3)]),
            (&[(F, 4), (F, 6), (F, 4)], 10, &[(0, 2), (2, 3)]),
            (&[(F, 40), (F, 4), (F, 4)], 10, &[(0, 1), (1, 3)]),
            (&[(F, 4), (F, 40), (F, 4)], 10, &[(0, 1), (1, 2), (2, 3)]),
            (&[(F, 4), (D, 4), (F, 4)], 100, &[(0, 1), (1, 2), (2, 3)]),
            (&[(F, 0), (F, 0), (F, 12)], 10, &[(0, 3)]),
            (&[(F, 12), (F, 0)], 10, &[(0, 2)]),
            (&[(F, 0), (D, 0)], 10, &[(0, 1), (1, 2)]),
        ];
        for (items, cap, want) in cases {
            assert_eq!(plan(items, *cap), *want, "items {items:?} cap {cap}");
        }
    }

    #[test]
    fn the_shim_and_the_build_script_agree_on_nccl() {
        assert_eq!(ProcessGroup::has_nccl(), cfg!(trainer_nccl));
    }

    #[test]
    fn buckets_split_on_device() {
        let f = Kind::Float;
        let items = [(f, Device::Cpu, 4), (f, Device::Cuda(0), 4), (f, Device::Cuda(1), 4)];
        assert_eq!(plan_buckets(&items, 100), vec![0..1, 1..2, 2..3]);
    }

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn options_from_vars() {
        assert_eq!(DistOptions::from_vars(lookup(&[])).unwrap(), DistOptions::default());
        let o =
            DistOptions::from_vars(lookup(&[("LSSA_DIST_TIMEOUT_S", "2.5"), ("LSSA_DIST_BUCKET_MB", "0.5")])).unwrap();
        assert_eq!((o.timeout, o.bucket_bytes), (Duration::from_millis(2500), 1 << 19));
        for (var, value) in [
            ("LSSA_DIST_TIMEOUT_S", "0"),
            ("LSSA_DIST_TIMEOUT_S", "-1"),
            ("LSSA_DIST_TIMEOUT_S", "nan"),
            ("LSSA_DIST_TIMEOUT_S", "x"),
            ("LSSA_DIST_BUCKET_MB", "0"),
        ] {
            let err = DistOptions::from_vars(lookup(&[(var, value)])).unwrap_err().to_string();
            assert!(err.contains(var) && err.contains(value), "{err}");
        }
    }
}
