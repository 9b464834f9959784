//! Names that target processes control (comm, paths, symbols) made inert
//! before a terminal sees them: control characters, and the Unicode controls
//! that reorder text, are shown as visible escapes instead of acting.

use std::borrow::Cow;

/// `s` with every character a terminal could act on replaced by `\x1b` /
/// `\u{202e}`-style escapes. Borrowed when nothing needed escaping.
pub fn inert(s: &str) -> Cow<'_, str> {
    let acts = |c: char| is_active(c);
    if !s.chars().any(acts) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !acts(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

/// C0 and C1 controls and DEL (escape sequences, CSI, OSC titles, bells)
/// and the bidirectional controls (text that displays as something else).
fn is_active(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_borrowed_unchanged() {
        for s in [
            "python3",
            "std::vec::Vec<T>::push",
            "/usr/lib/libc.so.6",
            "名前 ü",
        ] {
            assert!(matches!(inert(s), Cow::Borrowed(x) if x == s));
        }
    }

    #[test]
    fn terminal_controls_become_visible_escapes() {
        let hostile = "\u{1b}[2J\u{1b}]0;x\u{7}esc";
        let shown = inert(hostile);
        assert_eq!(shown, "\\x1b[2J\\x1b]0;x\\x07esc");
        assert!(!shown.chars().any(char::is_control));
        assert_eq!(inert("a\u{9b}31mb\u{7f}"), "a\\x9b31mb\\x7f");
        assert_eq!(inert("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(inert("a\nb\tc\r"), "a\\x0ab\\x09c\\x0d");
    }
}
