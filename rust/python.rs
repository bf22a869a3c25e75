//! The PyO3 layer: converts Python values, releases the GIL, calls `batch`. No chess here.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::batch;
use crate::generate::{generate_positions as generate, GeneratorConfig};
use crate::reward::{Analysis, Parts, Shaping};

/// Strings from any iterable of `str`. Lone surrogates become U+FFFD rather than an exception:
/// model output must never crash a run.
fn texts(items: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    items
        .try_iter()?
        .map(|item| {
            let item = item?;
            match item.cast::<PyString>() {
                Ok(s) => Ok(s.to_string_lossy().into_owned()),
                Err(_) => Err(PyTypeError::new_err(format!("expected str, got {}", item.get_type().name()?))),
            }
        })
        .collect()
}

fn same_length(a: usize, b: usize) -> PyResult<()> {
    if a == b {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!("batches differ in length: {a} and {b}")))
    }
}

/// `(ok, text)` per item: text is the result when ok, else the error message.
fn outcome<T, E: ToString>(r: Result<T, E>, f: impl FnOnce(T) -> String) -> (bool, String) {
    match r {
        Ok(v) => (true, f(v)),
        Err(e) => (false, e.to_string()),
    }
}

#[pyfunction]
fn normalize_fens(py: Python<'_>, fens: &Bound<'_, PyAny>) -> PyResult<Vec<(bool, String)>> {
    let fens = texts(fens)?;
    Ok(py.detach(|| batch::normalize_fens(&fens)).into_iter().map(|r| outcome(r, |s| s)).collect())
}

#[pyfunction]
fn legal_moves(py: Python<'_>, fens: &Bound<'_, PyAny>) -> PyResult<Vec<(bool, Vec<String>, String)>> {
    let fens = texts(fens)?;
    Ok(py
        .detach(|| batch::legal_moves(&fens))
        .into_iter()
        .map(|r| match r {
            Ok(moves) => (true, moves, String::new()),
            Err(e) => (false, Vec::new(), e.to_string()),
        })
        .collect())
}

#[pyfunction]
fn is_legal(py: Python<'_>, fens: &Bound<'_, PyAny>, moves: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
    let (fens, moves) = (texts(fens)?, texts(moves)?);
    same_length(fens.len(), moves.len())?;
    Ok(py.detach(|| batch::is_legal(&fens, &moves)))
}

/// Per item `(ok, new_fen or error, reward, terminated, truncated)`.
#[pyfunction]
fn env_steps(
    py: Python<'_>,
    fens: &Bound<'_, PyAny>,
    moves: &Bound<'_, PyAny>,
) -> PyResult<Vec<(bool, String, f64, bool, bool)>> {
    let (fens, moves) = (texts(fens)?, texts(moves)?);
    same_length(fens.len(), moves.len())?;
    Ok(py
        .detach(|| batch::env_steps(&fens, &moves))
        .into_iter()
        .map(|r| match r {
            Ok(t) => (true, t.fen.clone(), t.reward.value(), t.terminated(), t.truncated()),
            Err(e) => (false, e.to_string(), 0.0, false, false),
        })
        .collect())
}

#[pyfunction]
fn env_targets(py: Python<'_>, prompts: &Bound<'_, PyAny>) -> PyResult<Vec<(bool, String)>> {
    let prompts = texts(prompts)?;
    Ok(py.detach(|| batch::env_targets(&prompts)).into_iter().map(|r| outcome(r, |s| s)).collect())
}

#[pyfunction]
fn env_prompts(
    py: Python<'_>,
    fens: &Bound<'_, PyAny>,
    moves: &Bound<'_, PyAny>,
    histories: &Bound<'_, PyAny>,
) -> PyResult<Vec<String>> {
    let (fens, moves) = (texts(fens)?, texts(moves)?);
    let histories: Vec<Vec<String>> = histories.try_iter()?.map(|h| texts(&h?)).collect::<PyResult<_>>()?;
    same_length(fens.len(), moves.len())?;
    same_length(fens.len(), histories.len())?;
    Ok(py.detach(|| batch::env_prompts(&fens, &moves, &histories)))
}

#[pyfunction]
fn perft(py: Python<'_>, fen: &str, depth: u32) -> PyResult<u64> {
    let fen = fen.to_string();
    py.detach(|| batch::perft(&fen, depth)).map_err(|e| PyValueError::new_err(format!("{e}: {fen:?}")))
}

/// Per position `(fen, history, move, phase)`.
#[pyfunction]
#[pyo3(signature = (n, seed, start=0, opening_share=0.2, endgame_share=0.2, illegal_share=0.01))]
fn generate_positions(
    py: Python<'_>,
    n: usize,
    seed: u64,
    start: u64,
    opening_share: f64,
    endgame_share: f64,
    illegal_share: f64,
) -> PyResult<Vec<(String, Vec<String>, String, &'static str)>> {
    let shares = [opening_share, endgame_share, illegal_share];
    if shares.iter().any(|s| !(0.0..=1.0).contains(s)) || opening_share + endgame_share > 1.0 {
        return Err(PyValueError::new_err(format!(
            "shares must lie in [0, 1] and opening + endgame <= 1, got {shares:?}"
        )));
    }
    let cfg = GeneratorConfig { opening_share, endgame_share, illegal_share };
    Ok(py
        .detach(|| generate(n, seed, start, &cfg))
        .into_iter()
        .map(|p| (p.fen, p.history, p.mv, p.phase.as_str()))
        .collect())
}

