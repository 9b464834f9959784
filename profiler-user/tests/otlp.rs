//! OTLP profiles against a real OpenTelemetry Collector
//! (tests/common/otelcol.rs).

mod common;

use common::otelcol::Collector;

/// The collector builds (or is built), starts on free ports, listens, and
/// stops cleanly; sent nothing, it writes nothing.
#[test]
fn the_collector_starts_listens_and_stops() {
    let collector = Collector::start("idle");
    assert_ne!(collector.grpc, collector.http);
    assert!(collector.stop_and_read().is_empty());
}
