//! Every file allocprof writes goes through here. It runs as root in
//! directories others may write to, so a file is first created exclusively
//! (`O_EXCL`, a random name, never following a planted link) next to its
//! destination, then renamed over it: a symlink at the destination is
//! replaced, not followed, and readers never see half a file.
//!
//! A character device or a FIFO named directly (`-o /dev/null`, a pipe a
//! reader waits on) is a stream, not a file to replace: it is opened
//! (never through a link, never created) and written in place.

pub mod export;
pub mod inert;
pub mod report;

use std::{
    fs::{FileType, Permissions},
    io::Write,
    os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt},
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

/// Writes `bytes` to `path`: atomically where it is (or will be) a regular
/// file, in place where it is a stream; see the module docs.
pub fn write(path: &Path, bytes: &[u8], existing: Existing) -> Result<()> {
    match kind(path)? {
        Kind::Stream if existing == Existing::Replace => write_stream(path, bytes),
        Kind::Stream => bail!("{}: exists; not overwritten", path.display()),
        Kind::File => write_file(path, bytes, existing),
    }
}

/// Whether `path` names a stream (a character device or FIFO, not through
/// a link), written in place: one destination for every snapshot.
pub fn is_stream(path: &Path) -> bool {
    matches!(kind(path), Ok(Kind::Stream))
}

fn write_file(path: &Path, bytes: &[u8], existing: Existing) -> Result<()> {
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

/// Writes a character device or FIFO in place. `O_NOFOLLOW` and no
/// `O_CREAT`: a link or file put there since [`kind`] looked is not
/// followed or made, and the opened file is checked again. A FIFO's open
/// waits for a reader, as a shell's `>` does.
fn write_stream(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let t = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .file_type();
    if !is_stream_type(t) {
        bail!(
            "{}: changed while it was opened; not written",
            path.display()
        );
    }
    file.write_all(bytes)
        .and_then(|()| file.flush())
        .with_context(|| format!("writing {}", path.display()))
}

/// Fails early, before any profiling, where `path` cannot be written:
/// a directory, a parent that is missing or no directory, a socket, a
/// block device, a link to a device, pipe or descriptor.
pub fn check_writable(path: &Path) -> Result<()> {
    if kind(path)? == Kind::Stream {
        // Not opened here: a FIFO's open would wait for its reader.
        return Ok(());
    }
    let dir = parent_dir(path);
    if !dir.exists() {
        bail!(
            "cannot write {}: no such directory {}",
            path.display(),
            dir.display()
        );
    }
    if !dir.is_dir() {
        bail!(
            "cannot write {}: {} is not a directory",
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A regular file, a link (replaced), or nothing yet.
    File,
    /// A character device or FIFO, named directly.
    Stream,
}

fn is_stream_type(t: FileType) -> bool {
    t.is_char_device() || t.is_fifo()
}

/// What writing `path` means, or why it cannot be written. A rename over
/// a block device or socket would leave a regular file in its place, and
/// following a link to a device or descriptor (`/dev/stdout` →
/// `/proc/self/fd/1`) could write wherever a planted link points: both
/// refused, saying what works.
fn kind(path: &Path) -> Result<Kind> {
    let own = match std::fs::symlink_metadata(path) {
        Ok(m) => m.file_type(),
        // Nothing there yet (or a parent that is no directory: said by
        // `check_writable`).
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Ok(Kind::File);
        }
        Err(e) => return Err(e).with_context(|| format!("cannot write {}", path.display())),
    };
    if own.is_dir() {
        bail!("{}: is a directory; name a file to write", path.display());
    }
    if is_stream_type(own) {
        return Ok(Kind::Stream);
    }
    if own.is_block_device() || own.is_socket() {
        bail!(
            "{}: a block device or socket; allocprof writes regular files, character \
             devices (/dev/null) and pipes",
            path.display()
        );
    }
    if own.is_symlink() {
        let target = std::fs::metadata(path).map(|m| m.file_type()).ok();
        let to_a_descriptor = std::fs::read_link(path)
            .is_ok_and(|t| t.starts_with("/proc/") || t.starts_with("/dev/fd"));
        let special = target.is_some_and(|t| !t.is_file() && !t.is_dir());
        if to_a_descriptor || special {
            bail!(
                "{}: a link to a device, pipe or file descriptor, which allocprof does not \
                 follow where it writes; name the device or pipe itself. Without -o the \
                 output goes to standard output, which can be redirected",
                path.display()
            );
        }
    }
    Ok(Kind::File)
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::symlink};

    use super::*;

    fn fifo(dir: &Path) -> PathBuf {
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path of our own temporary directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        fifo
    }

    #[test]
    fn devices_and_pipes_are_written_in_place() {
        check_writable(Path::new("/dev/null")).unwrap();
        write(Path::new("/dev/null"), b"x", Existing::Replace).unwrap();
        assert!(is_stream(Path::new("/dev/null")));
        assert!(
            fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo(dir.path());
        check_writable(&fifo).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || fs::read(fifo).unwrap())
        };
        write(&fifo, b"through the pipe", Existing::Replace).unwrap();
        assert_eq!(reader.join().unwrap(), b"through the pipe");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        // An export named to be fresh never lands on an existing one.
        assert!(write(Path::new("/dev/null"), b"x", Existing::Keep).is_err());
    }

    #[test]
    fn links_to_devices_pipes_and_descriptors_and_sockets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo(dir.path());
        let link = dir.path().join("link");
        symlink(&fifo, &link).unwrap();
        let null_link = dir.path().join("null");
        symlink("/dev/null", &null_link).unwrap();
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        for path in [&link, &null_link, &socket, &PathBuf::from("/dev/stdout")] {
            let err = check_writable(path).unwrap_err().to_string();
            assert!(
                err.contains("a link to a device") || err.contains("block device or socket"),
                "{path:?}: {err}"
            );
            assert!(write(path, b"x", Existing::Replace).is_err(), "{path:?}");
            assert!(!is_stream(path), "{path:?}");
        }
        for path in [&link, &null_link] {
            assert!(fs::symlink_metadata(path).unwrap().file_type().is_symlink());
        }
        assert!(
            fs::symlink_metadata(&socket)
                .unwrap()
                .file_type()
                .is_socket()
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
        let file = dir.path().join("file");
        fs::write(&file, "").unwrap();
        let err = check_writable(&file.join("heap.svg")).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        check_writable(&dir.path().join("heap.svg")).unwrap();
        check_writable(Path::new("relative.svg")).unwrap();
    }
}
