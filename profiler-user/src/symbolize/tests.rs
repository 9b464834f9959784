use super::*;

fn frame(function: &str, module: &str) -> Frame {
    Frame {
        function: function.into(),
        location: None,
        module: Some(module.into()),
        inlined: false,
        offset: None,
        kind: FrameKind::Native,
    }
}

#[test]
fn equal_names_are_shared_and_forgotten_once_unused() {
    let mut names = Interner::default();
    let held = names.name("main");
    assert!(Arc::ptr_eq(&held, &names.name("main")));
    for i in 0..10_000 {
        names.name(&format!("f{i}"));
    }
    names.sweep();
    assert_eq!(names.values.len(), 1, "only the name a frame holds stays");
    assert!(Arc::ptr_eq(&held, &names.name("main")));
}

#[test]
fn cxx_allocator_and_standard_library_frames_are_library_frames() {
    let lib = |name: &str| is_library_frame(&frame(name, "/usr/bin/app"));
    for name in [
        "operator new(unsigned long)",
        "operator new[](unsigned long)",
        "operator new(unsigned long, std::align_val_t)",
        "std::__new_allocator<int>::allocate(unsigned long, void const*)",
        "__gnu_cxx::new_allocator<int>::allocate(unsigned long, void const*)",
        "std::allocator_traits<std::allocator<int> >::allocate(std::allocator<int>&, \
         unsigned long)",
        "std::_Vector_base<int, std::allocator<int> >::_M_allocate(unsigned long)",
        "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>\
         (__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, \
         int const&)",
        "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> \
         >::_M_create(unsigned long&, unsigned long)",
        "std::vector<Foo, std::allocator<Foo> >::push_back(Foo const&)",
        "std::unique_ptr<ns::Foo, std::default_delete<ns::Foo> > \
         std::make_unique<ns::Foo>()",
        "__gnu_cxx::__normal_iterator<int*, std::vector<int> >::operator++()",
    ] {
        assert!(lib(name), "{name}");
    }
    // The program's own functions, even returning standard types.
    for name in [
        "grow_vector()",
        "ns::make_foo()",
        "std::vector<int, std::allocator<int> > ns::load(char const*)",
        "unsigned long ns::Cache::fill(std::__cxx11::basic_string<char> const&)",
        "ns::Foo::operator new(unsigned long)",
        "main",
        "app::load::{{closure}}",
    ] {
        assert!(!lib(name), "{name}");
    }
    // Anything libstdc++ (or libc++) runs is the library's.
    assert!(is_library_frame(&frame(
        "some_internal_helper",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
    )));
    assert!(is_library_frame(&frame("f", "/usr/lib/libc++.so.1")));
    // A C++ stack is named by its first frame of the program.
    let stack = [
        frame(
            "operator new(unsigned long)",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        ),
        frame(
            "std::__new_allocator<int>::allocate(unsigned long, void const*)",
            "/usr/bin/app",
        ),
        frame(
            "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>\
             (__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > \
             >, int const&)",
            "/usr/bin/app",
        ),
        frame("grow_vector()", "/usr/bin/app"),
        frame("main", "/usr/bin/app"),
    ];
    assert_eq!(
        &*most_informative(&stack).unwrap().function,
        "grow_vector()"
    );
}

#[test]
fn only_mangled_names_are_demangled() {
    for c_name in ["ra", "rb", "rc", "main", "Z", "_start", "malloc"] {
        assert_eq!(demangle(c_name), c_name);
    }
    assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
    assert_eq!(
        demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
        "std::vector<int, std::allocator<int> >::push_back(int const&)"
    );
    assert_eq!(
        demangle("_ZN9allocator4usdt5alloc17h367255860e0173dfE"),
        "allocator::usdt::alloc"
    );
    assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
    assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
}

#[test]
fn allocator_frames_are_stripped_from_the_top_only() {
    let frames = vec![
        frame("fire_alloc_probe", "/opt/allocprof/liballocprof.so"),
        frame("malloc", "/opt/allocprof/liballocprof.so"),
        frame("__rust_alloc", "/usr/bin/app"),
        frame("app::build", "/usr/bin/app"),
        frame("alloc::alloc::alloc", "/usr/bin/app"),
        frame("main", "/usr/bin/app"),
    ];
    let kept = strip_allocator_frames(frames);
    let names: Vec<_> = kept.iter().map(|f| &*f.function).collect();
    assert_eq!(names, ["app::build", "alloc::alloc::alloc", "main"]);
}

