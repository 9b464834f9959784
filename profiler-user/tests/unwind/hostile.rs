//! A crafted .eh_frame is refused within its work budget and holds up no other process's tables.

use super::*;

/// `crafted_cfi_main.c` over `libcrafted_cfi.so`, whose `.eh_frame` is one
/// CIE of `nops` `DW_CFA_nop`s shared by `fdes` FDEs of one byte of code
/// each (written as assembly, linked by gcc like any library): gimli runs
/// the CIE's instructions again for every FDE, so compiling it unbounded
/// costs `nops × fdes` steps.
fn crafted_cfi_workload(nops: usize, fdes: usize) -> Command {
    use std::fmt::Write as _;
    let dir = common::scratch_dir(&format!("crafted-cfi-{}-{nops}-{fdes}", std::process::id()));
    let mut s = String::new();
    // FDEs point at a local label: a pc-relative reference to the global
    // symbol would need a text relocation.
    s +=
        "\t.text\n\t.globl crafted_code\n\t.type crafted_code, @function\ncrafted_code:\n.Lcode:\n";
    writeln!(s, "\t.fill {fdes}, 1, 0xc3").unwrap();
    s += "\t.section .eh_frame,\"a\",@progbits\n\t.balign 8\ncie:\n";
    s += "\t.long cie_end - cie_id\ncie_id:\n\t.long 0\n\t.byte 1\n\t.string \"zR\"\n";
    // Code and data alignment, return address column, augmentation data:
    // FDE pointers pc-relative 4-byte. Then CFA = rsp + 8, RA at CFA - 8.
    s += "\t.uleb128 1\n\t.sleb128 -8\n\t.uleb128 16\n\t.uleb128 1\n\t.byte 0x1b\n";
    s += "\t.byte 0x0c, 0x07, 0x08\n\t.byte 0x90, 0x01\n";
    // The nops, then DW_CFA_def_cfa_offset 8: ld trims trailing nops.
    writeln!(
        s,
        "\t.fill {nops}, 1, 0\n\t.byte 0x0e, 0x08\n\t.balign 4, 0\ncie_end:"
    )
    .unwrap();
    for i in 0..fdes {
        writeln!(
            s,
            "\t.long 1f - 0f\n0:\t.long 0b - cie\n\t.long .Lcode + {i} - .\n\t.long 1\n\t.uleb128 0\n\t.balign 4, 0\n1:"
        )
        .unwrap();
    }
    s += "\t.section .note.GNU-stack,\"\",@progbits\n";
    let asm = dir.join("crafted_cfi.s");
    std::fs::write(&asm, s).unwrap();
    let status = Command::new("gcc")
        .args(["-shared", "-o"])
        .arg(dir.join("libcrafted_cfi.so"))
        .arg(&asm)
        .status()
        .expect("gcc");
    assert!(status.success(), "assembling the crafted library failed");
    let exe = common::compile_c(
        "crafted_cfi_main.c",
        &[
            "-L",
            dir.to_str().unwrap(),
            "-lcrafted_cfi",
            &format!("-Wl,-rpath,{}", dir.display()),
        ],
    );
    Command::new(exe)
}

#[test]
fn a_crafted_eh_frame_is_refused_and_holds_up_no_other_process_s_tables() {
    common::require_bpf();
    // A 1 MiB .eh_frame: 11.5 billion CIE steps unbounded (11.6 s measured).
    let mut crafted = Proc::spawn(crafted_cfi_workload(512 * 1024, 22_000));
    crafted.expect("ready");
    let exe = common::compile_c(
        "nofp_sites.c",
        &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    let mut w = Proc::spawn(Command::new(exe));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    // The crafted process first: its files are asked for first.
    let mut session = Session::start(
        Target::Pids(vec![Pid(crafted.pid()), Pid(w.pid())]),
        Limits::default(),
    )
    .unwrap();
    // A generous bound (the old code compiled the file for its full cost
    // while every table behind it waited): fail, never hang.
    let deadline = Instant::now() + Duration::from_secs(60);
    while session.unwind_status().loading > 0 {
        assert!(
            Instant::now() < deadline,
            "unwind tables still loading after 60 s: {:?}, {:?}",
            session.unwind_status(),
            session.warnings
        );
        session.poll_events();
        std::thread::sleep(Duration::from_millis(20));
    }
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let whole: f64 = p
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == "main"))
        .map(|s| s.totals.live_bytes)
        .sum();
    assert!(
        whole >= 0.9 * p.totals.live_bytes,
        "{:.1}% of the live heap of the program without frame pointers is under stacks that \
         reach main: {:#?}",
        100.0 * whole / p.totals.live_bytes,
        p.stacks
    );
    let refused: Vec<&String> = session
        .warnings
        .iter()
        .filter(|w| {
            w.contains("libcrafted_cfi.so") && w.contains("call-frame information would take")
        })
        .collect();
    assert_eq!(refused.len(), 1, "reported once: {:?}", session.warnings);
    assert!(
        refused[0].contains("walked by frame pointers"),
        "{}",
        refused[0]
    );
    assert!(session.unwind_status().unavailable >= 1);
    w.send("exit");
    crafted.send("exit");
}
