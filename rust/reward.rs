//! Verifiable rewards for P: and A: completions. Rules and weights: docs/rewards.md.
//!
//! Every completion, however garbled, gets a score: -0.3 when the answer's structure is
//! missing, 0.2 for a well-formed answer with nothing right, up to 1.0 for a perfect one.

use std::fmt;

use shakmaty::Chess;

use crate::env::step;
use crate::fen::parse_fen;
use crate::moves::legal_move;
use crate::a_text::{parse_env_answer, parse_env_prompt};
use crate::p_text::{parse_answer, prompt_fen, PolicyAnswer};
use crate::similarity::similarity;

pub const UNPARSEABLE: f64 = -0.3;
pub const FORMAT_ONLY: f64 = 0.2;

/// How quality in [0, 1] becomes a reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Shaping {
    /// 0.2 + 0.8 x quality: every improvement counts, which gives GRPO spread within a group.
    #[default]
    Continuous,
    /// Steps of 0.2: 0.2, 0.4, 0.6, 0.8, and 1.0 for quality 1 only.
    Graduated,
}

impl Shaping {
    pub fn parse(name: &str) -> Option<Shaping> {
        match name {
            "continuous" => Some(Shaping::Continuous),
            "graduated" => Some(Shaping::Graduated),
            _ => None,
        }
    }

    pub fn reward(self, quality: f64) -> f64 {
        let q = quality.clamp(0.0, 1.0);
        match self {
            Shaping::Continuous => FORMAT_ONLY + 0.8 * q,
            Shaping::Graduated if q >= 1.0 - 1e-9 => 1.0,
            Shaping::Graduated => FORMAT_ONLY + 0.2 * (q * 4.0).floor().min(3.0),
        }
    }
}

/// How the B: move of a P: answer earns its credit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PolicyReward {
    /// By its rank in Stockfish's top five (`RANK_CREDIT`); any other legal move earns `OUTSIDE_TOP`.
    #[default]
    Rank,
    /// By the pawns it loses against Stockfish's best (`loss_credit`), from a ground truth that evaluates every
    /// legal move: among legal moves a blunder and a good move outside the top five no longer earn the same.
    CpLoss,
}

impl PolicyReward {
    pub fn parse(name: &str) -> Option<PolicyReward> {
        match name {
            "rank" => Some(PolicyReward::Rank),
            "cp-loss" => Some(PolicyReward::CpLoss),
            _ => None,
        }
    }
}

/// The rules a batch is scored by: how quality becomes a reward, and how a P: answer's B: move earns credit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Scoring {
    pub shaping: Shaping,
    pub policy: PolicyReward,
}

impl From<Shaping> for Scoring {
    fn from(shaping: Shaping) -> Scoring {
        Scoring { shaping, ..Scoring::default() }
    }
}

/// Weights of the P: components.
pub const W_BEST: f64 = 0.5;
pub const W_CANDIDATES: f64 = 0.3;
pub const W_EVALS: f64 = 0.2;
/// Credit for the B: move by its rank in Stockfish's top 5; a legal move outside it gets `OUTSIDE_TOP`.
pub const RANK_CREDIT: [f64; 5] = [1.0, 0.6, 0.4, 0.25, 0.15];
pub const OUTSIDE_TOP: f64 = 0.05;
/// A B: move missing from the answer's own M: list gets this share of its credit.
pub const INCONSISTENT_BEST: f64 = 0.5;
/// Each illegal, repeated or surplus M: move cancels this much of a hit.
pub const CANDIDATE_PENALTY: f64 = 0.5;
/// Evals are compared after clamping to +-this many pawns, so mate evals do not dominate.
pub const EVAL_CLAMP: f64 = 10.0;
/// Eval credit is exp(-error / EVAL_SCALE), error in pawns.
pub const EVAL_SCALE: f64 = 0.5;
/// Under `PolicyReward::CpLoss`, a legal B: move that loses `l` pawns (evals clamped to `EVAL_CLAMP`, so a
/// missed mate costs at most 20) earns `LOSS_FLOOR + (1 - LOSS_FLOOR) exp(-l / LOSS_SCALE)`: half a pawn lost
/// keeps 0.62 of the credit, one pawn 0.40, three 0.10; a legal move always earns more than an illegal one.
pub const LOSS_SCALE: f64 = 1.0;
pub const LOSS_FLOOR: f64 = OUTSIDE_TOP;
/// Evals within this many pawns of the best count as the same rank.
pub const TIE: f64 = 1e-9;

