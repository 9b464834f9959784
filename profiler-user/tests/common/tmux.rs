//! A terminal for the TUI tests: a private tmux server running allocprof
//! in a pane; keys sent with `send-keys`, the screen read with
//! `capture-pane`. Checks poll the pane with a generous deadline (nothing
//! timed) and fail with what it showed.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

pub const DEADLINE: Duration = Duration::from_secs(60);

/// A private tmux server (its own socket), killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn start(width: u16, height: u16, script: &str) -> Tmux {
        // One server per test: the tests of this file run in parallel.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmux = Tmux {
            socket: format!("allocprof-tui-test-{}-{n}", std::process::id()),
        };
        let status = tmux
            .command()
            .args(["new-session", "-d", "-s", "tui"])
            .args(["-x", &width.to_string(), "-y", &height.to_string()])
            .args(["sh", "-c", script])
            .status()
            .expect("tmux is needed for the TUI test (apt-get install tmux)");
        assert!(status.success(), "starting tmux failed");
        tmux
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new("tmux");
        // No user configuration; UTF-8 whatever the locale.
        cmd.args(["-L", &self.socket, "-f", "/dev/null", "-u"])
            .env("TERM", "xterm-256color")
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8");
        cmd
    }

    pub fn output(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn pane(&self) -> String {
        self.output(&["capture-pane", "-p", "-t", "tui"])
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "tui"];
        args.extend(keys);
        self.output(&args);
    }

    /// Types `text` literally (`?` and friends are not key names then).
    pub fn literal(&self, text: &str) {
        self.output(&["send-keys", "-t", "tui", "-l", text]);
    }

    /// Polls the pane until `ok` holds; fails with the pane otherwise.
    pub fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let pane = self.pane();
            if ok(&pane) {
                return pane;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; the pane shows:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .command()
            .arg("kill-server")
            .stderr(Stdio::null())
            .status();
    }
}

/// `p` quoted for `sh -c`.
pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}
