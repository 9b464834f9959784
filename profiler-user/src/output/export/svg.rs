//! Flamegraph SVG, rendered in process with inferno from the folded stacks
//! (the process is the root frame, as in the collapsed export). Widths are
//! proportional to the unbiased estimates of the chosen value.

use inferno::flamegraph::{
    self,
    color::{BasicPalette, Palette},
};

use super::{Options, collapsed};
use crate::{
    model::profile::Profile,
    model::stats::{Quantity, human_bytes, human_count},
    output::inert::inert,
};

/// Weighted by `opts.value`; `opts.title` and `opts.subtitle`, when given,
/// replace the generated ones (e.g. for a diff).
pub fn render(profile: &Profile, opts: &Options) -> std::io::Result<Vec<u8>> {
    let value = opts.value;
    let title = match &opts.title {
        Some(t) => t.clone(),
        None => default_title(profile, value),
    };
    let lines: Vec<String> = collapsed::folded(profile, value)
        .into_iter()
        .map(|(stack, v)| format!("{stack} {v}"))
        .collect();
    let subtitle = opts.subtitle.clone().unwrap_or_else(|| {
        format!(
            "estimated total {}, {:.1} s; widths proportional to the unbiased estimates",
            quantity(profile.totals().value(value), value),
            profile.elapsed.as_secs_f64()
        )
    });
    if lines.is_empty() {
        return Ok(empty(&title, value));
    }
    let mut fg = flamegraph::Options::default();
    fg.title = title;
    fg.subtitle = Some(subtitle);
    fg.colors = Palette::Basic(BasicPalette::Mem);
    fg.count_name = match value {
        Quantity::InuseBytes | Quantity::AllocBytes => "bytes",
        Quantity::InuseObjects | Quantity::AllocObjects => "objects",
    }
    .into();
    fg.name_type = "Function:".into();
    // Stable colours for the same function across exports.
    fg.hash = true;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut fg, lines.iter().map(String::as_str), &mut out)?;
    Ok(out)
}

/// "allocprof: live bytes of demo (12), worker (13)".
fn default_title(profile: &Profile, value: Quantity) -> String {
    const SHOWN: usize = 4;
    let mut names: Vec<String> = profile
        .processes
        .iter()
        .take(SHOWN)
        .map(|p| inert(&p.label()).into_owned())
        .collect();
    if profile.processes.len() > SHOWN {
        names.push(format!("{} more", profile.processes.len() - SHOWN));
    }
    format!("allocprof: {} of {}", value.describe(), names.join(", "))
}

/// "1.5 MiB" or "12.3k objects".
pub fn quantity(v: f64, value: Quantity) -> String {
    match value {
        Quantity::InuseBytes | Quantity::AllocBytes => human_bytes(v),
        Quantity::InuseObjects | Quantity::AllocObjects => format!("{} objects", human_count(v)),
    }
}

/// A well-formed SVG saying there is nothing to draw (inferno refuses empty
/// input, but an export of an idle process is not an error).
fn empty(title: &str, value: Quantity) -> Vec<u8> {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"90\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#eeeeee\"/>\n\
         <text x=\"600\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\n\
         <text x=\"600\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">no stacks with positive {}</text>\n\
         </svg>\n",
        escape(title),
        value.describe()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::export::tests::hand_made;

    fn by(value: Quantity) -> Options {
        Options {
            value,
            ..Default::default()
        }
    }

    fn frame_titles(svg: &str) -> Vec<String> {
        // inferno declares the SVG 1.1 DTD.
        let opts = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(svg, opts).expect("well-formed XML");
        doc.descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text().map(str::to_string))
            .collect()
    }

    #[test]
    fn well_formed_with_frames_title_and_proportional_widths() {
        let profile = hand_made();
        let svg = String::from_utf8(render(&profile, &Options::default()).unwrap()).unwrap();
        let titles = frame_titles(&svg);
        let find = |name: &str| {
            titles
                .iter()
                .find(|t| t.starts_with(&format!("{name} (")))
                .unwrap_or_else(|| panic!("no frame {name} in {titles:?}"))
                .clone()
        };
        // Tooltips read "name (N bytes, P%)": the estimates themselves.
        assert!(find("site_large").contains("8,388,608 bytes"), "{titles:?}");
        assert!(find("demo (7)").contains("12,655,275 bytes"), "{titles:?}");
        let total = profile.totals().live_bytes.round() as u64;
        assert_eq!(total, 12_656_339);
        assert!(find("all").contains("12,656,339 bytes, 100%"), "{titles:?}");
        assert!(svg.contains("allocprof: live bytes of demo (7), other (8)"));
        assert!(svg.contains("estimated total 12.1 MiB"));
        // A name with XML metacharacters survives escaping.
        let svg = render(&profile, &by(Quantity::AllocBytes)).unwrap();
        let titles = frame_titles(&String::from_utf8(svg).unwrap());
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with("Vec<u8>::push (65,536 bytes")),
            "{titles:?}"
        );
    }

    #[test]
    fn objects_are_counted_as_objects() {
        let svg = render(&hand_made(), &by(Quantity::AllocObjects)).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains(" objects, "), "{svg}");
    }

    #[test]
    fn nothing_to_draw_is_still_an_svg() {
        let opts = Options {
            title: Some("a <b>".into()),
            ..Default::default()
        };
        let svg = render(&Profile::default(), &opts).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        roxmltree::Document::parse(&svg).unwrap();
        assert!(svg.contains("no stacks with positive live bytes"));
    }
}
