//! The P: (policy) task text, `P: {fen:<90}M: {moves:<30}E: {evals:<40}B: {best}`: the prompt's FEN,
//! the answer parsed, and the target written.
//!
//! Parsing is whitespace-tolerant and stops after the B: move, so anything a model writes after
//! a complete answer is ignored.

/// Column widths of the training text (Python `str.ljust`).
pub const FEN_WIDTH: usize = 90;
pub const MOVES_WIDTH: usize = 30;
pub const EVALS_WIDTH: usize = 40;
pub const PREFIX: &str = "P: ";

/// The FEN of a P: prompt (`P: {fen}`, padding optional), or `None` if it is not one.
pub fn prompt_fen(prompt: &str) -> Option<&str> {
    let fen = prompt.trim_start().strip_prefix("P:")?.trim();
    // A prompt cut from training text may run on into the answer.
    let fen = fen.find("M:").map_or(fen, |i| fen[..i].trim_end());
    (!fen.is_empty()).then_some(fen)
}

/// A P: answer as the model wrote it. Evals that are not numbers are `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyAnswer {
    pub moves: Vec<String>,
    pub evals: Vec<Option<f64>>,
    pub best: String,
}

/// Reads `M: ... E: ... B: move` out of a completion; `None` when the structure is missing.
pub fn parse_answer(text: &str) -> Option<PolicyAnswer> {
    let m = text.find("M:")?;
    let after_m = &text[m + 2..];
    let e = after_m.find("E:")?;
    let after_e = &after_m[e + 2..];
    let b = after_e.find("B:")?;
    let moves: Vec<String> = after_m[..e].split_whitespace().map(str::to_string).collect();
    let evals: Vec<Option<f64>> = after_e[..b].split_whitespace().map(parse_eval).collect();
    let best = after_e[b + 2..].split_whitespace().next()?.to_string();
    if moves.is_empty() || evals.is_empty() {
        return None;
    }
    Some(PolicyAnswer { moves, evals, best })
}

/// A finite number in Python float syntax (`-2.3`, `0.0`, `999.97`); nothing else.
fn parse_eval(text: &str) -> Option<f64> {
    let ok = !text.is_empty()
        && text.bytes().all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'));
    ok.then(|| text.parse::<f64>().ok()).flatten().filter(|v| v.is_finite())
}

/// An eval as the data prints it: pawns rounded to 2 decimals, as a Python float repr.
pub fn format_eval(pawns: f64) -> String {
    let rounded = (pawns * 100.0).round() / 100.0;
    let rounded = if rounded == 0.0 { 0.0 } else { rounded }; // no "-0.0"
    let mut s = format!("{rounded}");
    if !s.contains('.') {
        s.push_str(".0");
    }
    s
}

fn ljust(text: &str, width: usize) -> String {
    format!("{text:<width$}")
}

/// How a P: target lays its fields out. Parsing reads both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// RookWorld's training text: the FEN padded to 90 columns, the moves to 30, the evals to 40
    /// (about 145 tokens a sample, 46 of its target's 94 single spaces).
    RookWorld,
    /// One space between fields (about 98 tokens): for fresh models, which need not learn the padding.
    Compact,
}

impl Layout {
    /// `rookworld` or `compact`, as the `--layout` setting names them.
    pub fn from_name(name: &str) -> Option<Layout> {
        match name {
            "rookworld" => Some(Layout::RookWorld),
            "compact" => Some(Layout::Compact),
            _ => None,
        }
    }
}

