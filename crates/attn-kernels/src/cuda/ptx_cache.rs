//! The on-disk PTX cache. NVRTC takes 0.9 s (`lssa`) to 2.2 s (`lssa+rw15`) for one module of
//! `Kernel::Auto`, and without this cache every process paid it again for every specialisation it
//! used: each pytest worker, each trainer rank, each script run.
//!
//! Where: `$LSSA_PTX_CACHE` (a directory; `off` or `0` turns the cache off), else
//! `$XDG_CACHE_HOME/lssa/ptx`, else `$HOME/.cache/lssa/ptx`. One file per module, named by the
//! module's key and a 128-bit FNV-1a hash of everything NVRTC's output depends on: the whole source,
//! the architecture, the options and NVRTC's version. So an edited kernel, another NVRTC or another
//! architecture never reads a stale file; old files are simply never read again.
//!
//! A module's PTX is 0.8-1.3 MB (with line information), so the directory is held to [`LIMIT`]
//! bytes: after each write the files least recently used (a hit renews a file's time) go until it is
//! at 3/4 of that. A kernel edited and compiled again leaves its old files behind: the NVRTC test of
//! every fused variant alone writes 99 files, 125 MB.
//!
//! A file is written under a temporary name and renamed, so concurrent processes never read half of
//! one. Its first line repeats the hash and the PTX's length; a file whose first line does not match
//! (truncated, edited) is compiled again and replaced. The driver keeps its own cache of what it
//! makes of the PTX (`~/.nv/ComputeCache`), so a hit here skips both steps. Failing to read or write
//! the cache is never an error: the kernels then compile as they would without it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// The most the cache directory holds, in bytes, before its least recently used files go.
pub(super) const LIMIT: u64 = 512 << 20;

/// The cache directory, or `None` when it is off or no home is known.
pub(super) fn dir() -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(v) = env("LSSA_PTX_CACHE") {
        return if v == "off" || v == "0" { None } else { Some(PathBuf::from(v)) };
    }
    let base =
        env("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("lssa").join("ptx"))
}

/// 128-bit FNV-1a of `parts`, each followed by a 0 byte (so `["ab", "c"]` and `["a", "bc"]` differ).
pub(super) fn hash(parts: &[&[u8]]) -> u128 {
    parts.iter().fold(FNV_OFFSET, |h, part| fnv1a(fnv1a(h, part), &[0]))
}

const FNV_OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;

fn fnv1a(mut h: u128, bytes: &[u8]) -> u128 {
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    for &b in bytes {
        h ^= b as u128;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The file of a module: its key (the specialisation, readable) and the hash (what decides).
pub(super) fn path(dir: &Path, key: &str, hash: u128) -> PathBuf {
    dir.join(format!("{key}-{hash:032x}.ptx"))
}

fn header(hash: u128, len: usize) -> String {
    format!("// lssa PTX cache 1 {hash:032x} {len}\n")
}

/// The PTX cached at `path` for `hash`, if the file is there whole (its time renewed: just used).
pub(super) fn read(path: &Path, hash: u128) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let body_at = text.find('\n')? + 1;
    let body = &text[body_at..];
    if text[..body_at] != header(hash, body.len()) {
        return None;
    }
    if let Ok(f) = std::fs::File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
    Some(body.to_string())
}

/// Stores `ptx` at `path` (best effort: a read-only or full disk leaves the cache as it was).
pub(super) fn write(path: &Path, hash: u128, ptx: &str) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::write(&tmp, header(hash, ptx.len()) + ptx).is_ok() && std::fs::rename(&tmp, path).is_ok();
    if !written {
        let _ = std::fs::remove_file(&tmp);
    }
    prune(dir, LIMIT);
}

/// Removes the least recently used `.ptx` files of `dir` while it holds more than `limit` bytes, down
/// to 3/4 of it (so a full cache does not list itself at every write).
fn prune(dir: &Path, limit: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let path = e.path();
            let meta = e.metadata().ok()?;
            if path.extension()? != "ptx" || !meta.is_file() {
                return None;
            }
            Some((meta.modified().ok()?, meta.len(), path))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    if total <= limit {
        return;
    }
    files.sort();
    for (_, len, path) in files {
        if total <= limit / 4 * 3 {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lssa-ptx-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_hash_is_fnv1a_and_separates_its_parts() {
        // The published 128-bit FNV-1a test vectors of "" and "a".
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
        assert_eq!(hash(&[b"a"]), fnv1a(FNV_OFFSET, b"a\0"));
        assert_ne!(hash(&[b"ab", b"c"]), hash(&[b"a", b"bc"]));
        assert_ne!(hash(&[b"x"]), hash(&[b"x", b""]));
    }

    #[test]
    fn a_written_module_reads_back_and_a_damaged_one_does_not() {
        let dir = temp_dir("rw");
        let p = path(&dir, "act1-hd64", 7);
        assert_eq!(read(&p, 7), None, "nothing there yet");
        write(&p, 7, "// ptx\n.version 8.0\n");
        assert_eq!(read(&p, 7).as_deref(), Some("// ptx\n.version 8.0\n"));
        assert_eq!(read(&p, 8), None, "another hash's header");
        let whole = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, &whole[..whole.len() - 3]).unwrap();
        assert_eq!(read(&p, 7), None, "a truncated file");
        write(&p, 7, "// ptx\n");
        assert_eq!(read(&p, 7).as_deref(), Some("// ptx\n"), "replaced whole");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "no temporary left behind: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_cache_loses_its_least_recently_used_files() {
        let dir = temp_dir("prune");
        std::fs::create_dir_all(&dir).unwrap();
        let t0 = SystemTime::now() - std::time::Duration::from_secs(1000);
        for i in 0..8u64 {
            let p = dir.join(format!("m{i}.ptx"));
            std::fs::write(&p, vec![b'x'; 100]).unwrap();
            // Used in the order 0, 1, .., 7, except 2, used last.
            let age = if i == 2 { 900 } else { i * 10 };
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t0 + std::time::Duration::from_secs(age))
                .unwrap();
        }
        std::fs::write(dir.join("notes.txt"), vec![b'y'; 1000]).unwrap();
        prune(&dir, 900);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 9, "800 bytes of PTX is within 900");
        prune(&dir, 600);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        // Down to 3/4 of 600 = 450 bytes: the four least recent (0, 1, 3, 4) go; other files stay.
        assert_eq!(left, ["m2.ptx", "m5.ptx", "m6.ptx", "m7.ptx", "notes.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_directory_is_not_an_error() {
        let dir = temp_dir("ro");
        std::fs::write(&dir, "a file where the directory should be").unwrap();
        let p = path(&dir, "k", 1);
        write(&p, 1, "ptx");
        assert_eq!(read(&p, 1), None);
        std::fs::remove_file(&dir).unwrap();
    }
}
