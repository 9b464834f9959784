//! Every file allocprof writes goes through here. It runs as root in
//! directories others may write to, so a file is first created exclusively
//! (`O_EXCL`, a random name, never following a planted link) next to its
//! destination, then renamed over it: a symlink at the destination is
//! replaced, not followed, and readers never see half a file.

use std::{
    fs::Permissions,
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

/// What to do when the destination exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    Replace,
    /// Fail rather than overwrite (exports named to be fresh).
    Keep,
}

/// Writes `bytes` to `path` atomically; see the module docs.
pub fn write(path: &Path, bytes: &[u8], existing: Existing) -> Result<()> {
    refuse_special(path)?;
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .with_context(|| format!("{}: not a file name", path.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(&dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let file = tmp.as_file_mut();
    // Created 0600; outputs are ordinary files for whoever profiles.
    file.set_permissions(Permissions::from_mode(0o644))
        .and_then(|()| file.write_all(bytes))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    match existing {
        Existing::Replace => tmp.persist(path).map(drop).map_err(|e| e.error),
        Existing::Keep => tmp.persist_noclobber(path).map(drop).map_err(|e| e.error),
    }
    .with_context(|| format!("writing {}", path.display()))
}

/// Fails early, before any profiling, where `path` cannot be written:
/// a directory, or a parent that does not exist.
pub fn check_writable(path: &Path) -> Result<()> {
    refuse_special(path)?;
    if path.is_dir() {
        bail!("{}: is a directory; name a file to write", path.display());
    }
    let dir = parent_dir(path);
    if !dir.is_dir() {
        bail!(
            "cannot write {}: no such directory {}",
            path.display(),
            dir.display()
        );
    }
    // Permissions, read-only mounts, quotas: try what writing will do.
    tempfile::Builder::new()
        .prefix(".allocprof-check.")
        .tempfile_in(&dir)
        .map(drop)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// A destination that is a device, FIFO or socket, a link to one, or a
/// link to a file descriptor (`/dev/stdout` → `/proc/self/fd/1`) would be
/// replaced by a regular file by the rename: `-o /dev/null` would leave no
/// /dev/null. Refused, saying what works.
fn refuse_special(path: &Path) -> Result<()> {
    let special = |t: std::fs::FileType| !t.is_file() && !t.is_dir() && !t.is_symlink();
    let own = std::fs::symlink_metadata(path).map(|m| m.file_type()).ok();
    let target = std::fs::metadata(path).map(|m| m.file_type()).ok();
    let link = own.is_some_and(|t| t.is_symlink());
    let to_a_descriptor = link
        && std::fs::read_link(path)
            .is_ok_and(|t| t.starts_with("/proc/") || t.starts_with("/dev/fd"));
    if own.is_some_and(special) || (link && target.is_some_and(special)) || to_a_descriptor {
        bail!(
            "{}: not a regular file (a device, pipe, socket or file descriptor); allocprof \
             writes files. Without -o the output goes to standard output, which can be \
             redirected",
            path.display()
        );
    }
    Ok(())
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        os::unix::fs::{FileTypeExt, symlink},
    };

    use super::*;

    #[test]
    fn devices_pipes_and_links_to_them_are_refused_not_replaced() {
        for dev in ["/dev/null", "/dev/stdout"] {
            let err = check_writable(Path::new(dev)).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{dev}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path of our own temporary directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let link = dir.path().join("link");
        symlink(&fifo, &link).unwrap();
        for path in [&fifo, &link] {
            assert!(write(path, b"x", Existing::Replace).is_err(), "{path:?}");
        }
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }

    #[test]
    fn planted_symlinks_are_replaced_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let out = dir.path().join("heap.pb.gz");
        // The old fixed temporary name, and the destination itself.
        symlink(&victim, dir.path().join("heap.pb.gz.tmp")).unwrap();
        symlink(&victim, &out).unwrap();
        write(&out, b"profile", Existing::Replace).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(fs::read(&out).unwrap(), b"profile");
        assert!(!fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp") && n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn keep_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("export.svg");
        fs::write(&out, "first").unwrap();
        assert!(write(&out, b"second", Existing::Keep).is_err());
        assert_eq!(fs::read_to_string(&out).unwrap(), "first");
    }

    #[test]
    fn unwritable_destinations_are_named_before_profiling() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_writable(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        let err = check_writable(&dir.path().join("no/such/heap.svg")).unwrap_err();
        assert!(err.to_string().contains("no such directory"), "{err}");
        check_writable(&dir.path().join("heap.svg")).unwrap();
        check_writable(Path::new("relative.svg")).unwrap();
    }
}
