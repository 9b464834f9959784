//! The sampling slow path under what real programs do around it: a signal
//! handler that `siglongjmp`s out of it must not stop sampling.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{BACKENDS, apply, c_program, output_within, preloaded};

fn field(out: &str, name: &str) -> u64 {
    out.split_whitespace()
        .skip_while(|w| *w != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in {out:?}"))
}

/// A handler that `siglongjmp`s out of the slow path used to leave the
/// thread marked busy: never sampled again, every later malloc on the slow
/// path.
#[test]
fn a_siglongjmp_out_of_the_slow_path_does_not_stop_sampling() {
    let exe = c_program("siglongjmp", "siglongjmp");
    for backend in BACKENDS {
        let mut cmd = Command::new(&exe);
        apply(&mut cmd, preloaded(backend, Some("1")));
        let what = format!("siglongjmp under {backend:?}");
        let out = output_within(&mut cmd, Duration::from_secs(300), &what);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{what}: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(field(&text, "jumps"), 3000, "{what}: {text}");
    }
}
