//! The text report: per process and per stack, estimated live bytes with a
//! 95% confidence interval, live objects, allocated bytes, samples, drops.

use std::{fmt::Write, time::Duration};

use profiler_common::{DropReason, WeightForm};

use crate::{
    model::profile::{ProcessProfile, ProcessState, Profile, StackProfile, is_loss},
    model::stats::{Totals, human_bytes, human_ci, human_count},
    output::inert::inert,
    symbolize::{Frame, FrameKind, is_library_frame, most_informative},
};

/// How much of the profile to show.
#[derive(Clone, Copy, Debug)]
pub struct ReportOptions {
    /// Stacks per process and in the merged view.
    pub top: usize,
    /// Frames shown per stack.
    pub depth: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions { top: 10, depth: 8 }
    }
}

pub fn render(profile: &Profile, opts: ReportOptions) -> String {
    let mut out = String::new();
    let total = profile.totals();
    let dropped = profile.dropped();
    // Files whose code the kernel walks with unwind tables, of those mapped
    // executable; the rest (loading, or unavailable: could not be built or
    // did not fit) is walked by frame pointers.
    let u = profile.unwind;
    let files = u.ready + u.loading + u.unavailable;
    let unwind = if files == 0 {
        String::new()
    } else {
        format!(", unwind tables for {} of {files} files", u.ready)
    };
    let live = profile.live_totals();
    let gone = profile
        .processes
        .iter()
        .filter(|p| p.state != ProcessState::Live)
        .count();
    // Exited images are not live heap: their figures are what they held.
    let held = if gone == 0 {
        String::new()
    } else {
        let at_exit = profile.held_at_exit();
        format!(
            " ({gone} gone, holding {} when they went)",
            with_ci(at_exit.live_bytes, at_exit.live_ci95())
        )
    };
    // Processes that ran before we attached: what they held then is not
    // seen, and the figure must not read as their whole heap.
    let attached = profile.attached_clock().unwrap_or_else(|| "?".into());
    let predating: Vec<String> = profile
        .ran_before_attach
        .iter()
        .map(|l| inert(l).into_owned())
        .collect();
    let heap_label = if profile.live_since_attach() {
        format!("live bytes allocated since attach ({attached})")
    } else {
        "estimated live heap".to_string()
    };
    let mark = if profile.processes.iter().any(|p| p.thinned()) {
        THIN_MARK
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "allocprof: {} process{}, {:.1} s, {heap_label} {}{mark}{held}, {} sampled allocations{unwind}, {} dropped",
        profile.processes.len(),
        if profile.processes.len() == 1 {
            ""
        } else {
            "es"
        },
        profile.elapsed.as_secs_f64(),
        with_ci(live.live_bytes, live.live_ci95()),
        total.alloc_samples,
        dropped,
    );
    if !predating.is_empty() {
        let _ = writeln!(
            out,
            "allocprof: {} ran before allocprof attached at {attached}: live figures count only what {} allocated since and still hold, not the heap before",
            predating.join(", "),
            if predating.len() == 1 { "it" } else { "they" }
        );
    }
    let seeded: Vec<String> = profile
        .processes
        .iter()
        .filter(|p| p.totals.before_attach_bytes > 0.0)
        .map(|p| {
            format!(
                "{} {}",
                inert(&p.label()),
                human_bytes(p.totals.before_attach_bytes)
            )
        })
        .collect();
    if !seeded.is_empty() {
        let _ = writeln!(
            out,
            "allocprof: live figures include what was allocated before allocprof attached at {attached}, read from the allocator's ledger: {}",
            seeded.join(", ")
        );
    }
    if !profile.min_age.is_zero() {
        let _ = writeln!(
            out,
            "allocprof: live figures count only allocations live for at least {} (--min-age)",
            human_age(profile.min_age)
        );
    }
    let lost = profile.lost_live_bytes();
    if lost > 0 {
        let _ = writeln!(
            out,
            "allocprof: the live heap is a lower bound: samples worth up to {} could not be tracked live (see DROPPED EVENTS)",
            human_bytes(lost as f64)
        );
    }
    if profile.processes.is_empty() {
        out.push_str("\nno sampled allocations yet\n");
        return out;
    }
    out.push_str("\nPROCESSES\n");
    // With `--pid`'s trees, each process's parent (`-` for a root whose
    // parent is not known).
    let tree = profile.processes.iter().any(|p| p.parent.is_some());
    let parent = |p: Option<crate::ids::Pid>| match (tree, p) {
        (false, _) => String::new(),
        (true, Some(pid)) => format!(" {pid:>7}"),
        (true, None) => format!(" {:>7}", "-"),
    };
    let _ = writeln!(
        out,
        "  {:<28}{} {:>24} {:>10} {:>12} {:>9} {:>7} {:>9}  {:<18} STATE",
        "PROCESS",
        if tree {
            format!(" {:>7}", "PARENT")
        } else {
            String::new()
        },
        "LIVE BYTES (95% CI)",
        "OBJECTS",
        "ALLOCATED",
        "SAMPLES",
        "DROPS",
        "RATE",
        "CONTRACT"
    );
    for p in &profile.processes {
        let _ = writeln!(
            out,
            "  {:<28}{} {:>24} {:>10} {:>12} {:>9} {:>7} {:>9}  {:<18} {}",
            truncate(&inert(&p.label()), 28),
            parent(p.parent),
            format!(
                "{}{}",
                live_with_ci(p.totals.live_bytes, p.totals.live_ci95(), p.lost_live_bytes),
                thin_mark(p)
            ),
            human_count(p.totals.live_objects),
            human_bytes(p.totals.alloc_bytes),
            p.totals.alloc_samples,
            p.dropped(),
            human_bytes(p.rate as f64),
            p.contract(),
            if p.state == ProcessState::Live && p.since_attach {
                "live (since attach)"
            } else {
                p.state.describe()
            },
        );
    }
    resident(&mut out, profile);
    python(&mut out, profile);
    for p in profile.processes.iter().filter(|p| p.mmap_events > 0) {
        let _ = writeln!(
            out,
            "  {} also mapped {} on its own account (otel_memory:mmap/munmap), beside the heap",
            inert(&p.label()),
            human_bytes(p.mapped_bytes as f64),
        );
    }
    for p in profile.processes.iter() {
        let Some(t) = p.alloc_thinning.filter(|t| t.thinned > 0) else {
            continue;
        };
        let _ = writeln!(
            out,
            "  {THIN_MARK} {}: the allocator's sample budget (ALLOCPROF_MAX_EVENT_RATE{}) dropped {} sampled allocations since the process started, the kept ones count for them (1 in {} now); estimates stay unbiased, intervals include it",
            inert(&p.label()),
            t.max_event_rate
                .map_or_else(String::new, |r| format!(" = {r}/s")),
            t.thinned,
            t.factor,
        );
    }
    for p in profile.processes.iter().filter(|p| p.thinned_events > 0) {
        let _ = writeln!(
            out,
            "  {THIN_MARK} {}: back-pressure (--max-event-rate): {} of {} sampled allocations not walked, the kept ones count for them (1 in {} now); estimates stay unbiased, intervals include it",
            inert(&p.label()),
            p.thinned_events,
            p.alloc_events,
            p.thin_factor,
        );
    }
    let unrecognized: Vec<String> = profile
        .processes
        .iter()
        .filter(|p| p.weight_form == WeightForm::Unrecognized)
        .map(|p| inert(&p.label()).into_owned())
        .collect();
    if !unrecognized.is_empty() {
        let _ = writeln!(
            out,
            "  ± ?: no confidence interval: the weights of {} fit neither `size / p` nor `nsamples × R` (docs/probe-contract.md)",
            unrecognized.join(", ")
        );
    }
    if dropped > 0 {
        out.push_str("\nDROPPED EVENTS\n");
        for reason in DropReason::ALL.into_iter().filter(|&r| is_loss(r)) {
            let n = profile.drops[reason as usize];
            if n > 0 {
                let _ = writeln!(out, "  {n:>9}  {}", reason.describe());
            }
        }
    }
    let unmatched = profile.unmatched_frees();
    if unmatched > 0 {
        let _ = writeln!(
            out,
            "\n{unmatched} {} matched no live sample (blocks sampled before allocprof could see them, or whose alloc was dropped): nothing lost",
            if unmatched == 1 { "free" } else { "frees" }
        );
    }
    if profile.processes.len() > 1 {
        let merged = profile.merged_stacks();
        let _ = writeln!(out, "\nTOP STACKS, ALL PROCESSES MERGED");
        let any = profile.processes.iter().any(|p| p.thinned());
        stacks(
            &mut out,
            &merged,
            total,
            opts,
            if any { THIN_MARK } else { "" },
        );
    }
    for p in &profile.processes {
        let _ = writeln!(
            out,
            "\nTOP STACKS OF {} [{}]",
            inert(&p.label()),
            p.state.describe()
        );
        stacks(&mut out, &p.stacks, p.totals, opts, thin_mark(p));
    }
    out
}

