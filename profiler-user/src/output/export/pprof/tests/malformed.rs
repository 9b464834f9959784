use prost::Message;

use super::super::{
    DecodeError, decode,
    encode::to_proto,
    proto::{self, ValueType},
};
use crate::output::export::tests::hand_made;

#[test]
fn dangling_references_are_errors() {
    let good = to_proto(&hand_made(), 0);
    type Corrupt = fn(&mut proto::Profile);
    let cases: [(Corrupt, &str); 5] = [
        (|p| p.sample[0].location_id[0] = 999, "no location 999"),
        (
            |p| p.location[0].line[0].function_id = 999,
            "no function 999",
        ),
        (|p| p.location[0].mapping_id = 999, "no mapping 999"),
        (
            |p| p.function[0].name = 9999,
            "string index 9999 out of range",
        ),
        (
            |p| p.sample[0].label[0].key = -1,
            "string index -1 out of range",
        ),
    ];
    for (corrupt, want) in cases {
        let mut p = good.clone();
        corrupt(&mut p);
        let err = decode(&p.encode_to_vec()).unwrap_err();
        assert!(matches!(err, DecodeError::Invalid(_)), "{err}");
        assert!(err.to_string().contains(want), "{err}");
    }
}

#[test]
fn garbage_is_a_clear_error() {
    assert!(matches!(decode(b"hello"), Err(DecodeError::Wire(_))));
    assert!(matches!(
        decode(&[0x1f, 0x8b, 1, 2, 3]),
        Err(DecodeError::Gzip(_))
    ));
    let cpu = proto::Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        string_table: ["", "samples", "count"].map(String::from).to_vec(),
        ..Default::default()
    };
    let err = decode(&cpu.encode_to_vec()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a heap profile: no sample type alloc_objects"
    );
}
