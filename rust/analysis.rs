//! A Stockfish analysis that came from outside this run (a data file's `analysis`, a cache row),
//! checked before it becomes a P: target or a reward's ground truth.
//!
//! Its moves must be legal in the position, in the UCI that Stockfish and the P: text write
//! (`e1g1`), and distinct; its evals finite pawns within the range the format can print; one eval
//! a move; and a position with a legal move has at least one candidate (one without, none).

use std::fmt;

use shakmaty::Chess;

use crate::fen::echoed;
use crate::moves::legal_uci_moves;

/// The largest eval in pawns: a mate in 1, python-chess `score(mate_score=100000) / 100`.
/// Stockfish's centipawn scores stay far below it.
pub const MAX_EVAL: f64 = 999.99;

#[derive(Clone, Debug, PartialEq)]
pub enum AnalysisError {
    Lengths { moves: usize, evals: usize },
    TooMany { moves: usize, max: usize },
    Empty,
    NoMovesHere,
    Illegal { index: usize, mv: String },
    Repeated { mv: String },
    NotFinite { index: usize, eval: f64 },
    OutOfRange { index: usize, eval: f64 },
}

impl fmt::Display for AnalysisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnalysisError::Lengths { moves, evals } => write!(f, "{moves} moves but {evals} evals; one eval a move"),
            AnalysisError::TooMany { moves, max } => write!(f, "{moves} moves where the analysis asked for {max}"),
            AnalysisError::Empty => f.write_str("no moves, though the position has legal moves"),
            AnalysisError::NoMovesHere => f.write_str("moves listed for a finished game (no legal move)"),
            AnalysisError::Illegal { index, mv } => {
                write!(f, "move {index} {} is not a legal move (UCI) here", echoed(mv))
            }
            AnalysisError::Repeated { mv } => write!(f, "move {} is listed twice", echoed(mv)),
            AnalysisError::NotFinite { index, eval } => write!(f, "eval {index} ({eval}) is not a finite number"),
            AnalysisError::OutOfRange { index, eval } => {
                write!(f, "eval {index} ({eval}) is outside -{MAX_EVAL}..{MAX_EVAL} pawns (a mate in 1)")
            }
        }
    }
}

impl std::error::Error for AnalysisError {}

/// Checks an analysis of `pos`: `moves` best first with their `evals` in pawns (side to move's
/// view); at most `max_moves` of them when the search's MultiPV is known.
pub fn check_analysis<M: AsRef<str>>(
    pos: &Chess,
    moves: &[M],
    evals: &[f64],
    max_moves: Option<usize>,
) -> Result<(), AnalysisError> {
    if moves.len() != evals.len() {
        return Err(AnalysisError::Lengths { moves: moves.len(), evals: evals.len() });
    }
    if let Some(max) = max_moves.filter(|&max| moves.len() > max) {
        return Err(AnalysisError::TooMany { moves: moves.len(), max });
    }
    let legal = legal_uci_moves(pos);
    match (legal.is_empty(), moves.is_empty()) {
        (false, true) => return Err(AnalysisError::Empty),
        (true, false) => return Err(AnalysisError::NoMovesHere),
        _ => {}
    }
    for (i, mv) in moves.iter().enumerate() {
        let mv = mv.as_ref();
        if !legal.iter().any(|m| m == mv) {
            return Err(AnalysisError::Illegal { index: i + 1, mv: mv.to_string() });
        }
        if moves[..i].iter().any(|m| m.as_ref() == mv) {
            return Err(AnalysisError::Repeated { mv: mv.to_string() });
        }
    }
    for (i, &eval) in evals.iter().enumerate() {
        if !eval.is_finite() {
            return Err(AnalysisError::NotFinite { index: i + 1, eval });
        }
        if eval.abs() > MAX_EVAL {
            return Err(AnalysisError::OutOfRange { index: i + 1, eval });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;

    const START: &str = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1";
    const MATED: &str = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3";

    fn check(fen: &str, moves: &[&str], evals: &[f64], max: Option<usize>) -> Result<(), AnalysisError> {
        check_analysis(&parse_fen(fen).unwrap(), moves, evals, max)
    }

    #[test]
    fn a_stockfish_like_analysis_passes() {
        assert_eq!(check(START, &["e2e4", "d2d4", "g1f3"], &[0.3, 0.25, -999.97], Some(5)), Ok(()));
        assert_eq!(check(START, &["e2e4"], &[MAX_EVAL], None), Ok(()));
        assert_eq!(check(MATED, &[], &[], Some(5)), Ok(()));
    }

    #[test]
    fn each_fault_is_named() {
        use AnalysisError::*;
        assert_eq!(check(START, &["e2e4", "d2d4"], &[0.3], None), Err(Lengths { moves: 2, evals: 1 }));
        assert_eq!(check(START, &["e2e4", "d2d4"], &[0.3, 0.2], Some(1)), Err(TooMany { moves: 2, max: 1 }));
        assert_eq!(check(START, &[], &[], None), Err(Empty));
        assert_eq!(check(MATED, &["e2e4"], &[0.0], None), Err(NoMovesHere));
        assert_eq!(check(START, &["e2e4", "e7e5"], &[0.3, 999.99], None), Err(Illegal { index: 2, mv: "e7e5".into() }));
        assert_eq!(check(START, &["e2e4", "E2E4"], &[0.3, 0.3], None), Err(Illegal { index: 2, mv: "E2E4".into() }));
        assert_eq!(check(START, &["e2e4", "e2e4"], &[0.3, 0.3], None), Err(Repeated { mv: "e2e4".into() }));
        assert!(matches!(check(START, &["e2e4"], &[f64::NAN], None), Err(NotFinite { index: 1, .. })));
        assert_eq!(check(START, &["e2e4"], &[f64::INFINITY], None), Err(NotFinite { index: 1, eval: f64::INFINITY }));
        assert_eq!(check(START, &["e2e4"], &[-1000.0], None), Err(OutOfRange { index: 1, eval: -1000.0 }));
        assert_eq!(
            check(START, &["e2e4", "d2d4"], &[0.3, 1234.5], None).unwrap_err().to_string(),
            "eval 2 (1234.5) is outside -999.99..999.99 pawns (a mate in 1)"
        );
    }

    #[test]
    fn castling_as_stockfish_writes_it() {
        let pos = "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1";
        assert_eq!(check(pos, &["e1g1"], &[0.5], None), Ok(()));
        assert!(matches!(check(pos, &["e1h1"], &[0.5], None), Err(AnalysisError::Illegal { .. })));
    }
}
