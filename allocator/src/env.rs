//! The `ALLOCPROF_*` environment variables, read from inside `malloc`.
//!
//! The first allocation can come before libc has set up `environ`: a
//! `.preinit_array` function runs before libc's own initialiser, with
//! `environ` still null, and a variable read then would be latched as
//! unset for the whole run. So when `environ` is null or empty, the
//! variable is read from `/proc/self/environ` (the environment the process
//! was started with) instead, with raw system calls: no allocation, no
//! lock, no cancellation point, errno untouched.

use core::ffi::{CStr, c_char, c_long};

/// The longest value passed on from `/proc/self/environ`; a longer one is
/// passed as [`TOO_LONG`], which no parser of ours accepts.
const MAX_VALUE: usize = 64;
/// Stands for a value longer than [`MAX_VALUE`] bytes.
pub(crate) const TOO_LONG: &[u8] = b"\xff(too long)";
/// The most of `/proc/self/environ` read for one variable (the kernel caps
/// a process's initial environment at a quarter of its stack limit).
const MAX_SCAN: usize = 16 << 20;

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// Calls `f` with the value of the environment variable `name` (`None` if
/// unset), from `environ` when libc has set it up, else from
/// `/proc/self/environ`.
pub(crate) fn with_var<R>(name: &CStr, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    // SAFETY: reads libc's `environ` pointer and, when it is not null, its
    // first entry: libc keeps the array null-terminated.
    let set_up = unsafe {
        let env = core::ptr::read_volatile(&raw const environ);
        !env.is_null() && !(*env).is_null()
    };
    if set_up {
        // SAFETY: getenv reads `environ` without allocating; the key is a
        // valid NUL-terminated string.
        let value = unsafe { libc::getenv(name.as_ptr()) };
        if value.is_null() {
            return f(None);
        }
        // SAFETY: getenv returned a NUL-terminated string in `environ`.
        return f(Some(unsafe { CStr::from_ptr(value) }.to_bytes()));
    }
    let mut buf = [0u8; MAX_VALUE];
    match from_proc(name.to_bytes(), &mut buf) {
        Found::Value(n) => f(Some(&buf[..n])),
        Found::TooLong => f(Some(TOO_LONG)),
        Found::Unset => f(None),
    }
}

enum Found {
    Value(usize),
    TooLong,
    Unset,
}

/// Scans `/proc/self/environ` (NUL-separated `NAME=value` entries) for
/// `name`, copying its value into `out`. Unset if `/proc` is not mounted.
fn from_proc(name: &[u8], out: &mut [u8; MAX_VALUE]) -> Found {
    let fd = sys::open_read_only(c"/proc/self/environ");
    if fd < 0 {
        return Found::Unset;
    }
    let mut scanner = Scanner::new(name);
    let mut chunk = [0u8; 1024];
    let mut total = 0usize;
    let found = loop {
        let n = sys::read(fd, &mut chunk);
        if n == -(libc::EINTR as isize) {
            continue;
        }
        if n <= 0 || total >= MAX_SCAN {
            break scanner.finish();
        }
        total += n as usize;
        if let Some(found) = scanner.feed(&chunk[..n as usize], out) {
            break found;
        }
    };
    sys::close(fd);
    found
}

/// A streaming matcher for `name=` at the start of an entry.
struct Scanner<'a> {
    name: &'a [u8],
    state: State,
}

#[derive(Clone, Copy)]
enum State {
    /// `n` bytes of this entry matched `name` so far.
    Matching(usize),
    /// This entry is another variable: skip to its NUL.
    Skipping,
    /// In the value, `n` bytes copied.
    Value(usize),
}

impl<'a> Scanner<'a> {
    fn new(name: &'a [u8]) -> Self {
        Scanner {
            name,
            state: State::Matching(0),
        }
    }

    fn feed(&mut self, bytes: &[u8], out: &mut [u8; MAX_VALUE]) -> Option<Found> {
        for &b in bytes {
            self.state = match self.state {
                State::Matching(n) if n == self.name.len() => match b {
                    b'=' => State::Value(0),
                    0 => State::Matching(0),
                    _ => State::Skipping,
                },
                State::Matching(n) => match b {
                    0 => State::Matching(0),
                    _ if b == self.name[n] => State::Matching(n + 1),
                    _ => State::Skipping,
                },
                State::Skipping => match b {
                    0 => State::Matching(0),
                    _ => State::Skipping,
                },
                State::Value(n) => match b {
                    0 => return Some(Found::Value(n)),
                    _ if n == MAX_VALUE => return Some(Found::TooLong),
                    _ => {
                        out[n] = b;
                        State::Value(n + 1)
                    }
                },
            };
        }
        None
    }

