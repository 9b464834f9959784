//! `cargo xtask demo`: the demo workload under allocprof; `cargo xtask demo
//! python`: the tests' Python web service
//! (`profiler-user/tests/workloads/python_service.py`) under Debian's
//! python3, `PYTHONMALLOC=malloc` and `liballocprof.so`, with a steady load
//! of requests from this process.

use std::{
    io::{BufRead, BufReader, IsTerminal, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::shell;

/// Builds everything, starts the demo workload and profiles it: in a
/// terminal until you quit, otherwise for ten seconds with a final report.
pub fn run(root: &Path) -> Result<()> {
    shell::cargo(root, &["build", "--release"])?;
    let mut workload = Command::new(root.join("target/release/allocprof-demo"))
        .stdout(Stdio::null())
        .spawn()
        .context("starting the demo workload")?;
    let pid = workload.id().to_string();
    // The workload waits a second before its first allocations; attach early.
    thread::sleep(Duration::from_millis(300));
    let mut args = vec!["--pid", &pid];
    if !std::io::stdout().is_terminal() {
        args.extend(["--duration", "10s"]);
    }
    let profiled = shell::run_cmd(
        Command::new(root.join("target/release/allocprof"))
            .args(&args)
            .current_dir(root),
    );
    let _ = workload.kill();
    let _ = workload.wait();
    profiled
}

/// The Python web service under allocprof: its cache grows with each new
/// key and its uploads leak, while allocprof shows the handlers' lines.
pub fn python(root: &Path) -> Result<()> {
    shell::cargo(
        root,
        &[
            "build",
            "--release",
            "-p",
            "allocprof",
            "-p",
            "liballocprof",
        ],
    )?;
    let script = root.join("profiler-user/tests/workloads/python_service.py");
    let mut service = Command::new("/usr/bin/python3")
        .arg(&script)
        .env("PYTHONMALLOC", "malloc")
        .env("LD_PRELOAD", root.join("target/release/liballocprof.so"))
        .stdout(Stdio::piped())
        .spawn()
        .context("starting /usr/bin/python3 on the demo service")?;
    let result = profile_service(root, &mut service);
    let _ = service.kill();
    let _ = service.wait();
    result
}

fn profile_service(root: &Path, service: &mut Child) -> Result<()> {
    let mut line = String::new();
    BufReader::new(service.stdout.take().context("the service's stdout")?).read_line(&mut line)?;
    let Some(port) = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse::<u16>().ok())
    else {
        bail!("the service said {line:?}, not its port");
    };
    let pid = service.id().to_string();
    let mut args = vec!["--pid", &pid];
    if !std::io::stdout().is_terminal() {
        args.extend(["--duration", "10s"]);
    }
    let mut allocprof = Command::new(root.join("target/release/allocprof"))
        .args(&args)
        .current_dir(root)
        .spawn()
        .context("starting allocprof")?;
    // Give it time to attach before the load begins.
    thread::sleep(Duration::from_secs(1));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Cache reads over a key set growing to 2000 keys, one
                // upload in four.
                let sent = if i % 4 == 3 {
                    request(port, "POST /upload", &vec![b'x'; 32 * 1024])
                } else {
                    request(port, &format!("GET /cache?key=user-{}", i / 3 % 2000), &[])
                };
                if sent.is_err() {
                    break;
                }
                i += 1;
                thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let status = allocprof.wait();
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    let status = status?;
    if !status.success() {
        bail!("allocprof exited with {status}");
    }
    Ok(())
}

/// One HTTP/1.0 request to the service on `port`, its answer read.
fn request(port: u16, line: &str, body: &[u8]) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    write!(
        stream,
        "{line} HTTP/1.0\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.read_to_end(&mut Vec::new())?;
    Ok(())
}
