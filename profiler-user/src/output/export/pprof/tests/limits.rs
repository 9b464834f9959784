use std::io::Write;

use flate2::{Compression, write::GzEncoder};
use prost::Message;

use super::super::{
    DecodeError, Limits, MAX_PROFILE_BYTES, decode, decode_with,
    encode::to_proto,
    limits::prescan,
    proto::{self, Label, Sample},
    render,
};
use crate::output::export::tests::hand_made;

#[test]
fn decompression_bombs_are_refused_before_decoding() {
    // 80 MiB of empty sample_type fields, gzip'd to well under 1 MiB:
    // decoded, each pair would become a ValueType.
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    let chunk = [0x0a_u8, 0x00].repeat(1 << 20);
    for _ in 0..40 {
        gz.write_all(&chunk).unwrap();
    }
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    assert!(matches!(
        decode(&bomb),
        Err(DecodeError::TooLarge(MAX_PROFILE_BYTES))
    ));
    // Uncompressed, the same limit holds.
    let raw = vec![0u8; (MAX_PROFILE_BYTES + 1) as usize];
    assert!(matches!(decode(&raw), Err(DecodeError::TooLarge(_))));
    // And it can be raised (or lowered).
    let small = Limits {
        bytes: 1000,
        ..Default::default()
    };
    let file = render(&hand_made(), 1);
    assert!(file.len() < 1000);
    assert!(matches!(
        decode_with(&file, &small),
        Err(DecodeError::TooLarge(1000))
    ));
    assert_eq!(
        DecodeError::TooLarge(MAX_PROFILE_BYTES).to_string(),
        "larger than 64 MiB uncompressed (the limit); --max-profile-bytes raises it"
    );
}

/// The limits that `p` just fits in.
fn tight(p: &proto::Profile) -> Limits {
    Limits {
        bytes: p.encoded_len() as u64,
        samples: p.sample.len(),
        locations: p.location.len(),
        functions: p.function.len(),
        mappings: p.mapping.len(),
        strings: p.string_table.len(),
        lines_per_location: p.location.iter().map(|l| l.line.len()).max().unwrap(),
        labels_per_sample: p.sample.iter().map(|s| s.label.len()).max().unwrap(),
        stack_depth: p.sample.iter().map(|s| s.location_id.len()).max().unwrap(),
        frames: decode(&p.encode_to_vec())
            .unwrap()
            .processes
            .iter()
            .flat_map(|p| &p.stacks)
            .map(|s| s.frames.len())
            .sum(),
    }
}

#[test]
fn each_limit_is_its_own_error_one_past_it() {
    let p = to_proto(&hand_made(), 0);
    let bytes = p.encode_to_vec();
    let fits = tight(&p);
    assert!(decode_with(&bytes, &fits).is_ok());
    type Lower = fn(&mut Limits) -> &mut usize;
    type Is = fn(&DecodeError) -> bool;
    let cases: [(Lower, Is, &str); 9] = [
        (
            |l| &mut l.samples,
            |e| matches!(e, DecodeError::TooManySamples(_)),
            "samples",
        ),
        (
            |l| &mut l.locations,
            |e| matches!(e, DecodeError::TooManyLocations(_)),
            "locations",
        ),
        (
            |l| &mut l.functions,
            |e| matches!(e, DecodeError::TooManyFunctions(_)),
            "functions",
        ),
        (
            |l| &mut l.mappings,
            |e| matches!(e, DecodeError::TooManyMappings(_)),
            "mappings",
        ),
        (
            |l| &mut l.strings,
            |e| matches!(e, DecodeError::TooManyStrings(_)),
            "strings",
        ),
        (
            |l| &mut l.lines_per_location,
            |e| matches!(e, DecodeError::TooManyLines(_)),
            "lines",
        ),
        (
            |l| &mut l.labels_per_sample,
            |e| matches!(e, DecodeError::TooManyLabels(_)),
            "labels",
        ),
        (
            |l| &mut l.stack_depth,
            |e| matches!(e, DecodeError::TooDeep(_)),
            "stack depth",
        ),
        (
            |l| &mut l.frames,
            |e| matches!(e, DecodeError::TooManyFrames(_)),
            "frames",
        ),
    ];
    for (lower, is, name) in cases {
        let mut limits = fits;
        *lower(&mut limits) -= 1;
        let limit = *lower(&mut limits);
        let err = decode_with(&bytes, &limits).unwrap_err();
        assert!(is(&err), "{name}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("more than {limit} ")), "{msg}");
        assert!(msg.contains(name) && msg.contains("limit"), "{msg}");
    }
}

#[test]
fn default_limits_hold_against_crafted_counts() {
    // A million and one empty samples: 2 MiB on the wire.
    let p = proto::Profile {
        sample: vec![Sample::default(); 1_000_001],
        ..Default::default()
    };
    let err = decode(&p.encode_to_vec()).unwrap_err();
    assert_eq!(err.to_string(), "more than 1000000 samples (the limit)");
    // (The frame total is tried at a lower limit above: reaching the
    // default takes 16M frame copies, seconds in a debug build.)
}

#[test]
fn decoded_size_is_bounded_before_prost_allocates() {
    // Samples of 64 empty labels, 2 wire bytes each: 32 bytes decoded,
    // 64 with Vec growth, so 600 KiB would take past 16 times 1 MiB.
    let p = proto::Profile {
        sample: vec![
            Sample {
                label: vec![Label::default(); 64],
                ..Default::default()
            };
            4800
        ],
        ..Default::default()
    };
    let limits = Limits {
        bytes: 1 << 20,
        ..Default::default()
    };
    let err = decode_with(&p.encode_to_vec(), &limits).unwrap_err();
    assert!(matches!(err, DecodeError::TooLargeDecoded(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "would take more than 16 MiB once decoded (the limit, 16 times \
         --max-profile-bytes, which raises it)"
    );
    assert!(p.encoded_len() < 1 << 20);
    // Real profiles are estimated at a few times their bytes.
    let real = to_proto(&hand_made(), 0).encode_to_vec();
    let estimate = prescan(&real, &Limits::default()).unwrap();
    assert!(
        estimate < 8 * real.len() as u64,
        "{estimate} for {}",
        real.len()
    );
}

#[test]
fn deep_nesting_is_refused_by_prost() {
    // profile.proto has no recursive message: depth comes only from
    // groups in unknown fields, which prost skips up to its limit.
    let nested = |depth: usize| {
        let mut b = Vec::new();
        b.extend([0xa3, 0x06].repeat(depth)); // field 100, start group
        b.extend([0xa4, 0x06].repeat(depth)); // field 100, end group
        b
    };
    // Shallow groups are skipped (then the profile is found empty).
    assert!(matches!(decode(&nested(10)), Err(DecodeError::NotHeap(_))));
    let err = decode(&nested(10_000)).unwrap_err();
    assert!(matches!(err, DecodeError::Wire(_)), "{err}");
    assert!(format!("{err:?}").contains("RecursionLimit"), "{err:?}");
}
