//! Real files: one small read for a large data file, absurd sizes
//! refused before reading, files parsed like images.

use super::*;

/// A real sparse file of `len` bytes starting with `head`.
fn sparse_file(name: &str, head: &[u8], len: u64) -> (PathBuf, File) {
    let path = std::env::temp_dir().join(format!("allocprof-{name}-{}", std::process::id()));
    std::fs::write(&path, head).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len).unwrap();
    (path.clone(), File::open(&path).unwrap())
}

#[test]
fn a_large_data_file_costs_one_small_read() {
    let (path, file) = sparse_file("data", b"just data", 4 << 30);
    let err = probes_in_open_file(&file).unwrap_err();
    std::fs::remove_file(path).unwrap();
    assert!(matches!(err, NoteError::NotElf), "{err}");
}

#[test]
fn absurd_section_sizes_are_refused_before_reading() {
    // A valid image whose .note.stapsdt claims 3 GiB, in a 4 GiB sparse
    // file: reading it whole is what a hostile target would want.
    let mut image = Image::new(two_probes()).build();
    let mut reader = Reader::new(Source::Bytes(&image), image.len() as u64);
    let header = file_header(&mut reader).unwrap();
    let sections = section_headers(&mut reader, &header).unwrap();
    let names = section_names(&mut reader, &header, &sections).unwrap();
    let index = sections
        .iter()
        .position(|sh| name_is(&names, sh.sh_name.get(LE), NOTE_SECTION))
        .unwrap();
    let sh_size = header.e_shoff.get(LE) as usize + index * 64 + 32;
    image[sh_size..sh_size + 8].copy_from_slice(&(3u64 << 30).to_le_bytes());
    let (path, file) = sparse_file("elf", &image, 4 << 30);
    let err = probes_in_open_file(&file).unwrap_err();
    std::fs::remove_file(path).unwrap();
    assert!(
        matches!(
            err,
            NoteError::TooLarge {
                what: "note area",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn files_parse_like_images() {
    let image = Image::new(two_probes()).build();
    let (path, file) = sparse_file("probes", &image, image.len() as u64);
    let probes = probes_in_open_file(&file).unwrap();
    std::fs::remove_file(path).unwrap();
    check_two_probes(&probes);
}