#[test]
fn own_test_binary_symbolizes_with_file_and_line() {
    // Symbolize an address of this very test function from our own file.
    let space =
        crate::process::normalize::AddressSpace::read(crate::ids::Pid(std::process::id())).unwrap();
    let addr = own_test_binary_symbolizes_with_file_and_line as *const () as u64;
    let at = space.normalize(addr).expect("our code is file-backed");
    let frames = symbolize_stack(&symbolizer(), &mut Interner::default(), &[(addr, Some(at))]);
    let f = frames.last().unwrap();
    assert!(
        f.function
            .contains("own_test_binary_symbolizes_with_file_and_line"),
        "{f:?}"
    );
    assert!(
        f.location
            .as_deref()
            .is_some_and(|l| l.contains("symbolize/tests.rs")),
        "{f:?}"
    );
}

#[test]
fn unsymbolized_frames_keep_their_file_offsets() {
    // This function's address and a return address into it: the caller's
    // offset steps back into its call, the first frame's does not.
    let space =
        crate::process::normalize::AddressSpace::read(crate::ids::Pid(std::process::id())).unwrap();
    let addr = unsymbolized_frames_keep_their_file_offsets as *const () as u64;
    let at = space.normalize(addr).expect("our code is file-backed");
    let offset = at.file_offset;
    let stack = [
        (addr, Some(at.clone())),
        (addr + 8, space.normalize(addr + 8)),
        (TRUNCATED_FRAME, None),
    ];
    let frames = address_stack(&mut Interner::default(), &stack);
    let offsets: Vec<_> = frames.iter().map(|f| f.offset).collect();
    assert_eq!(offsets, [Some(offset), Some(offset + 7), None]);
    let module = at.file.path.display().to_string();
    assert!(
        frames[..2]
            .iter()
            .all(|f| f.module.as_deref() == Some(&*module))
    );
    assert!(frames[2].function.starts_with("[truncated"), "{frames:?}");
}

#[test]
fn files_are_released_once_their_stacks_are_symbolized() {
    let space =
        crate::process::normalize::AddressSpace::read(crate::ids::Pid(std::process::id())).unwrap();
    let addr = files_are_released_once_their_stacks_are_symbolized as *const () as u64;
    let at = space.normalize(addr).expect("our code is file-backed");
    let file = Arc::downgrade(at.file.open.as_ref().expect("opened"));
    // The process is gone and its image pruned; its stack is pending.
    drop(space);
    assert!(file.upgrade().is_some(), "a pending stack keeps its file");
    let thread = SymbolizerThread::spawn();
    thread.submit(vec![Request {
        key: 1u32,
        frames: vec![(addr, Some(at))],
        python: Vec::new(),
    }]);
    let responses = thread.wait(1);
    assert!(
        responses[0]
            .frames
            .iter()
            .any(|f| f.function.contains("files_are_released")),
        "{:?}",
        responses[0].frames
    );
    assert!(file.upgrade().is_none(), "symbolized: the file is released");
}

#[test]
fn blazesym_forgets_released_files() {
    let mut symbolizer = symbolizer();
    let mut used = UsedFiles::default();
    let space =
        crate::process::normalize::AddressSpace::read(crate::ids::Pid(std::process::id())).unwrap();
    let addr = blazesym_forgets_released_files as *const () as u64;
    let frames = vec![(addr, space.normalize(addr))];
    used.note(&frames);
    let symbolized = symbolize_stack(&symbolizer, &mut Interner::default(), &frames);
    assert!(symbolized[0].function.contains("blazesym_forgets"));
    used.evict_released(&mut symbolizer);
    assert_eq!(used.len(), 1, "still held by the address space");
    drop((space, frames));
    used.evict_released(&mut symbolizer);
    assert_eq!(used.len(), 0, "released files leave blazesym's cache");
}