/// Weights of the A: components: the FEN carries the score, the rest only scales it.
pub const W_FEN: f64 = 0.6;
/// Credit for a wrong FEN is `NEAR_MISS_CAP * similarity ^ NEAR_MISS_POWER`.
pub const NEAR_MISS_CAP: f64 = 0.5;
pub const NEAR_MISS_POWER: i32 = 16;

/// The ground truth of a P: prompt, taken from Stockfish's analysis: its top moves, best first, with
/// evals in pawns from the side to move's view. Python's twin is `rookworld.rewards.GroundTruth`.
#[derive(Clone, Debug, PartialEq)]
pub struct GroundTruth {
    pub moves: Vec<String>,
    pub evals: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    Policy,
    Env,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Policy => "P",
            Task::Env => "A",
        }
    }

    pub fn of_prompt(prompt: &str) -> Option<Task> {
        let p = prompt.trim_start();
        if p.starts_with("P:") {
            Some(Task::Policy)
        } else if p.starts_with("A:") {
            Some(Task::Env)
        } else {
            None
        }
    }
}

/// The parts of a P: score, each in [0, 1].
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PolicyParts {
    /// Rank of the B: move in Stockfish's list (1 = best), 0 when outside it.
    pub best_rank: u32,
    pub best_legal: bool,
    pub best: f64,
    /// Distinct M: moves in Stockfish's top moves.
    pub hits: u32,
    pub candidates: f64,
    pub evals: f64,
    /// Mean absolute eval error (clamped pawns) over the M: moves Stockfish also listed.
    pub eval_error: Option<f64>,
    /// Pawns the B: move loses against Stockfish's best (clamped evals), where the ground truth evaluates it.
    pub best_loss: Option<f64>,
}

/// The parts of an A: score.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EnvParts {
    pub fen_exact: bool,
    pub fen_similarity: f64,
    pub reward_ok: bool,
    pub terminated_ok: bool,
    pub truncated_ok: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Parts {
    Policy(PolicyParts),
    Env(EnvParts),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Score {
    pub task: Task,
    pub reward: f64,
    /// Whether the completion had the answer's structure at all.
    pub well_formed: bool,
    pub quality: f64,
    /// `None` when not well formed.
    pub parts: Option<Parts>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScoreError {
    UnknownTask,
    BadPrompt(String),
    MissingGroundTruth,
}

impl fmt::Display for ScoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScoreError::UnknownTask => f.write_str("prompt is neither a P: nor an A: prompt"),
            ScoreError::BadPrompt(e) => write!(f, "bad prompt: {e}"),
            ScoreError::MissingGroundTruth => f.write_str("a P: prompt needs a Stockfish analysis"),
        }
    }
}

impl std::error::Error for ScoreError {}

/// Scores one completion. Errors are about the prompt or ground truth (trusted inputs), never
/// about the completion.
pub fn score(prompt: &str, completion: &str, truth: Option<&GroundTruth>, scoring: impl Into<Scoring>)
             -> Result<Score, ScoreError> {
    let Scoring { shaping, policy } = scoring.into();
    match Task::of_prompt(prompt).ok_or(ScoreError::UnknownTask)? {
        Task::Policy => {
            let fen = prompt_fen(prompt).ok_or_else(|| ScoreError::BadPrompt("P: prompt without a FEN".into()))?;
            let pos = parse_fen(fen).map_err(|e| ScoreError::BadPrompt(e.to_string()))?;
            let truth = truth.ok_or(ScoreError::MissingGroundTruth)?;
            Ok(match parse_answer(completion) {
                None => malformed(Task::Policy),
                Some(answer) => {
                    let parts = policy_parts(&pos, &answer, truth, policy);
                    let quality = W_BEST * parts.best + W_CANDIDATES * parts.candidates + W_EVALS * parts.evals;
                    scored(Task::Policy, quality, shaping, Parts::Policy(parts))
                }
            })
        }
        Task::Env => {
            let p = parse_env_prompt(prompt).map_err(|e| ScoreError::BadPrompt(e.to_string()))?;
            let pos = parse_fen(&p.fen).map_err(|e| ScoreError::BadPrompt(e.to_string()))?;
            let truth = step(&pos, &p.mv);
            Ok(match parse_env_answer(completion) {
                None => malformed(Task::Env),
                Some(answer) => {
                    let parts = EnvParts {
                        fen_exact: answer.fen == truth.fen,
                        fen_similarity: similarity(answer.fen, &truth.fen),
                        reward_ok: answer.reward.is_some_and(|r| (r - truth.reward.value()).abs() < 1e-9),
                        terminated_ok: answer.terminated == Some(truth.terminated()),
                        truncated_ok: answer.truncated == Some(truth.truncated()),
                    };
                    let fen = if parts.fen_exact {
                        1.0
                    } else {
                        NEAR_MISS_CAP * parts.fen_similarity.powi(NEAR_MISS_POWER)
                    };
                    let flags = [parts.reward_ok, parts.terminated_ok, parts.truncated_ok];
                    let flags = flags.iter().filter(|ok| **ok).count() as f64 / 3.0;
                    // Guessing the common `0.001+0+0` earns nothing without the right board.
                    let quality = fen * (W_FEN + (1.0 - W_FEN) * flags);
                    scored(Task::Env, quality, shaping, Parts::Env(parts))
                }
            })
        }
    }
}