/// The heap next to what each running process has resident: the heap
/// lives in anonymous memory; the rest of that is allocator overhead,
/// fragmentation, or memory not from malloc.
fn resident(out: &mut String, profile: &Profile) {
    let with: Vec<_> = profile
        .processes
        .iter()
        .filter_map(|p| Some((p, p.resident?)))
        .collect();
    if with.is_empty() {
        return;
    }
    out.push_str("\nRESIDENT MEMORY (/proc/PID/status) NEXT TO THE LIVE HEAP\n");
    for (p, r) in with {
        let heap = p.totals.live_bytes;
        let rest = r.anon as f64 - heap;
        let beyond = if rest >= 0.0 {
            format!(
                "{} of anonymous memory is not live heap (allocator overhead, fragmentation, memory not from malloc)",
                human_bytes(rest)
            )
        } else {
            format!(
                "the live heap estimate exceeds anonymous memory by {} (estimation error, or heap not yet touched)",
                human_bytes(-rest)
            )
        };
        let _ = writeln!(
            out,
            "  {}: resident {} (anonymous {}, file {}, shared {}); live heap {}: {beyond}",
            inert(&p.label()),
            human_bytes((r.anon + r.file + r.shmem) as f64),
            human_bytes(r.anon as f64),
            human_bytes(r.file as f64),
            human_bytes(r.shmem as f64),
            with_ci(heap, p.totals.live_ci95()),
        );
        if let Some(b) = &p.backend_heap {
            let _ = writeln!(out, "    allocator {}", b.describe());
        }
    }
}