/// Column-wise scores, so Python can wrap them in arrays without a per-item object.
#[derive(IntoPyObject, Default)]
struct ScoreColumns {
    ok: Vec<bool>,
    error: Vec<String>,
    task: Vec<&'static str>,
    reward: Vec<f64>,
    well_formed: Vec<bool>,
    quality: Vec<f64>,
    best_rank: Vec<u32>,
    best_legal: Vec<bool>,
    best: Vec<f64>,
    hits: Vec<u32>,
    candidates: Vec<f64>,
    evals: Vec<f64>,
    eval_error: Vec<f64>,
    fen_exact: Vec<bool>,
    fen_similarity: Vec<f64>,
    reward_ok: Vec<bool>,
    terminated_ok: Vec<bool>,
    truncated_ok: Vec<bool>,
}

impl ScoreColumns {
    fn push(&mut self, r: Result<crate::reward::Score, crate::reward::ScoreError>) {
        let (p, a) = match &r {
            Ok(s) => match &s.parts {
                Some(Parts::Policy(p)) => (p.clone(), Default::default()),
                Some(Parts::Env(a)) => (Default::default(), a.clone()),
                None => Default::default(),
            },
            Err(_) => Default::default(),
        };
        self.ok.push(r.is_ok());
        self.error.push(r.as_ref().err().map(|e| e.to_string()).unwrap_or_default());
        self.task.push(r.as_ref().map(|s| s.task.as_str()).unwrap_or(""));
        self.reward.push(r.as_ref().map_or(f64::NAN, |s| s.reward));
        self.well_formed.push(r.as_ref().is_ok_and(|s| s.well_formed));
        self.quality.push(r.as_ref().map_or(f64::NAN, |s| s.quality));
        self.best_rank.push(p.best_rank);
        self.best_legal.push(p.best_legal);
        self.best.push(p.best);
        self.hits.push(p.hits);
        self.candidates.push(p.candidates);
        self.evals.push(p.evals);
        self.eval_error.push(p.eval_error.unwrap_or(f64::NAN));
        self.fen_exact.push(a.fen_exact);
        self.fen_similarity.push(a.fen_similarity);
        self.reward_ok.push(a.reward_ok);
        self.terminated_ok.push(a.terminated_ok);
        self.truncated_ok.push(a.truncated_ok);
    }
}

#[pyfunction]
#[pyo3(signature = (prompts, completions, analyses, shaping="continuous"))]
fn score(
    py: Python<'_>,
    prompts: &Bound<'_, PyAny>,
    completions: &Bound<'_, PyAny>,
    analyses: Vec<Option<(Vec<String>, Vec<f64>)>>,
    shaping: &str,
) -> PyResult<ScoreColumns> {
    let shaping = Shaping::parse(shaping)
        .ok_or_else(|| PyValueError::new_err(format!("shaping must be 'continuous' or 'graduated', got {shaping:?}")))?;
    let (prompts, completions) = (texts(prompts)?, texts(completions)?);
    same_length(prompts.len(), completions.len())?;
    same_length(prompts.len(), analyses.len())?;
    let analyses: Vec<Option<Analysis>> =
        analyses.into_iter().map(|a| a.map(|(moves, evals)| Analysis { moves, evals })).collect();
    if let Some(bad) = analyses.iter().flatten().find(|a| a.moves.len() != a.evals.len()) {
        return Err(PyValueError::new_err(format!("analysis with {} moves but {} evals", bad.moves.len(), bad.evals.len())));
    }
    Ok(py.detach(|| {
        let mut cols = ScoreColumns::default();
        for r in batch::score(&prompts, &completions, &analyses, shaping) {
            cols.push(r);
        }
        cols
    }))
}

#[pyfunction]
fn policy_targets(
    py: Python<'_>,
    fens: Vec<String>,
    moves: Vec<Vec<String>>,
    evals: Vec<Vec<f64>>,
    best: Vec<String>,
) -> PyResult<Vec<String>> {
    same_length(fens.len(), moves.len())?;
    same_length(fens.len(), evals.len())?;
    same_length(fens.len(), best.len())?;
    Ok(py.detach(|| batch::policy_targets(&fens, &moves, &evals, &best)))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(normalize_fens, m)?)?;
    m.add_function(wrap_pyfunction!(legal_moves, m)?)?;
    m.add_function(wrap_pyfunction!(is_legal, m)?)?;
    m.add_function(wrap_pyfunction!(env_steps, m)?)?;
    m.add_function(wrap_pyfunction!(env_targets, m)?)?;
    m.add_function(wrap_pyfunction!(env_prompts, m)?)?;
    m.add_function(wrap_pyfunction!(perft, m)?)?;
    m.add_function(wrap_pyfunction!(generate_positions, m)?)?;
    m.add_function(wrap_pyfunction!(score, m)?)?;
    m.add_function(wrap_pyfunction!(policy_targets, m)?)?;
    m.add("HISTORY_LEN", crate::prompt::HISTORY_LEN)?;
    Ok(())
}