fn malformed(task: Task) -> Score {
    Score { task, reward: UNPARSEABLE, well_formed: false, quality: 0.0, parts: None }
}

fn scored(task: Task, quality: f64, shaping: Shaping, parts: Parts) -> Score {
    Score { task, reward: shaping.reward(quality), well_formed: true, quality, parts: Some(parts) }
}

fn clamp_eval(pawns: f64) -> f64 {
    pawns.clamp(-EVAL_CLAMP, EVAL_CLAMP)
}

/// The credit of a legal move that loses `loss` pawns against the best (`PolicyReward::CpLoss`).
pub fn loss_credit(loss: f64) -> f64 {
    if loss <= TIE {
        1.0
    } else {
        LOSS_FLOOR + (1.0 - LOSS_FLOOR) * (-loss / LOSS_SCALE).exp()
    }
}

fn policy_parts(pos: &Chess, answer: &PolicyAnswer, truth: &GroundTruth, policy: PolicyReward) -> PolicyParts {
    let mut parts = PolicyParts::default();
    // Hits, ranks and eval checks look at Stockfish's top moves only, however many the ground truth holds.
    let wanted = truth.moves.len().min(RANK_CREDIT.len());
    let truth_rank = |mv: &str| truth.moves.iter().position(|m| m == mv);
    let top_rank = |mv: &str| truth_rank(mv).filter(|&r| r < wanted);
    let top = truth.evals.first().copied().unwrap_or(0.0);

    // B: credit by rank, where moves as good as the best share rank 1.
    parts.best_legal = legal_move(pos, &answer.best).is_some();
    if let Some(r) = top_rank(&answer.best) {
        let tied = truth.evals.get(r).is_some_and(|e| (e - top).abs() <= TIE);
        let r = if tied { 0 } else { r };
        parts.best_rank = r as u32 + 1;
        parts.best = RANK_CREDIT.get(r).copied().unwrap_or(OUTSIDE_TOP);
    } else if parts.best_legal {
        parts.best = OUTSIDE_TOP;
    }
    if parts.best_legal {
        if let Some(r) = truth_rank(&answer.best) {
            let loss = (clamp_eval(top) - clamp_eval(truth.evals[r])).max(0.0);
            parts.best_loss = Some(loss);
            if policy == PolicyReward::CpLoss {
                parts.best = loss_credit(loss);
            }
        }
    }
    if !answer.moves.contains(&answer.best) {
        parts.best *= INCONSISTENT_BEST;
    }

    // M: distinct hits, less penalties for illegal, repeated and surplus moves.
    let mut seen: Vec<&str> = Vec::new();
    let mut penalties = 0usize;
    let mut eval_credit = 0.0;
    let mut errors = Vec::new();
    for (i, mv) in answer.moves.iter().enumerate() {
        if i >= wanted.max(1) || seen.contains(&mv.as_str()) || legal_move(pos, mv).is_none() {
            penalties += 1;
            continue;
        }
        seen.push(mv);
        if let Some(r) = top_rank(mv) {
            parts.hits += 1;
            // E: the eval written beside this move against Stockfish's eval for it.
            if let Some(Some(e)) = answer.evals.get(i) {
                let err = (clamp_eval(*e) - clamp_eval(truth.evals[r])).abs();
                errors.push(err);
                eval_credit += (-err / EVAL_SCALE).exp();
            }
        }
    }
    if wanted > 0 {
        let net = parts.hits as f64 - CANDIDATE_PENALTY * penalties as f64;
        parts.candidates = (net / wanted as f64).clamp(0.0, 1.0);
        let surplus_evals = answer.evals.len().saturating_sub(wanted) as f64;
        parts.evals = ((eval_credit - CANDIDATE_PENALTY * surplus_evals) / wanted as f64).clamp(0.0, 1.0);
    }
    if !errors.is_empty() {
        parts.eval_error = Some(errors.iter().sum::<f64>() / errors.len() as f64);
    }
    parts
}
