//! Whole-batch entry points, parallel with rayon. One item's bad input is that item's error;
//! it never fails the batch. The PyO3 layer calls only these.

use rayon::prelude::*;
use shakmaty::{Chess, Position};

use crate::env::{step, Transition};
use crate::fen::{parse_fen, to_fen, FenError};
use crate::moves::{legal_move, legal_uci_moves, uci};
use crate::a_text::{env_prompt, env_target, PromptError};
use crate::notation::{parse_move, parse_uci, san, MoveError};

/// A move read or written in a position given as FEN: either may be at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenMoveError {
    Fen(FenError),
    Move(MoveError),
}

impl std::fmt::Display for FenMoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FenMoveError::Fen(e) => std::fmt::Display::fmt(e, f),
            FenMoveError::Move(e) => std::fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for FenMoveError {}

/// Each FEN in python-chess `board.fen()` form, or why it is not a legal position.
pub fn normalize_fens<S: AsRef<str> + Sync>(fens: &[S]) -> Vec<Result<String, FenError>> {
    fens.par_iter().map(|f| parse_fen(f.as_ref()).map(|p| to_fen(&p))).collect()
}

pub fn legal_moves<S: AsRef<str> + Sync>(fens: &[S]) -> Vec<Result<Vec<String>, FenError>> {
    fens.par_iter().map(|f| parse_fen(f.as_ref()).map(|p| legal_uci_moves(&p))).collect()
}

/// The moves (UCI) that checkmate at once, in legal-move order.
pub fn mating_moves<S: AsRef<str> + Sync>(fens: &[S]) -> Vec<Result<Vec<String>, FenError>> {
    fens.par_iter()
        .map(|f| {
            let pos = parse_fen(f.as_ref())?;
            Ok(crate::mate::mating_moves(&pos).into_iter().map(uci).collect())
        })
        .collect()
}

/// Each text, a move in UCI or SAN, as the UCI of the legal move it names.
pub fn parse_moves<S: AsRef<str> + Sync, M: AsRef<str> + Sync>(
    fens: &[S],
    texts: &[M],
) -> Vec<Result<String, FenMoveError>> {
    fens.par_iter()
        .zip(texts.par_iter())
        .map(|(f, t)| {
            let pos = parse_fen(f.as_ref()).map_err(FenMoveError::Fen)?;
            parse_move(&pos, t.as_ref()).map(uci).map_err(FenMoveError::Move)
        })
        .collect()
}

/// Each legal UCI move in SAN, as python-chess's `board.san()` writes it.
pub fn san_moves<S: AsRef<str> + Sync, M: AsRef<str> + Sync>(
    fens: &[S],
    moves: &[M],
) -> Vec<Result<String, FenMoveError>> {
    fens.par_iter()
        .zip(moves.par_iter())
        .map(|(f, m)| {
            let pos = parse_fen(f.as_ref()).map_err(FenMoveError::Fen)?;
            parse_uci(&pos, m.as_ref()).map(|m| san(&pos, m)).map_err(FenMoveError::Move)
        })
        .collect()
}

/// Whether each move is legal in its position; a bad FEN has no legal moves.
pub fn is_legal<S: AsRef<str> + Sync, M: AsRef<str> + Sync>(fens: &[S], moves: &[M]) -> Vec<bool> {
    fens.par_iter()
        .zip(moves.par_iter())
        .map(|(f, m)| parse_fen(f.as_ref()).is_ok_and(|p| legal_move(&p, m.as_ref()).is_some()))
        .collect()
}

pub fn env_steps<S: AsRef<str> + Sync, M: AsRef<str> + Sync>(fens: &[S], moves: &[M]) -> Vec<Result<Transition, FenError>> {
    fens.par_iter().zip(moves.par_iter()).map(|(f, m)| parse_fen(f.as_ref()).map(|p| step(&p, m.as_ref()))).collect()
}

pub fn env_targets<S: AsRef<str> + Sync>(prompts: &[S]) -> Vec<Result<String, PromptError>> {
    prompts.par_iter().map(|p| env_target(p.as_ref())).collect()
}

pub fn env_prompts<S: AsRef<str> + Sync>(fens: &[S], moves: &[S], histories: &[Vec<String>]) -> Vec<String> {
    (fens, moves, histories)
        .into_par_iter()
        .map(|(f, m, h)| env_prompt(f.as_ref(), m.as_ref(), h))
        .collect()
}

/// What is wrong with each position's history (UCI moves before it, oldest first), if anything;
/// a bad FEN is its own error.
pub fn history_problems<S: AsRef<str> + Sync>(fens: &[S], histories: &[Vec<String>]) -> Vec<Option<String>> {
    (fens, histories)
        .into_par_iter()
        .map(|(f, h)| match parse_fen(f.as_ref()) {
            Ok(pos) => crate::history::check_history(&pos, h).err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        })
        .collect()
}

/// What is wrong with each analysis (moves best first, evals in pawns), if anything; a bad FEN is
/// its own error. `max_moves`: the MultiPV the analyses were asked for, when known.
pub fn analysis_problems<S: AsRef<str> + Sync>(
    fens: &[S],
    moves: &[Vec<String>],
    evals: &[Vec<f64>],
    max_moves: Option<usize>,
) -> Vec<Option<String>> {
    (fens, moves, evals)
        .into_par_iter()
        .map(|(f, m, e)| match parse_fen(f.as_ref()) {
            Ok(pos) => crate::analysis::check_analysis(&pos, m, e, max_moves).err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        })
        .collect()
}

/// Perft split over the root moves.
pub fn perft(fen: &str, depth: u32) -> Result<u64, FenError> {
    let pos = parse_fen(fen)?;
    if depth <= 2 {
        return Ok(crate::perft::perft(&pos, depth));
    }
    Ok(pos
        .legal_moves()
        .into_iter()
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|m| {
            let mut child: Chess = pos.clone();
            child.play_unchecked(m);
            crate::perft::perft(&child, depth - 1)
        })
        .sum())
}

/// Scores each completion against its prompt. `truth_index[i]` names prompt i's ground truth in `truths`
/// (negative: none; P: prompts need one), so the completions of a group share one.
pub fn score<P: AsRef<str> + Sync, C: AsRef<str> + Sync>(
    prompts: &[P],
    completions: &[C],
    truth_index: &[i64],
    truths: &[crate::reward::GroundTruth],
    scoring: impl Into<crate::reward::Scoring>,
) -> Vec<Result<crate::reward::Score, crate::reward::ScoreError>> {
    let scoring = scoring.into();
    (prompts, completions, truth_index)
        .into_par_iter()
        .map(|(p, c, t)| {
            let truth = usize::try_from(*t).ok().and_then(|t| truths.get(t));
            crate::reward::score(p.as_ref(), c.as_ref(), truth, scoring)
        })
        .collect()
}

/// P: target completions (`M: ... E: ... B: best` after the padding of `layout`).
pub fn policy_targets(
    fens: &[String],
    moves: &[Vec<String>],
    evals: &[Vec<f64>],
    best: &[String],
    layout: crate::p_text::Layout,
) -> Vec<String> {
    (fens, moves, evals, best)
        .into_par_iter()
        .map(|(f, m, e, b)| crate::p_text::policy_target(f, m, e, b, layout))
        .collect()
}