thread_local! {
    /// Makes `resolve` panic for this file (tests of containment: no
    /// file at hand is known to make blazesym itself panic).
    static PANIC_ON: std::cell::RefCell<Option<PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

pub(super) fn maybe_inject_panic(source: &Source<'_>) {
    if let Source::Elf(elf) = source
        && PANIC_ON.with_borrow(|p| p.as_ref() == Some(&elf.path))
    {
        panic!("injected for {}", elf.path.display());
    }
}

/// A malformed ELF: a valid identification, then garbage (section
/// headers "at" an absurd offset).
fn malformed_elf(name: &str) -> OpenFile {
    let path = std::env::temp_dir().join(format!("allocprof-{name}-{}", std::process::id()));
    let mut data = b"\x7fELF\x02\x01\x01\0".to_vec();
    data.resize(64, 0);
    data[16] = 3; // ET_DYN
    data[18] = 62; // EM_X86_64
    data[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
    data[58] = 64; // e_shentsize
    data[60] = 0xff; // e_shnum
    data.extend(std::iter::repeat_n(0xa5, 4096));
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    OpenFile {
        id: crate::process::discover::FileId { dev: 0, ino: 1 },
        file,
        display: PathBuf::from("/opt/broken/libbroken.so"),
    }
}

#[test]
fn a_panic_in_one_file_costs_only_that_file_s_frames() {
    let space =
        crate::process::normalize::AddressSpace::read(crate::ids::Pid(std::process::id())).unwrap();
    // As a return address (callers' frames are looked up one byte back).
    let addr = a_panic_in_one_file_costs_only_that_file_s_frames as *const () as u64 + 1;
    let ours = space.normalize(addr).expect("our code is file-backed");
    let broken = Arc::new(malformed_elf("broken"));
    let at_broken = FileAddr {
        file: Arc::new(MappedFile {
            path: broken.display.clone(),
            open: Some(broken.clone()),
        }),
        file_offset: 0x1234,
    };
    let stack = [(0x7f00_0000_1234, Some(at_broken)), (addr, Some(ours))];
    let symbolizer = symbolizer();
    // Malformed, blazesym reports an error: an unknown frame.
    let frames = symbolize_stack(&symbolizer, &mut Interner::default(), &stack);
    assert_eq!(&*frames[0].function, "libbroken.so+0x1234", "{frames:?}");
    // Panicking on it (injected), the frame is unknown with the reason,
    // the other file still symbolizes, and the panic hook stays quiet.
    PANIC_ON.set(Some(broken.fd_path()));
    let hook_ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran = hook_ran.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |_| {
        ran.store(true, std::sync::atomic::Ordering::SeqCst)
    }));
    let frames = {
        let _quiet = QuietContainedPanics::install();
        symbolize_stack(&symbolizer, &mut Interner::default(), &stack)
    };
    std::panic::set_hook(previous);
    PANIC_ON.set(None);
    assert!(
        frames[0]
            .function
            .starts_with("libbroken.so+0x1234 [symbolizer panicked: injected"),
        "{frames:?}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f.function.contains("a_panic_in_one_file_costs_only")),
        "{frames:?}"
    );
    assert!(
        !hook_ran.load(std::sync::atomic::Ordering::SeqCst),
        "a contained panic must not reach the panic hook (the TUI's restores the terminal)"
    );
    // The thread is still usable.
    let again = symbolize_stack(&symbolizer, &mut Interner::default(), &stack[1..]);
    assert!(again[0].function.contains("a_panic_in_one_file_costs_only"));
}

#[test]
fn a_stack_is_symbolized_once_for_all_the_processes_that_have_it() {
    let file = |path: &str| {
        Arc::new(MappedFile {
            path: path.into(),
            open: None,
        })
    };
    let at = |f: &Arc<MappedFile>, offset| FileAddr {
        file: f.clone(),
        file_offset: offset,
    };
    let (app, lib) = (file("/usr/bin/app"), file("/usr/lib/libx.so"));
    // Two processes, their code at other addresses (ASLR), the same places.
    let one = vec![
        (0x1000, Some(at(&app, 0x10))),
        (0x7000, Some(at(&lib, 0x20))),
    ];
    let two = vec![
        (0x9000, Some(at(&app, 0x10))),
        (0x5000, Some(at(&lib, 0x20))),
    ];
    let mut memo = Memo::default();
    let mut calls = 0;
    let mut names = |frames: &[(u64, Option<FileAddr>)]| {
        calls += 1;
        frames
            .iter()
            .map(|(a, at)| Frame::unknown(*a, at.as_ref()))
            .collect::<Vec<_>>()
    };
    let first = memo.symbolize(&one, &mut names);
    assert_eq!(memo.symbolize(&two, &mut names), first);
    // Another offset, another file by the same name elsewhere, or an
    // address outside any file: symbolized anew.
    let other = vec![
        (0x1000, Some(at(&app, 0x11))),
        (0x7000, Some(at(&lib, 0x20))),
    ];
    let renamed = vec![
        (0x1000, Some(at(&file("/opt/app"), 0x10))),
        (0x7000, Some(at(&lib, 0x20))),
    ];
    memo.symbolize(&other, &mut names);
    memo.symbolize(&renamed, &mut names);
    memo.symbolize(&[(0x1000, None)], &mut names);
    assert_ne!(
        memo.symbolize(&[(0x2000, None)], &mut names),
        memo.symbolize(&[(0x1000, None)], &mut names)
    );
    assert_eq!(calls, 5, "the second process's stacks came from the memo");
}
