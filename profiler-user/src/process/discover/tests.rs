use super::*;

#[test]
fn the_start_time_is_field_22_whatever_the_name_holds() {
    let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 98765 1000 50";
    assert_eq!(stat_start_ticks(stat), Some(98765));
    assert_eq!(stat_start_ticks("4242 (x) S 1 2"), None);
    assert_eq!(stat_start_ticks("garbage"), None);
}

#[test]
fn the_parent_is_field_4_whatever_the_name_holds() {
    let stat = "4242 (a) b (c) S 17 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 98765";
    assert_eq!(stat_parent(stat), Some(17));
    assert_eq!(stat_parent("4242 (x) S"), None);
    assert_eq!(stat_parent("garbage"), None);
}

#[test]
fn code_size_is_the_executable_and_its_libraries() {
    let status = "Name:\tx\nVmExe:\t  120 kB\nVmLib:\t   2048 kB\n";
    assert_eq!(parse_code_size(status), Some(2168));
    assert_eq!(parse_code_size("VmExe:\t1 kB\n"), None);
    assert_eq!(parse_code_size("VmExe:\tx kB\nVmLib:\t1 kB\n"), None);
}

#[test]
fn resident_memory_comes_from_the_rss_lines_of_status() {
    let status = "Name:\tx\nVmRSS:\t  120 kB\nRssAnon:\t   100 kB\nRssFile:\t    18 kB\nRssShmem:\t     2 kB\n";
    assert_eq!(
        parse_resident(status),
        Some(Resident {
            anon: 100 << 10,
            file: 18 << 10,
            shmem: 2 << 10
        })
    );
    assert_eq!(
        parse_resident("RssAnon: 1 kB\nRssFile: 2 kB\n"),
        None,
        "no RssShmem"
    );
    assert_eq!(
        parse_resident("RssAnon: x kB\nRssFile: 2 kB\nRssShmem: 0 kB"),
        None
    );
    let huge = format!("RssAnon: {} kB\nRssFile: 0 kB\nRssShmem: 0 kB", u64::MAX);
    assert_eq!(parse_resident(&huge), None, "overflow is malformed");
}

#[test]
fn maps_lines_parse() {
    let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 123 /usr/bin/demo
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 [heap]
7f1000000000-7f1000100000 r-xp 00028000 08:11 456      /usr/lib/a b.so (deleted)
garbage
";
    let entries = parse_maps(maps);
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0].dev, libc::makedev(0xfd, 1));
    assert_eq!(entries[0].inode, 123);
    assert!(entries[0].is_file());
    assert!(!entries[1].is_file());
    assert_eq!(entries[2].path, "/usr/lib/a b.so");
    assert!(entries[2].deleted);
    assert_eq!(entries[2].offset, 0x28000);
}

#[test]
fn a_maps_read_cut_at_its_limit_drops_the_partial_line() {
    let text = b"1000-2000 r-xp 0 fd:01 7 /a\n3000-4000 r-xp 0 fd:01 8 /b".to_vec();
    let whole = parse_maps_read(text.clone(), 1 << 20);
    assert_eq!(whole.len(), 2);
    let cut = parse_maps_read(text.clone(), text.len() as u64);
    assert_eq!(cut, whole[..1]);
    assert!(parse_maps_read(b"1000-2000 r-xp 0 fd:01 7 /a".to_vec(), 10).is_empty());
}

#[test]
fn small_proc_files_parse() {
    assert!(stat_is_live("42 (a) b) c) S 1 2"));
    assert!(!stat_is_live("42 (x) Z 1 2"));
    assert!(!stat_is_live("42 (x"));
    assert_eq!(parse_comm(b"demo\n"), "demo");
    assert_eq!(parse_comm(b"\xff\n"), "\u{fffd}");
    assert_eq!(rate_in_environ(b"A=1\0ALLOCPROF_RATE=4096\0"), 4096);
    let default = profiler_common::rate::DEFAULT_RATE;
    assert_eq!(rate_in_environ(b"ALLOCPROF_RATE=lots\0"), default);
    assert_eq!(rate_in_environ(b""), default);
    assert_eq!(
        effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n"),
        0x1ff_ffff_ffff
    );
    assert_eq!(effective_caps("CapEff:\tzz\n"), 0);
    assert_eq!(effective_caps(""), 0);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever the kernel (or a fuzzer) writes, parsing yields at most
    /// one entry per line, each of its text, and never panics.
    #[test]
    fn arbitrary_proc_text_never_panics(
        text in "([0-9a-f]{0,9}-?[0-9a-f]{0,9} [rwxsp-]{0,4} [0-9a-f]{0,9} [0-9a-f:]{0,6} [0-9]{0,6} {0,8}\\PC{0,12}\n){0,6}|\\PC{0,80}",
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
    ) {
        let entries = parse_maps(&text);
        proptest::prop_assert!(entries.len() <= text.lines().count());
        for e in &entries {
            proptest::prop_assert!(e.path.len() <= text.len());
        }
        let _ = AddressSpace::parse(&text).normalize(0x1000);
        let _ = parse_maps_read(bytes.clone(), 32);
        let _ = (stat_is_live(&text), effective_caps(&text), rate_in_environ(&bytes));
        proptest::prop_assert!(parse_comm(&bytes).len() <= 3 * bytes.len());
    }
}

#[test]
fn our_own_files_open_by_identity() {
    let mut scanner = Scanner::default();
    let scan = scanner.scan(Pid(std::process::id())).unwrap();
    let exe = fs::metadata("/proc/self/exe").unwrap();
    let addr = our_own_files_open_by_identity as *const () as u64;
    let at = scan.space.normalize(addr).expect("our code is file-backed");
    let file = at.file.open.as_ref().expect("opened");
    assert_eq!(
        file.id,
        FileId {
            dev: exe.dev(),
            ino: exe.ino()
        }
    );
    let through_fd = fs::metadata(file.fd_path()).unwrap();
    assert_eq!(through_fd.ino(), exe.ino());
}
