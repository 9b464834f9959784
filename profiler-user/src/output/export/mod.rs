//! Every output format behind one entry point, [`render`], which both the
//! headless binary and the TUI's export key call: the text report, folded
//! stacks, pprof (gzip'd `profile.proto`), flamegraph SVG and JSON. Also
//! what `allocprof diff` needs: reading pprof back and the growth between
//! two profiles.

pub mod build_id;
pub mod collapsed;
pub mod diff;
pub mod json;
pub mod otlp;
pub mod pprof;
pub mod svg;
pub mod tables;

use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::{
    model::profile::Profile,
    model::stats::Quantity,
    output::report::{self, ReportOptions},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable top-N report.
    Report,
    /// Folded stacks (`frame;frame;leaf VALUE`) for flamegraph.pl / inferno.
    Collapsed,
    /// gzip'd pprof profile.proto, a Go heap profile (`go tool pprof`).
    Pprof,
    /// Flamegraph SVG.
    Svg,
    /// The report as JSON (schema in docs/json-schema.md).
    Json,
}

impl Format {
    pub const ALL: [Format; 5] = [
        Format::Report,
        Format::Collapsed,
        Format::Pprof,
        Format::Svg,
        Format::Json,
    ];

    /// The name users give it (`--format NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Report => "report",
            Format::Collapsed => "collapsed",
            Format::Pprof => "pprof",
            Format::Svg => "svg",
            Format::Json => "json",
        }
    }

    /// One line saying what it is, for help texts.
    pub fn summary(self) -> &'static str {
        match self {
            Format::Report => "Human-readable top-N report",
            Format::Collapsed => {
                "Folded stacks (`frame;frame;leaf VALUE`) for flamegraph.pl / inferno"
            }
            Format::Pprof => "gzip'd pprof profile.proto, a Go heap profile (`go tool pprof`)",
            Format::Svg => "Flamegraph SVG",
            Format::Json => "The report as JSON (schema in docs/json-schema.md)",
        }
    }

    /// File name extension, without the dot (e.g. for export file names).
    pub fn extension(self) -> &'static str {
        match self {
            Format::Report => "txt",
            Format::Collapsed => "folded",
            Format::Pprof => "pb.gz",
            Format::Svg => "svg",
            Format::Json => "json",
        }
    }

    /// Not text: never written to a terminal.
    pub fn is_binary(self) -> bool {
        self == Format::Pprof
    }

    pub fn describe(self, value: Quantity) -> String {
        match self {
            Format::Report => "report".into(),
            Format::Collapsed => format!("collapsed stacks of {}", value.describe()),
            Format::Pprof => "pprof heap profile".into(),
            Format::Svg => format!("flamegraph of {}", value.describe()),
            Format::Json => "json report".into(),
        }
    }
}

/// What the formats need besides the profile.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The quantity folded stacks and flamegraphs are weighted by.
    pub value: Quantity,
    pub report: ReportOptions,
    /// Flamegraph title; by default generated from the processes and value.
    pub title: Option<String>,
    /// Flamegraph subtitle; by default the estimated total and duration.
    pub subtitle: Option<String>,
    /// Each process tree as one profile (`--merge-tree`), not one per
    /// process.
    pub merge_tree: bool,
}

