//! How a name someone gave (a VDI, snapshot, token, certificate or zone name, as
//! typed or as sent) appears in a message: [`shown`]. Names that exist were
//! checked, but a refusal echoes the name it refuses, which may be anything: a
//! terminal runs the escape sequences in it, and a name of megabytes fills the
//! screen and the log. So control characters (and the invisible ones that reorder
//! text: bidirectional marks and overrides) are escaped as Rust writes them
//! (`\u{1b}`, `\n`), and a name longer than [`SHOWN_CHARS`] characters is cut
//! there, with `…` after. Every message that quotes a name goes through it.
use std::fmt;

/// Characters of a name shown before it is cut.
pub const SHOWN_CHARS: usize = 64;

/// `name` as a message shows it; see the module doc.
pub fn shown(name: &str) -> Shown<'_> {
    Shown(name)
}

/// A name that displays escaped and cut ([`shown`]).
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(&'a str);

/// Characters that reorder or hide text without being control characters: the
/// bidirectional marks, embeddings, overrides and isolates, and the zero-width
/// ones.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.chars().enumerate() {
            if i == SHOWN_CHARS {
                return f.write_str("…");
            }
            if c.is_control() || invisible(c) {
                write!(f, "{}", c.escape_unicode())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_control_and_invisible_characters_are_escaped() {
        assert_eq!(shown("vm1").to_string(), "vm1");
        assert_eq!(shown("\u{1b}[31mred").to_string(), "\\u{1b}[31mred");
        assert_eq!(shown("a\nb\tc").to_string(), "a\\u{a}b\\u{9}c");
        assert_eq!(shown("x\u{202e}y").to_string(), "x\\u{202e}y");
        assert_eq!(shown("é@\\'").to_string(), "é@\\'");
    }

    #[test]
    fn test_long_names_are_cut_after_64_characters() {
        let long = "x".repeat(300);
        assert_eq!(shown(&long).to_string(), format!("{}…", "x".repeat(64)));
        let exact = "y".repeat(64);
        assert_eq!(shown(&exact).to_string(), exact);
        // Characters, not bytes: a cut never splits one.
        let wide = "é".repeat(100);
        assert_eq!(shown(&wide).to_string(), format!("{}…", "é".repeat(64)));
    }
}
