//! What the CLI shows a person: plain-text tables (pure, on stdout) and progress bars, which
//! are drawn on stderr only when stderr is a terminal, so scripts and tests see clean output.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A left-aligned table with a header row, columns two spaces apart, no trailing spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let width = widths.get(i).copied().unwrap_or(0);
            line.extend(std::iter::repeat_n(
                ' ',
                width.saturating_sub(cell.chars().count()),
            ));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` cut to `max` characters, with an ellipsis when cut; newlines (every control
/// character, and those that reorder or hide text: [`escape`]) become spaces.
pub fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| {
            if c.is_control() || hides_text(c) {
                ' '
            } else {
                c
            }
        })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `text` safe to print on a terminal whoever wrote it: control characters (C0, DEL, C1:
/// escape sequences, carriage returns, newlines that would start a line of their own) and the
/// invisible characters that reorder or hide what follows (bidirectional overrides and
/// isolates, zero-width ones) written out as `\n`, `\r`, `\t`, `\x1b`, `\u{202e}`; all else,
/// backslashes included, as it is.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if hides_text(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The format characters that change how the text around them shows: the bidirectional
/// marks, embeddings, overrides and isolates, and the zero-width ones.
fn hides_text(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// A short human duration: `850ms`, `12s`, `4m10s`, `3h05m`, `2d04h`.
pub fn human_duration(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms}ms"),
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A rate without noise: `10`, `2.5`, `0.33`.
pub fn human_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        let s = format!("{x:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// An optional figure as the tables show it: `-` when absent.
pub fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn draw_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar over `len` units of work, e.g. events sent; hidden unless stderr is a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(&format!(
        "{{spinner}} {{elapsed_precise}} [{{wide_bar}}] {{pos}}/{{len}} {what} {{msg}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    ProgressBar::with_draw_target(Some(len), draw_target()).with_style(style)
}

/// A spinner for work of unknown length; hidden unless stderr is a terminal.
pub fn spinner(message: &str) -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let pb = ProgressBar::with_draw_target(None, draw_target())
        .with_style(style)
        .with_message(message.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_trim() {
        let t = table(
            &["ID", "RATE", "LAST ERROR"],
            &[
                vec!["partner".into(), "10".into(), "timeout".into()],
                vec!["x".into(), "2.5".into(), String::new()],
            ],
        );
        assert_eq!(
            t,
            "ID       RATE  LAST ERROR\npartner  10    timeout\nx        2.5\n"
        );
    }

    #[test]
    fn durations_table() {
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(12_300), "12s");
        assert_eq!(human_duration(250_000), "4m10s");
        assert_eq!(human_duration(3 * 3_600_000 + 300_000), "3h05m");
        assert_eq!(human_duration(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
    }

    #[test]
    fn numbers_and_clipping() {
        assert_eq!(human_number(10.0), "10");
        assert_eq!(human_number(2.5), "2.5");
        assert_eq!(human_number(1.0 / 3.0), "0.33");
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("a\nb", 10), "a b");
        assert_eq!(clip("abcdefghijkl", 5), "abcd…");
    }

    #[test]
    fn escapes_table() {
        let cases: &[(&str, &str)] = &[
            (
                "plain {\"json\": 1} \\ é 日本",
                "plain {\"json\": 1} \\ é 日本",
            ),
            ("a\nb\r\tc", "a\\nb\\r\\tc"),
            ("\u{1b}[2J\u{1b}]0;title\u{7}", "\\x1b[2J\\x1b]0;title\\x07"),
            ("\u{7f}\u{9b}31m", "\\x7f\\x9b31m"),
            ("abc\u{202e}fdp.exe", "abc\\u{202e}fdp.exe"),
            (
                "\u{2066}x\u{2069}\u{200b}\u{feff}",
                "\\u{2066}x\\u{2069}\\u{200b}\\u{feff}",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(escape(text), *want, "{text:?}");
        }
    }
}
