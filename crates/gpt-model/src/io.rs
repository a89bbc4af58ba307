//! Atomic file writes, shared by the checkpoint writer here and by every file the trainer writes
//! (shards, manifests, configs, metrics truncation): std only.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An I/O error with the path it happened on (the temporary file or the destination).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct AtomicWriteError {
    /// The file the failing call was about.
    pub path: PathBuf,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

/// A temporary name beside `path` that no other writer uses: the process id and a per-process
/// counter, so concurrent writers of one destination (threads or processes) never share a file.
/// The error of an I/O call on `p`.
fn at(p: &Path) -> impl FnOnce(std::io::Error) -> AtomicWriteError + '_ {
    move |source| AtomicWriteError { path: p.to_path_buf(), source }
}

fn temporary_name(path: &Path) -> Result<PathBuf, AtomicWriteError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let file_name = path.file_name().ok_or_else(|| AtomicWriteError {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path has no file name"),
    })?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!(".{}.tmp-{}-{n}", file_name.to_string_lossy(), std::process::id());
    Ok(path.with_file_name(name))
}

/// Writes `path` atomically: `write` fills a uniquely named temporary file in the same directory
/// (given its path), which is then synced and renamed to `path`, and the directory synced (best
/// effort: not every file system can open a directory). Readers see the old file or the new one,
/// never a partial one; a memory map of the old file stays valid (the new file is a new inode). On
/// any error the temporary file is removed and `path` is untouched.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), AtomicWriteError> {
    let tmp = temporary_name(path)?;
    let result = (|| {
        write(&tmp).map_err(at(&tmp))?;
        injected_fault(&tmp).map_err(at(&tmp))?;
        File::open(&tmp).and_then(|f| f.sync_all()).map_err(at(&tmp))?;
        std::fs::rename(&tmp, path).map_err(at(path))?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The fail point of [`write_atomic_with`] (the `fail` crate's; compiled in only with the
/// `failpoints` feature, which the tests enable): configured `return(N)`, a write whose temporary
/// file grew past `N` bytes is cut to `N` bytes and fails as a full disk does (`StorageFull`), so
/// tests see what a full disk does to a checkpoint (the partial temporary is removed, the
/// destination and the older files stay) without filling one. The `trainer` binary built with the
/// feature reads it from `FAILPOINTS=gpt_model::io::write=return(N)`.
pub const WRITE_FAILPOINT: &str = "gpt_model::io::write";

#[cfg(feature = "failpoints")]
fn injected_fault(tmp: &Path) -> std::io::Result<()> {
    fail::fail_point!(WRITE_FAILPOINT, |limit: Option<String>| {
        let limit: u64 = limit.and_then(|v| v.parse().ok()).expect("gpt_model::io::write=return(BYTES)");
        if std::fs::metadata(tmp)?.len() > limit {
            std::fs::OpenOptions::new().write(true).open(tmp)?.set_len(limit)?;
            return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device (injected)"));
        }
        Ok(())
    });
    Ok(())
}

/// Without the `failpoints` feature, no fail point.
#[cfg(not(feature = "failpoints"))]
fn injected_fault(_tmp: &Path) -> std::io::Result<()> {
    Ok(())
}

/// [`write_atomic_with`] through a buffered writer.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), AtomicWriteError> {
    write_atomic_with(path, |tmp| {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(tmp)?);
        write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpt-model-io-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = scratch("fail");
        let path = dir.join("data.txt");
        write_atomic(&path, |w| w.write_all(b"old")).unwrap();
        let err = write_atomic(&path, |w| {
            w.write_all(b"half of the new")?;
            Err(std::io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk on fire") && err.path != path, "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(entries(&dir), ["data.txt"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_writers_of_one_file_never_share_a_temporary() {
        let dir = scratch("race");
        let path = dir.join("shared.bin");
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..20 {
                        write_atomic(path, |w| w.write_all(&[t; 4096])).unwrap();
                    }
                });
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|&b| b == bytes[0]), "two writers' bytes mixed in one file");
        assert_eq!(entries(&dir), ["shared.bin"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
