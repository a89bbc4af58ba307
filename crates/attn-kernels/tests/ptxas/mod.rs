//! `ptxas -v`, which the compile tests run on NVRTC's PTX: where it is, its per-kernel resource
//! report (registers, spills, stack frame) read into [`Usage`], and that report as a table.

pub mod sass;

/// ptxas, which the torch wheel ships next to libtorch (`torch/bin/ptxas`): `$LSSA_PTXAS`, then
/// `$LIBTORCH/bin`, then the CUDA toolkit.
pub fn find() -> Option<std::path::PathBuf> {
    let mut c: Vec<std::path::PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("LSSA_PTXAS") {
        c.push(p.into());
    }
    if let Some(t) = std::env::var_os("LIBTORCH") {
        let t = std::path::PathBuf::from(t);
        c.push(t.canonicalize().unwrap_or(t).join("bin/ptxas"));
    }
    c.push("/usr/local/cuda/bin/ptxas".into());
    c.into_iter().find(|p| p.is_file())
}

/// One kernel's resources as `ptxas -v` reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub kernel: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// The stack frame: local memory per thread (spills included).
    pub stack: u32,
}

impl Usage {
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }

    /// Registers, then ` s<spill stores>/<spill loads> l<stack frame>` (bytes) where any is not 0.
    pub fn cell(&self) -> String {
        if self.spills() || self.stack > 0 {
            format!("{} s{}/{} l{}", self.registers, self.spill_stores, self.spill_loads, self.stack)
        } else {
            self.registers.to_string()
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{}: {} registers, {} bytes spill stores, {} bytes spill loads, {} bytes stack frame",
            self.kernel, self.registers, self.spill_stores, self.spill_loads, self.stack
        )
    }
}

/// The entry functions' resources in a `ptxas -v` log, in its order: "Compiling entry function
/// 'NAME'", then "Function properties for NAME" with the stack frame and spills, then "Used N
/// registers".
pub fn usages(log: &str) -> Vec<Usage> {
    let bytes = |line: &str, what: &str| -> u32 {
        let part = line.split(',').find(|p| p.contains(what)).unwrap_or("");
        part.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    let (mut out, mut entry, mut props_of_entry) = (Vec::new(), None::<Usage>, false);
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let kernel = rest.split('\'').next().unwrap_or(rest).to_string();
            entry = Some(Usage { kernel, ..Usage::default() });
            props_of_entry = false;
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            props_of_entry = entry.as_ref().is_some_and(|e| e.kernel == rest.trim());
        } else if line.contains("bytes stack frame") {
            if let Some(e) = entry.as_mut().filter(|_| props_of_entry) {
                (e.stack, e.spill_stores, e.spill_loads) =
                    (bytes(line, "stack frame"), bytes(line, "spill stores"), bytes(line, "spill loads"));
            }
        } else if let Some(rest) = line.split("Used ").nth(1).filter(|r| r.contains(" registers"))
            && let Some(mut e) = entry.take()
        {
            e.registers = rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
            out.push(e);
        }
    }
    out
}

#[test]
fn the_ptxas_report_reader_finds_every_entry() {
    let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'lssa_fwd_mma5' for 'sm_90a'
ptxas info    : Function properties for lssa_fwd_mma5
    112 bytes stack frame, 180 bytes spill stores, 216 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 112 bytes cumulative stack size, 8720 bytes smem
ptxas info    : Compile time = 230.1 ms
ptxas info    : Function properties for __internal_helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'lssa_inv_norms' for 'sm_80'
ptxas info    : Function properties for lssa_inv_norms
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers, 400 bytes cmem[0]
";
    let u = usages(log);
    assert_eq!(u.len(), 2, "{u:?}");
    assert_eq!(
        (u[0].kernel.as_str(), u[0].registers, u[0].spill_stores, u[0].spill_loads),
        ("lssa_fwd_mma5", 255, 180, 216)
    );
    assert_eq!((u[0].stack, u[0].cell().as_str()), (112, "255 s180/216 l112"));
    assert!(u[0].spills() && !u[1].spills());
    assert_eq!(
        (u[1].kernel.as_str(), u[1].registers, u[1].stack, u[1].cell().as_str()),
        ("lssa_inv_norms", 26, 0, "26")
    );
}

/// The kernels of a table in the lab's order (`Kern::ALL`), for its columns.
pub const KERNEL_ORDER: [&str; 25] = [
    "lssa_inv_norms",
    "lssa_fwd_simt",
    "lssa_fwd_mma",
    "lssa_fwd_mma3",
    "lssa_fwd_mma5",
    "lssa_fwd_stats5",
    "lssa_fwd_rw5",
    "lssa_fwd_wg8",
    "lssa_fwd_stats8",
    "lssa_fwd_rw8",
    "lssa_fwd_ws10",
    "lssa_fwd_stats10",
    "lssa_fwd_rw10",
    "lssa_bwd_rows",
    "lssa_bwd_keys",
    "lssa_bwd_rows_mma",
    "lssa_bwd_keys_mma",
    "lssa_bwd_rows_mma6",
    "lssa_bwd_keys_mma6",
    "lssa_bwd_rowstats7",
    "lssa_bwd_keys_mma7",
    "lssa_bwd_dq7",
    "lssa_bwd_rowstats9",
    "lssa_bwd_keys_wg9",
    "lssa_wg_probe",
];

/// A table of one row per labelled report and one column per kernel: each cell [`Usage::cell`], in
/// parentheses where `plain(row, kernel)` says the kernel is not one the table is about (compiled,
/// never launched there).
pub fn table(title: &str, rows: &[(String, &[Usage])], plain: &dyn Fn(usize, &str) -> bool) -> String {
    let columns: Vec<&str> =
        KERNEL_ORDER.into_iter().filter(|k| rows.iter().any(|(_, us)| us.iter().any(|u| u.kernel == *k))).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .enumerate()
        .map(|(row, (label, us))| {
            let mut line = vec![label.clone()];
            for k in &columns {
                line.push(match us.iter().find(|u| u.kernel == *k) {
                    Some(u) if plain(row, k) => u.cell(),
                    Some(u) => format!("({})", u.cell()),
                    None => "-".into(),
                });
            }
            line
        })
        .collect();
    let mut header = vec!["specialisation".to_string()];
    header.extend(columns.iter().map(|k| k.trim_start_matches("lssa_").to_string()));
    let widths: Vec<usize> = (0..header.len())
        .map(|i| cells.iter().map(|c| c[i].len()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let fmt = |line: &[String]| -> String {
        line.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let mut out = format!("{title}\n{}\n", fmt(&header));
    for c in &cells {
        out.push_str(&fmt(c));
        out.push('\n');
    }
    out
}
