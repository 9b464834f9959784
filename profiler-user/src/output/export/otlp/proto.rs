//! The OTLP profiles messages (`opentelemetry.proto.*`, opentelemetry-proto
//! v1.11.0, vendored in `proto/opentelemetry/`), generated at build time
//! (see build.rs): prost encodes and decodes them. v1.10.0 and v1.11.0 have
//! the same wire format, the one OpenTelemetry Collector v0.161.0 (pdata
//! v1.67.0) reads; v1.9.0's `Sample` numbered its fields differently.

#[allow(
    clippy::all,
    clippy::pedantic,
    unused_qualifications,
    trivial_numeric_casts,
    reason = "generated code"
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/opentelemetry.rs"));
}

pub use generated::opentelemetry::proto::{
    collector::profiles::v1development as collector, common::v1 as common,
    profiles::v1development as profiles, resource::v1 as resource,
};

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::{collector::ExportProfilesServiceRequest, profiles::*};

    /// The request sent and the `ProfilesData` the collector writes out are
    /// the same fields: one encoding reads as the other.
    #[test]
    fn a_request_and_profiles_data_share_their_wire_format() {
        let data = ProfilesData {
            resource_profiles: vec![ResourceProfiles {
                schema_url: "s".into(),
                ..Default::default()
            }],
            dictionary: Some(ProfilesDictionary {
                string_table: vec!["".into(), "main".into()],
                stack_table: vec![
                    Stack::default(),
                    Stack {
                        location_indices: vec![1, 2],
                    },
                ],
                ..Default::default()
            }),
        };
        let request = ExportProfilesServiceRequest::decode(&data.encode_to_vec()[..]).unwrap();
        assert_eq!(request.resource_profiles, data.resource_profiles);
        assert_eq!(request.dictionary, data.dictionary);
        assert_eq!(request.encode_to_vec(), data.encode_to_vec());
    }

    /// Sample's field numbers are v1.10's (values 4), not v1.9's (values 2).
    #[test]
    fn sample_values_are_field_4() {
        let sample = Sample {
            values: vec![7],
            ..Default::default()
        };
        assert_eq!(sample.encode_to_vec(), [4 << 3 | 2, 1, 7]);
    }
}