/// The CPython processes: their version, and whether pymalloc keeps their
/// small objects out of sight.
fn python(out: &mut String, profile: &Profile) {
    let mut with = profile
        .processes
        .iter()
        .filter_map(|p| Some((p, p.python?)))
        .peekable();
    if with.peek().is_none() {
        return;
    }
    out.push_str("\nPYTHON\n");
    for (p, python) in with {
        let _ = writeln!(out, "  {}: {}", inert(&p.label()), python.describe());
    }
}

/// `mark`: [`THIN_MARK`] after each interval when the samples were thinned.
fn stacks(
    out: &mut String,
    stacks: &[StackProfile],
    total: Totals,
    opts: ReportOptions,
    mark: &str,
) {
    let _ = writeln!(
        out,
        "  {:>24} {:>6} {:>10} {:>12} {:>9} {:>6} {:>6}",
        "LIVE BYTES (95% CI)", "%", "OBJECTS", "ALLOCATED", "SAMPLES", ">1MIN", "OLDEST"
    );
    for s in stacks.iter().take(opts.top) {
        let share = if total.live_bytes > 0.0 {
            100.0 * s.totals.live_bytes / total.live_bytes
        } else {
            0.0
        };
        // Of the live bytes, the share live for over a minute: a leak's
        // grows to 100 %, a cache's stays low.
        let old = if s.totals.live_bytes > 0.0 {
            format!(
                "{:.0}%",
                (100.0 * s.totals.ages.over_old / s.totals.live_bytes).min(100.0)
            )
        } else {
            "-".into()
        };
        let before = if s.totals.before_attach_bytes > 0.0 {
            format!(
                "  ({} allocated before attach)",
                human_bytes(s.totals.before_attach_bytes)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {:>24} {:>6.1} {:>10} {:>12} {:>9} {:>6} {:>6}{before}",
            format!(
                "{}{mark}",
                with_ci(s.totals.live_bytes, s.totals.live_ci95())
            ),
            share,
            human_count(s.totals.live_objects),
            human_bytes(s.totals.alloc_bytes),
            s.totals.alloc_samples,
            old,
            human_age(s.totals.ages.oldest),
        );
        if let Some(python) = most_informative(&s.frames).filter(|f| f.kind == FrameKind::Python) {
            let _ = writeln!(out, "    site: {}", inert(&python.site_name()));
        }
        frames(out, &s.frames, opts.depth);
    }
    if stacks.len() > opts.top {
        let _ = writeln!(out, "  ... {} more stacks", stacks.len() - opts.top);
    }
}

/// An age for people: `45s`, `12m`, `3h`, `2d`.
pub fn human_age(age: Duration) -> String {
    let s = age.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The program's own frames, innermost first; runs of standard-library
/// frames are folded into one line.
fn frames(out: &mut String, frames: &[Frame], depth: usize) {
    let mut shown = 0;
    let mut folded = 0;
    for f in frames {
        if shown == depth {
            break;
        }
        if is_library_frame(f) {
            folded += 1;
            continue;
        }
        if folded > 0 {
            let _ = writeln!(out, "      [{folded} library frames]");
            folded = 0;
        }
        let _ = writeln!(out, "      {}", frame_line(f));
        shown += 1;
    }
    if shown == 0 {
        // Nothing but library frames: show those rather than nothing.
        for f in frames.iter().take(depth) {
            let _ = writeln!(out, "      {}", frame_line(f));
        }
    }
}

fn frame_line(f: &Frame) -> String {
    let inlined = if f.inlined { " (inlined)" } else { "" };
    let function = inert(&f.function);
    match &f.location {
        Some(loc) => format!("{function}{inlined}  {}", inert(loc)),
        None => format!("{function}{inlined}"),
    }
}

/// After the ± figures of a process whose samples were thinned (the
/// allocator's budget or the kernel's back-pressure): a footnote under the
/// process table says by how much.
pub const THIN_MARK: &str = "†";

fn thin_mark(p: &ProcessProfile) -> &'static str {
    if p.thinned() { THIN_MARK } else { "" }
}

fn with_ci(value: f64, ci: f64) -> String {
    format!("{} ± {}", human_bytes(value), human_ci(ci))
}

/// Live bytes, marked `≥` when samples were lost to the live sums.
fn live_with_ci(value: f64, ci: f64, lost: u64) -> String {
    let bound = if lost > 0 { "≥ " } else { "" };
    format!("{bound}{}", with_ci(value, ci))
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let keep: String = s.chars().take(width - 1).collect();
        format!("{keep}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::export::tests::hand_made;

    #[test]
    fn target_controlled_names_reach_the_terminal_inert() {
        let mut profile = hand_made();
        profile.processes[0].name = "\u{1b}[2J\u{1b}]0;x\u{7}esc".into();
        let mut frames = profile.processes[0].stacks[0].frames.to_vec();
        frames[0].function = "evil\u{1b}[31m\u{202e}".into();
        profile.processes[0].stacks[0].frames = frames.into();
        let text = render(&profile, ReportOptions::default());
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(text.contains("\\x1b[2J\\x1b]0;x\\x07esc"), "{text}");
        assert!(text.contains("evil\\x1b[31m\\u{202e}"), "{text}");
    }

    #[test]
    fn a_python_stack_is_named_by_its_innermost_python_frame() {
        let mut profile = hand_made();
        let python = Frame::python("handle_request", "/srv/app/server.py", Some(42));
        let mut frames = profile.processes[0].stacks[0].frames.to_vec();
        frames.insert(1, python);
        profile.processes[0].stacks[0].frames = frames.into();
        let text = render(&profile, ReportOptions::default());
        assert!(
            text.contains("site: handle_request (server.py:42)"),
            "{text}"
        );
        assert!(
            text.contains("handle_request  /srv/app/server.py:42"),
            "{text}"
        );
        // Native stacks have none (the stack may be listed more than once).
        assert_eq!(
            text.matches("site:").count(),
            text.matches("handle_request  /srv").count(),
            "{text}"
        );
    }

    #[test]
    fn lost_live_bytes_mark_the_estimate_a_lower_bound() {
        let mut profile = hand_made();
        let plain = render(&profile, ReportOptions::default());
        assert!(
            !plain.contains("lower bound") && !plain.contains('≥'),
            "{plain}"
        );
        profile.processes[0].lost_live_bytes = 3 << 30;
        let text = render(&profile, ReportOptions::default());
        assert!(text.contains("the live heap is a lower bound"), "{text}");
        assert!(text.contains("up to 3.0 GiB"), "{text}");
        assert!(text.contains("≥ "), "{text}");
    }

    #[test]
    fn each_process_is_listed_with_its_parent_in_a_tree() {
        let mut profile = hand_made();
        let text = render(&profile, ReportOptions::default());
        let line = |text: &str, name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert!(text.contains(" PARENT "), "{text}");
        // "other (8)" is the child of "demo (7)", whose parent is unknown.
        assert_eq!(line(&text, "other (8)")[2], "7", "{text}");
        assert_eq!(line(&text, "demo (7)")[2], "-", "{text}");
        // Without a tree, no such column.
        for p in &mut profile.processes {
            p.parent = None;
        }
        let plain = render(&profile, ReportOptions::default());
        assert!(!plain.contains("PARENT"), "{plain}");
    }

    #[test]
    fn the_header_counts_files_with_unwind_tables_before_the_drops() {
        let mut profile = hand_made();
        let plain = render(&profile, ReportOptions::default());
        assert!(!plain.contains("unwind"), "no files, no mention: {plain}");
        profile.unwind.ready = 5;
        profile.unwind.unavailable = 1;
        let text = render(&profile, ReportOptions::default());
        let header = text.lines().next().unwrap();
        assert!(
            header.contains(", unwind tables for 5 of 6 files, ") && header.ends_with(" dropped"),
            "{header}"
        );
    }

    #[test]
    fn the_live_heap_is_the_running_processes_and_gone_ones_are_apart() {
        let profile = hand_made();
        let live = profile.live_totals().live_bytes;
        let gone = profile.held_at_exit().live_bytes;
        assert!(live > 0.0 && gone > 0.0, "the sample has both");
        let text = render(&profile, ReportOptions::default());
        let header = text.lines().next().unwrap();
        assert!(
            header.contains(&format!("estimated live heap {} ", human_bytes(live))),
            "{header}"
        );
        assert!(
            header.contains(&format!("(1 gone, holding {} ", human_bytes(gone))),
            "{header}"
        );
    }

    #[test]
    fn a_process_that_ran_before_attach_is_not_shown_as_its_whole_heap() {
        let mut profile = hand_made();
        profile.attached_at = Some(std::time::SystemTime::now());
        let clock = profile.attached_clock().unwrap();
        let live = profile.live_totals().live_bytes;
        let first = profile
            .processes
            .iter_mut()
            .find(|p| p.state == ProcessState::Live)
            .unwrap();
        first.since_attach = true;
        let label = inert(&first.label()).into_owned();
        profile.ran_before_attach = vec![first.label()];
        let text = render(&profile, ReportOptions::default());
        let header = text.lines().next().unwrap();
        assert!(
            header.contains(&format!(
                "live bytes allocated since attach ({clock}) {}",
                human_bytes(live)
            )),
            "{header}"
        );
        assert!(!header.contains("estimated live heap"), "{header}");
        assert!(
            text.contains(&format!(
                "{label} ran before allocprof attached at {clock}: live figures count only what it allocated since"
            )),
            "{text}"
        );
        assert!(text.contains("live (since attach)"), "{text}");
    }

    #[test]
    fn a_thinned_process_s_intervals_are_marked_and_the_thinning_said() {
        let plain = render(&hand_made(), ReportOptions::default());
        assert!(!plain.contains(THIN_MARK), "{plain}");
        let mut profile = hand_made();
        let p = &mut profile.processes[0];
        p.alloc_thinning = Some(profiler_common::backend_stats::AllocatorThinning {
            thinned: 123_456,
            factor: 32,
            max_event_rate: Some(10_000),
        });
        let label = inert(&p.label()).into_owned();
        let text = render(&profile, ReportOptions::default());
        // The header's total, the process's row and each of its stacks.
        let marked = text.lines().filter(|l| l.contains(THIN_MARK)).count();
        assert!(marked >= 3, "{text}");
        assert!(text.lines().next().unwrap().contains(THIN_MARK), "{text}");
        assert!(
            text.contains(&format!(
                "{THIN_MARK} {label}: the allocator's sample budget (ALLOCPROF_MAX_EVENT_RATE = 10000/s) dropped 123456 sampled allocations since the process started"
            )),
            "{text}"
        );
        assert!(text.contains("(1 in 32 now)"), "{text}");
        // A budget that dropped nothing marks nothing.
        profile.processes[0].alloc_thinning =
            Some(profiler_common::backend_stats::AllocatorThinning {
                thinned: 0,
                factor: 1,
                max_event_rate: Some(10_000),
            });
        let text = render(&profile, ReportOptions::default());
        assert!(!text.contains(THIN_MARK), "{text}");
    }

    #[test]
    fn the_heap_from_before_attach_is_named_where_a_ledger_gave_it() {
        let mut profile = hand_made();
        profile.attached_at = Some(std::time::SystemTime::now());
        let clock = profile.attached_clock().unwrap();
        let p = &mut profile.processes[0];
        p.stacks[0].totals.before_attach_bytes = 3.0 * 1048576.0;
        p.totals.before_attach_bytes = 3.0 * 1048576.0;
        let label = inert(&p.label()).into_owned();
        let text = render(&profile, ReportOptions::default());
        let header = text.lines().next().unwrap();
        assert!(header.contains("estimated live heap"), "{header}");
        assert!(
            text.contains(&format!(
                "include what was allocated before allocprof attached at {clock}, read from the allocator's ledger: {label} 3.0 MiB"
            )),
            "{text}"
        );
        assert!(text.contains("(3.0 MiB allocated before attach)"), "{text}");
    }

    #[test]
    fn contracts_and_unavailable_intervals_are_shown() {
        let mut profile = hand_made();
        let plain = render(&profile, ReportOptions::default());
        assert!(
            plain.contains("CONTRACT") && plain.contains("otel_memory"),
            "{plain}"
        );
        assert!(!plain.contains("± ?"), "{plain}");
        let p = &mut profile.processes[0];
        p.contracts =
            u64::from(profiler_common::CONTRACT_OTEL_MEMORY | profiler_common::CONTRACT_DDHEAP);
        p.weight_form = WeightForm::Unrecognized;
        p.mapped_bytes = 3 << 20;
        p.mmap_events = 1;
        for s in &mut p.stacks {
            s.totals = s.totals.with_weight_form(WeightForm::Unrecognized, 0, 1);
        }
        p.totals = p.stacks.iter().map(|s| s.totals).sum();
        let text = render(&profile, ReportOptions::default());
        assert!(text.contains("otel_memory+ddheap"), "{text}");
        assert!(text.contains("± ?"), "{text}");
        assert!(text.contains("no confidence interval"), "{text}");
        assert!(
            text.contains("also mapped 3.0 MiB on its own account"),
            "{text}"
        );
    }
}
