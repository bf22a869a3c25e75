//! The A: (environment) task text: the prompt built from (FEN, move, history) and parsed back,
//! and its exact target.
//!
//! `A: {fen}+{move}+{history}+` where history holds the last `HISTORY_LEN` moves, oldest first,
//! ending with the move itself.

use std::fmt;

use crate::env::step;
use crate::fen::{parse_fen, FenError};

pub const HISTORY_LEN: usize = 10;
pub const PREFIX: &str = "A: ";

/// The parts of an A: prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvPrompt {
    pub fen: String,
    pub mv: String,
    /// The moves in the prompt's history field, the move itself last.
    pub history: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptError {
    MissingPrefix,
    /// The text between the prefix and the end does not have the `fen+move+history+` shape.
    Shape,
    Fen(FenError),
}

impl fmt::Display for PromptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PromptError::MissingPrefix => f.write_str("an A: prompt starts with 'A: '"),
            PromptError::Shape => f.write_str("an A: prompt has the shape 'A: {fen}+{move}+{history}+'"),
            PromptError::Fen(e) => write!(f, "bad FEN in A: prompt: {e}"),
        }
    }
}

impl std::error::Error for PromptError {}

/// The A: prompt for playing `mv` in `fen` after the moves in `history` (oldest first, without `mv`).
pub fn env_prompt<S: AsRef<str>>(fen: &str, mv: &str, history: &[S]) -> String {
    let keep = history.len().saturating_sub(HISTORY_LEN - 1);
    let mut text = format!("{PREFIX}{fen}+{mv}+");
    for h in &history[keep..] {
        text.push_str(h.as_ref());
        text.push(' ');
    }
    text.push_str(mv);
    text.push('+');
    text
}

/// The (FEN, move, history) fields of an A: prompt, borrowed.
fn split_env_prompt(text: &str) -> Result<(&str, &str, &str), PromptError> {
    let body = text.trim().strip_prefix("A:").ok_or(PromptError::MissingPrefix)?;
    let body = body.strip_suffix('+').unwrap_or(body);
    let mut parts = body.split('+');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(fen), Some(mv), Some(history), None) => Ok((fen.trim(), mv.trim(), history)),
        _ => Err(PromptError::Shape),
    }
}

/// Splits an A: prompt into its parts. Surrounding whitespace is ignored, and so is a missing
/// final `+`; the FEN is checked, the move is not (an illegal move is a valid prompt).
pub fn parse_env_prompt(text: &str) -> Result<EnvPrompt, PromptError> {
    let (fen, mv, history) = split_env_prompt(text)?;
    parse_fen(fen).map_err(PromptError::Fen)?;
    Ok(EnvPrompt {
        fen: fen.to_string(),
        mv: mv.to_string(),
        history: history.split_ascii_whitespace().map(str::to_string).collect(),
    })
}

/// The exact target text for an A: prompt: `{new_fen}+{reward}+{terminated}+{truncated}`.
pub fn env_target(text: &str) -> Result<String, PromptError> {
    let (fen, mv, _) = split_env_prompt(text)?;
    let pos = parse_fen(fen).map_err(PromptError::Fen)?;
    let mut out = String::with_capacity(112);
    step(&pos, mv).write_target(&mut out);
    Ok(out)
}

/// An A: answer as the model wrote it; a field that cannot be read is `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvAnswer<'a> {
    pub fen: &'a str,
    pub reward: Option<f64>,
    pub terminated: Option<bool>,
    pub truncated: Option<bool>,
}

fn flag(text: &str) -> Option<bool> {
    match text {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// `{fen}+{reward}+{terminated}+{truncated}`; text after the fourth field's first token is ignored.
pub fn parse_env_answer(text: &str) -> Option<EnvAnswer<'_>> {
    let mut parts = text.trim_start().splitn(4, '+');
    let fen = parts.next()?.trim();
    let reward = parts.next()?.trim();
    let terminated = parts.next()?.trim();
    let rest = parts.next()?.trim_start();
    let truncated = rest.split(|c: char| c == '+' || c.is_whitespace()).next().unwrap_or("");
    if fen.is_empty() {
        return None;
    }
    Some(EnvAnswer {
        fen,
        reward: reward.parse::<f64>().ok().filter(|r| r.is_finite()),
        terminated: flag(terminated),
        truncated: flag(truncated),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "A: 8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+a6a5+f7e7 h5f3 e6f7 b1b6 h8h6 a1e1 e7d8 b6a6 d8c7 a6a5+";

    #[test]
    fn builds_the_real_sample() {
        let history = ["e2e4", "f7e7", "h5f3", "e6f7", "b1b6", "h8h6", "a1e1", "e7d8", "b6a6", "d8c7"];
        assert_eq!(env_prompt("8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31", "a6a5", &history), SAMPLE);
    }

    #[test]
    fn first_move_has_only_itself_as_history() {
        let start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1";
        assert_eq!(env_prompt::<&str>(start, "e2e4", &[]), format!("A: {start}+e2e4+e2e4+"));
    }

    #[test]
    fn parses_back_and_targets() {
        let p = parse_env_prompt(SAMPLE).unwrap();
        assert_eq!(p.mv, "a6a5");
        assert_eq!(p.history.len(), 10);
        assert_eq!(env_target(SAMPLE).unwrap(), "8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0");
    }

    #[test]
    fn malformed_prompts_are_errors() {
        assert_eq!(parse_env_prompt("P: 8/8/8/8/8/8/8/K6k w - - 0 1"), Err(PromptError::MissingPrefix));
        assert_eq!(parse_env_prompt("A: 8/8/8/8/8/8/8/K6k w - - 0 1"), Err(PromptError::Shape));
        assert_eq!(parse_env_prompt("A: a+b+c+d+e"), Err(PromptError::Shape));
        assert!(matches!(parse_env_prompt("A: nonsense+e2e4+e2e4+"), Err(PromptError::Fen(_))));
    }
}