    /// End of the file (or of the bytes read): a value in progress ends here.
    fn finish(&self) -> Found {
        match self.state {
            State::Value(n) => Found::Value(n),
            _ => Found::Unset,
        }
    }
}

/// Raw system calls: libc's wrappers are cancellation points (`open`,
/// `read`) and set errno.
mod sys {
    use super::*;

    fn syscall3(nr: c_long, a: usize, b: usize, c: usize) -> isize {
        let ret: isize;
        // SAFETY: the `syscall` instruction with the kernel's x86_64 ABI:
        // it clobbers rcx and r11 and touches no memory but what the
        // arguments name (checked by each caller).
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") nr as isize => ret,
                in("rdi") a,
                in("rsi") b,
                in("rdx") c,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    pub(super) fn open_read_only(path: &CStr) -> i32 {
        let flags = (libc::O_RDONLY | libc::O_CLOEXEC) as usize;
        syscall3(
            libc::SYS_openat,
            libc::AT_FDCWD as usize,
            path.as_ptr() as usize,
            flags,
        ) as i32
    }

    pub(super) fn read(fd: i32, buf: &mut [u8]) -> isize {
        syscall3(
            libc::SYS_read,
            fd as usize,
            buf.as_mut_ptr() as usize,
            buf.len(),
        )
    }

    pub(super) fn close(fd: i32) {
        syscall3(libc::SYS_close, fd as usize, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(name: &[u8], chunks: &[&[u8]]) -> Option<Vec<u8>> {
        let mut out = [0u8; MAX_VALUE];
        let mut s = Scanner::new(name);
        for c in chunks {
            if let Some(f) = s.feed(c, &mut out) {
                return found(f, &out);
            }
        }
        found(s.finish(), &out)
    }

    fn found(f: Found, out: &[u8; MAX_VALUE]) -> Option<Vec<u8>> {
        match f {
            Found::Value(n) => Some(out[..n].to_vec()),
            Found::TooLong => Some(TOO_LONG.to_vec()),
            Found::Unset => None,
        }
    }

    #[test]
    fn entries_are_matched_whole_across_chunk_boundaries() {
        let env: &[u8] = b"A=1\0ALLOCPROF_RATEX=9\0XALLOCPROF_RATE=8\0ALLOCPROF_RATE=4k\0B=2\0";
        assert_eq!(scan(b"ALLOCPROF_RATE", &[env]), Some(b"4k".to_vec()));
        for cut in 0..env.len() {
            let (a, b) = env.split_at(cut);
            assert_eq!(scan(b"ALLOCPROF_RATE", &[a, b]), Some(b"4k".to_vec()));
        }
        assert_eq!(scan(b"ALLOCPROF_LEDGER", &[env]), None);
        assert_eq!(scan(b"B", &[env]), Some(b"2".to_vec()));
        assert_eq!(
            scan(b"ALLOCPROF_RATE", &[b"ALLOCPROF_RATE=\0"]),
            Some(vec![])
        );
        // The last entry may lack its NUL (a read cut short).
        assert_eq!(scan(b"B", &[b"A=1\0B=77"]), Some(b"77".to_vec()));
        let long = [b"V=".as_slice(), &[b'1'; 100], b"\0"].concat();
        assert_eq!(scan(b"V", &[&long]), Some(TOO_LONG.to_vec()));
    }

    #[test]
    fn proc_self_environ_is_read_with_raw_syscalls() {
        let mut out = [0u8; MAX_VALUE];
        // PATH is set in any test environment; its value may be long.
        let path = std::env::var("PATH").unwrap();
        match from_proc(b"PATH", &mut out) {
            Found::Value(n) => assert_eq!(&out[..n], path.as_bytes()),
            Found::TooLong => assert!(path.len() > MAX_VALUE),
            Found::Unset => panic!("PATH not found in /proc/self/environ"),
        }
        assert!(matches!(
            from_proc(b"ALLOCPROF_NO_SUCH_VARIABLE", &mut out),
            Found::Unset
        ));
    }
}