/// The completion that follows the prompt `P: {fen}`: `M: ... E: ... B: best` after the padding of `layout`.
pub fn policy_target(fen: &str, moves: &[String], evals: &[f64], best: &str, layout: Layout) -> String {
    let evals: Vec<String> = evals.iter().map(|e| format_eval(*e)).collect();
    match layout {
        Layout::RookWorld => format!(
            "{}M: {}E: {}B: {}",
            " ".repeat(FEN_WIDTH.saturating_sub(fen.len())),
            ljust(&moves.join(" "), MOVES_WIDTH),
            ljust(&evals.join(" "), EVALS_WIDTH),
            best
        ),
        Layout::Compact => format!(" M: {} E: {} B: {}", moves.join(" "), evals.join(" "), best),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6";

    #[test]
    fn parses_the_real_sample() {
        let a = parse_answer(SAMPLE).unwrap();
        assert_eq!(a.moves, ["a4a3", "c8f5", "h7f6", "h7g5", "h7f8"]);
        assert_eq!(a.evals, [Some(-3.06), Some(-2.82), Some(-3.21), Some(-3.16), Some(-2.3)]);
        assert_eq!(a.best, "h7f6");
        assert_eq!(prompt_fen(SAMPLE), Some("2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34"));
    }

    #[test]
    fn rebuilds_the_real_sample() {
        let fen = "2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34";
        let moves: Vec<String> = ["a4a3", "c8f5", "h7f6", "h7g5", "h7f8"].map(String::from).to_vec();
        let target = policy_target(fen, &moves, &[-3.06, -2.82, -3.21, -3.16, -2.3], "h7f6", Layout::RookWorld);
        let text = format!("P: {fen}{target}");
        // The documented formula pads the FEN to 90 columns; the published sample shows 89.
        // Everything else matches character for character.
        assert_eq!(text.find("M:"), Some(3 + FEN_WIDTH));
        assert_eq!(text[text.find("M:").unwrap()..], SAMPLE[SAMPLE.find("M:").unwrap()..]);
        let words = |t: &str| t.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&text), words(SAMPLE));
    }

    #[test]
    fn the_compact_layout_has_one_space_between_fields_and_parses_the_same() {
        let fen = "2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34";
        let moves: Vec<String> = ["a4a3", "c8f5", "h7f6", "h7g5", "h7f8"].map(String::from).to_vec();
        let target = policy_target(fen, &moves, &[-3.06, -2.82, -3.21, -3.16, -2.3], "h7f6", Layout::Compact);
        let text = format!("P: {fen}{target}");
        assert_eq!(text, format!("P: {fen} M: a4a3 c8f5 h7f6 h7g5 h7f8 E: -3.06 -2.82 -3.21 -3.16 -2.3 B: h7f6"));
        assert_eq!(parse_answer(&text), parse_answer(SAMPLE));
        assert_eq!(Layout::from_name("compact"), Some(Layout::Compact));
        assert_eq!(Layout::from_name("padded"), None);
    }

    #[test]
    fn evals_print_as_python_floats() {
        assert_eq!(format_eval(-2.3), "-2.3");
        assert_eq!(format_eval(0.0), "0.0");
        assert_eq!(format_eval(-0.001), "0.0");
        assert_eq!(format_eval(4.75), "4.75");
        assert_eq!(format_eval(999.97), "999.97");
        assert_eq!(format_eval(12.0), "12.0");
    }

    #[test]
    fn tolerant_of_whitespace_and_trailing_text() {
        let a = parse_answer("M:e2e4  d2d4\n E:0.3 0.2\tB:e2e4 P: again M: x E: y B: z").unwrap();
        assert_eq!(a.moves, ["e2e4", "d2d4"]);
        assert_eq!(a.best, "e2e4");
        let a = parse_answer("M: e2e4 E: nan inf 1e400 0x10 .5 B: e2e4").unwrap();
        assert_eq!(a.evals, [None, None, None, None, Some(0.5)]);
    }

    #[test]
    fn missing_structure_is_none() {
        for text in ["", "M: e2e4 E: 0.1", "E: 0.1 B: e2e4", "M: E: 0.1 B: e2e4", "M: e2e4 E: 0.1 B:", "B: e2e4 M: e2e4 E: 0.1"] {
            assert_eq!(parse_answer(text), None, "{text:?}");
        }
    }
}
