//! pprof's `profile.proto` messages, generated at build time from
//! `proto/profile.proto` (see build.rs): prost encodes and decodes them.
//! Decoding skips fields allocprof does not know, and accepts both packed
//! and unpacked repeated scalars, as protobuf requires.

#[allow(
    clippy::all,
    clippy::pedantic,
    unused_qualifications,
    trivial_numeric_casts,
    reason = "generated code"
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

pub use generated::*;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;

    fn sample_profile() -> Profile {
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample {
                location_id: vec![1, u64::MAX],
                value: vec![-1, 0, i64::MAX],
                label: vec![Label {
                    key: 1,
                    str: 0,
                    num: 42,
                    num_unit: 0,
                }],
            }],
            mapping: vec![Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x2000,
                filename: 3,
                has_functions: true,
                ..Default::default()
            }],
            location: vec![Location {
                id: 1,
                mapping_id: 1,
                address: 0,
                line: vec![Line {
                    function_id: 1,
                    line: 10,
                    column: 0,
                }],
                is_folded: false,
            }],
            function: vec![Function {
                id: 1,
                name: 1,
                system_name: 1,
                filename: 3,
                start_line: 0,
            }],
            string_table: ["", "a", "", "ünïcode", "x"].map(String::from).to_vec(),
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 5,
            period_type: Some(ValueType { r#type: 1, unit: 0 }),
            period: 524_288,
            comment: vec![3, 4],
            default_sample_type: 1,
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let p = sample_profile();
        assert_eq!(Profile::decode(&p.encode_to_vec()[..]).unwrap(), p);
    }

    #[test]
    fn known_bytes() {
        // ValueType{type: 1, unit: 2} as field 1, then strings "" and "ab".
        let p = Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: vec![String::new(), "ab".into()],
            ..Default::default()
        };
        assert_eq!(
            p.encode_to_vec(),
            [0x0a, 4, 0x08, 1, 0x10, 2, 0x32, 0, 0x32, 2, b'a', b'b']
        );
    }

    #[test]
    fn unpacked_repeated_and_unknown_fields_are_accepted() {
        // Sample with location_id 7 and 8 unpacked, and an unknown fixed32
        // and fixed64 field.
        let sample = [
            0x08, 7, 0x08, 8, 0x7d, 1, 2, 3, 4, 0x79, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let mut bytes = vec![0x12, sample.len() as u8];
        bytes.extend_from_slice(&sample);
        let p = Profile::decode(&bytes[..]).unwrap();
        assert_eq!(p.sample[0].location_id, [7, 8]);
    }

    #[test]
    fn malformed_input_is_an_error() {
        let good = sample_profile().encode_to_vec();
        for cut in 1..good.len() {
            // Every strict prefix either fails or decodes to something
            // smaller: never a panic.
            let _ = Profile::decode(&good[..cut]);
        }
        for bad in [
            &[0x0a, 5, 1][..],
            &[0x0b],
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ],
            &[0x32, 1, 0xff],
            &[0x60, 1, 0x0a, 1, 0x08],
        ] {
            assert!(Profile::decode(bad).is_err(), "{bad:x?}");
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Profile::decode(&bytes[..]);
        }

        #[test]
        fn samples_round_trip(
            locations in proptest::collection::vec(any::<u64>(), 0..20),
            values in proptest::collection::vec(any::<i64>(), 0..8),
            strings in proptest::collection::vec(".*", 0..8),
        ) {
            let mut string_table = vec![String::new()];
            string_table.extend(strings);
            let p = Profile {
                sample: vec![Sample { location_id: locations, value: values, label: vec![] }],
                string_table,
                ..Default::default()
            };
            prop_assert_eq!(Profile::decode(&p.encode_to_vec()[..]).unwrap(), p);
        }
    }
}
