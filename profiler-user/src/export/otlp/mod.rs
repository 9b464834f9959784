//! OTLP profiles export (issue 28): the messages of the OpenTelemetry
//! Collector's `ProfilesService`, for backends that take OTLP.

pub mod proto;