#[derive(Debug, Error)]
pub enum ExportError {
    #[error("rendering the flamegraph: {0}")]
    Flamegraph(#[source] std::io::Error),
}

/// The profile in `format`, as the bytes of a file.
pub fn render(profile: &Profile, format: Format, opts: &Options) -> Result<Vec<u8>, ExportError> {
    let merged;
    let profile = if opts.merge_tree {
        merged = profile.merge_trees();
        &merged
    } else {
        profile
    };
    Ok(match format {
        Format::Report => report::render(profile, opts.report).into_bytes(),
        Format::Collapsed => collapsed::render(profile, opts.value).into_bytes(),
        Format::Pprof => pprof::render(profile, now_nanos()),
        Format::Svg => svg::render(profile, opts).map_err(ExportError::Flamegraph)?,
        Format::Json => json::render(profile),
    })
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{sync::Arc, time::Duration};

    use profiler_common::DROP_REASONS;

    use super::*;
    use crate::{
        model::profile::{ProcessKey, ProcessProfile, ProcessState, StackProfile},
        model::stats::Totals,
        symbolize::{Frame, FrameKind},
    };

    pub fn frame(function: &str, module: Option<&str>) -> Frame {
        Frame {
            function: function.into(),
            location: None,
            module: module.map(crate::symbolize::Name::from),
            inlined: false,
            offset: None,
            kind: FrameKind::Native,
        }
    }

    fn totals(live: f64, alloc: f64, size: f64) -> Totals {
        Totals {
            live_bytes: live,
            live_var: live * 10.0,
            live_objects: live / size,
            live_samples: 3,
            alloc_bytes: alloc,
            alloc_var: alloc * 10.0,
            alloc_objects: alloc / size,
            alloc_samples: 5,
            ..Totals::default()
        }
    }

    /// Two processes; an inlined frame; a frame without a module; a name
    /// with XML metacharacters; fractional object estimates.
    pub(crate) fn hand_made() -> Profile {
        const EXE: Option<&str> = Some("/usr/bin/demo");
        let mut inlined = frame("inlined_helper", EXE);
        inlined.inlined = true;
        inlined.location = Some("/src/demo.c:40".into());
        let mut large = frame("site_large", EXE);
        large.location = Some("/src/demo.c:42".into());
        let main = frame("main", EXE);
        let libc = Some("/lib/x86_64-linux-gnu/libc.so.6");
        let start = frame("__libc_start_call_main", libc);
        let stacks = vec![
            StackProfile {
                frames: vec![inlined, large, main.clone(), start].into(),
                totals: totals(8.0 * 1048576.0, 8.0 * 1048576.0, 1048576.0),
            },
            StackProfile {
                frames: vec![
                    frame("site_small", EXE),
                    frame("__libc_start_call_main", libc),
                    main.clone(),
                ]
                .into(),
                totals: totals(12_800_000.0 / 3.0, 12_800_000.0, 64.0 * 3.0),
            },
            StackProfile {
                frames: vec![frame("Vec<u8>::push", EXE), main.clone()].into(),
                totals: totals(0.0, 65_536.0, 7.0),
            },
        ];
        let mut drops = [0; DROP_REASONS];
        drops[profiler_common::DropReason::UnmatchedFree as usize] = 3;
        let demo = ProcessProfile {
            key: ProcessKey {
                pid: crate::ids::Pid(7),
                generation: 0,
            },
            name: "demo".into(),
            state: ProcessState::Live,
            rate: 65_536,
            totals: stacks.iter().map(|s| s.totals).sum(),
            alloc_events: 100,
            free_events: 40,
            drops,
            lost_live_bytes: 0,
            contracts: profiler_common::CONTRACT_OTEL_MEMORY.into(),
            weight_form: profiler_common::WeightForm::InverseProbability,
            mapped_bytes: 0,
            mmap_events: 0,
            thinned_events: 0,
            thin_factor: 1,
            alloc_thinning: None,
            since_attach: false,
            ledger: None,
            resident: None,
            backend_heap: Some(crate::process::backend_stats::BackendHeap {
                backend: "glibc",
                reserved: Some(3 << 20),
                committed: None,
                in_use: Some(2 << 20),
                free: Some(1 << 20),
                mmapped: Some(0),
                age: Duration::from_millis(300),
            }),
            resource: None,
            build_ids: None,
            parent: None,
            python: None,
            stacks,
        };
        let other_stacks = vec![
            StackProfile {
                frames: vec![frame("site_small", EXE), main].into(),
                totals: totals(1000.0, 2000.0, 64.0),
            },
            StackProfile {
                frames: Arc::from(vec![frame("[stack unavailable]", None)]),
                totals: totals(64.0, 64.0, 64.0),
            },
        ];
        let other = ProcessProfile {
            alloc_events: 10,
            contracts: profiler_common::CONTRACT_OTEL_MEMORY.into(),
            weight_form: profiler_common::WeightForm::InverseProbability,
            // A worker of `demo` (`--pid`'s tree).
            parent: Some(crate::ids::Pid(7)),
            ..ProcessProfile::from_stacks(
                ProcessKey {
                    pid: crate::ids::Pid(8),
                    generation: 1,
                },
                "other".into(),
                ProcessState::Exited,
                65_536,
                other_stacks,
            )
        };
        Profile {
            processes: vec![demo, other],
            drops,
            elapsed: Duration::from_millis(12_500),
            unwind: Default::default(),
            min_age: Duration::ZERO,
            attached_at: None,
            ran_before_attach: Vec::new(),
        }
    }

    #[test]
    fn every_format_renders_the_hand_made_profile() {
        let profile = hand_made();
        let opts = Options::default();
        for format in Format::ALL {
            let out = render(&profile, format, &opts).unwrap();
            assert!(!out.is_empty(), "{format:?}");
            if !format.is_binary() {
                let text = String::from_utf8(out).unwrap();
                assert!(text.contains("site_large"), "{format:?}: {text}");
            }
        }
        let report = render(&profile, Format::Report, &opts).unwrap();
        assert!(String::from_utf8(report).unwrap().contains("TOP STACKS"));
        let pprof = render(&profile, Format::Pprof, &opts).unwrap();
        assert_eq!(&pprof[..2], [0x1f, 0x8b], "gzip'd");
    }

    #[test]
    fn every_format_shows_the_stack_flood_frame() {
        let mut profile = hand_made();
        profile.processes[0].stacks.push(StackProfile {
            frames: Arc::from(vec![Frame::named(crate::model::profile::STACK_FLOOD)]),
            totals: totals(64.0 * 1048576.0, 64.0 * 1048576.0, 64.0),
        });
        let opts = Options::default();
        for format in Format::ALL {
            let out = render(&profile, format, &opts).unwrap();
            let text = if format == Format::Pprof {
                let decoded = pprof::decode(&out).unwrap();
                let functions: Vec<String> = decoded
                    .processes
                    .iter()
                    .flat_map(|p| p.stacks.iter())
                    .flat_map(|s| s.frames.iter().map(|f| f.function.to_string()))
                    .collect();
                functions.join("\n")
            } else {
                String::from_utf8(out).unwrap()
            };
            assert!(
                text.contains("[stack flood: new stacks over the per-process limit]"),
                "{format:?}: {text}"
            );
        }
    }

    #[test]
    fn every_format_handles_an_empty_profile() {
        for format in Format::ALL {
            render(&Profile::default(), format, &Options::default()).unwrap();
        }
    }

    #[test]
    fn extensions_are_distinct() {
        let mut exts: Vec<_> = Format::ALL.iter().map(|f| f.extension()).collect();
        exts.dedup();
        assert_eq!(exts.len(), Format::ALL.len());
    }
}
