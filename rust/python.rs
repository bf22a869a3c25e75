//! The PyO3 layer: converts Python values, releases the GIL, calls `batch`. No chess here.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use std::io;
use std::path::PathBuf;

use crate::batch;
use crate::fen::echoed;
use crate::generate::{generate_positions as generate, GeneratorConfig};
use crate::pgn::{collect_games, read_files, Game, PgnError, PgnReader};
use crate::pgn_positions::{sample_positions, GamePosition, SampleConfig};
use crate::reward::{GroundTruth, Parts, PolicyReward, Scoring, Shaping};

/// Failures of a batch, by index: the all-good batch crosses into Python as one plain list beside an empty one.
type Failures = Vec<(usize, String)>;
/// One A: step as Python sees it: `(ok, new_fen or error, reward, terminated, truncated)`.
type StepTuple = (bool, String, f64, bool, bool);
/// One generated position: `(fen, history, move, phase)`.
type PositionTuple = (String, Vec<String>, String, &'static str);
/// One mate-in-one puzzle: `(fen, history, mates)`.
type MateTuple = (String, Vec<String>, Vec<String>);

/// One position of a real game: `(fen, history, move or None, phase, game, ply, "file:line" of the game)`.
type GamePositionTuple<'py> = (String, Bound<'py, PyTuple>, Option<String>, &'static str, usize, usize, String);
/// A game's moves, and the Python strings its positions' histories share.
type GameStrings<'py> = (std::sync::Arc<[String]>, Vec<Bound<'py, PyString>>);
/// `(games read, bad games skipped, their first reasons, games filtered out, duplicates, held-out games)`.
type PgnStatsTuple = (usize, usize, Vec<String>, usize, usize, usize);
/// One game: `(index, source, line, headers as (name, value), start FEN, mainline UCI)`.
type GameTuple = (usize, String, usize, Vec<(&'static str, String)>, String, Vec<String>);

/// A whole number as Python gives it, however wide. PyO3's own u64 and usize refuse one past 64 bits, or a
/// negative one, with an OverflowError that reached a user as a traceback (`--min-elo 10**20`); here each use
/// says by name what it makes of one.
#[derive(Clone, Copy, Debug)]
enum Whole {
    Fits(u64),
    Above,
    Negative,
}

impl FromPyObject<'_, '_> for Whole {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        match obj.extract::<u64>() {
            Ok(n) => Ok(Whole::Fits(n)),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(if obj.lt(0)? { Whole::Negative } else { Whole::Above })
            }
            Err(e) => Err(e),
        }
    }
}

impl Whole {
    /// A count or a limit, which a number past 64 bits never reaches: it saturates.
    fn saturating(self, name: &str) -> PyResult<u64> {
        match self {
            Whole::Fits(n) => Ok(n),
            Whole::Above => Ok(u64::MAX),
            Whole::Negative => Err(PyValueError::new_err(format!("{name} must be >= 0"))),
        }
    }

    fn saturating_usize(self, name: &str) -> PyResult<usize> {
        Ok(usize::try_from(self.saturating(name)?).unwrap_or(usize::MAX))
    }

    /// A number used as it is (a seed, a size to allocate): one above `max` is refused.
    fn at_most(self, name: &str, max: u64) -> PyResult<u64> {
        match self {
            Whole::Fits(n) if n <= max => Ok(n),
            Whole::Negative => Err(PyValueError::new_err(format!("{name} must be >= 0"))),
            _ => Err(PyValueError::new_err(format!("{name} must be at most {max}"))),
        }
    }
}

fn saturating_all(name: &str, value: Option<Whole>) -> PyResult<Option<u64>> {
    value.map(|w| w.saturating(name)).transpose()
}

fn saturating_usize_all(name: &str, value: Option<Whole>) -> PyResult<Option<usize>> {
    value.map(|w| w.saturating_usize(name)).transpose()
}

/// The most history moves `pgn_positions` returns beyond a prompt's window a position: whole histories grow with
/// the square of a game's length (one 17,998-ply game's hold 162 million moves), and Python's strings, unlike its
/// tuples, panic where memory runs out.
const MAX_HISTORY_MOVES: usize = 20_000_000;

/// The most positions one call generates: each is a few hundred bytes, and an allocation Rust cannot make aborts
/// the process rather than raising (callers generate in chunks far smaller).
const MAX_GENERATED: u64 = 100_000_000;

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
    Ok(move_lists(py.detach(|| batch::legal_moves(&fens))))
}

/// Per position `(ok, moves that mate at once, error)`.
#[pyfunction]
fn mating_moves(py: Python<'_>, fens: &Bound<'_, PyAny>) -> PyResult<Vec<(bool, Vec<String>, String)>> {
    let fens = texts(fens)?;
    Ok(move_lists(py.detach(|| batch::mating_moves(&fens))))
}

/// Per position `(ok, moves, error)`: Python gets the error as text beside the others' results.
fn move_lists<E: ToString>(results: Vec<Result<Vec<String>, E>>) -> Vec<(bool, Vec<String>, String)> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(moves) => (true, moves, String::new()),
            Err(e) => (false, Vec::new(), e.to_string()),
        })
        .collect()
}

/// Per item `(ok, UCI of the move that the text (UCI or SAN) names, or why none)`.
#[pyfunction]
fn parse_moves(py: Python<'_>, fens: &Bound<'_, PyAny>, moves: &Bound<'_, PyAny>) -> PyResult<Vec<(bool, String)>> {
    let (fens, moves) = (texts(fens)?, texts(moves)?);
    same_length(fens.len(), moves.len())?;
    Ok(py.detach(|| batch::parse_moves(&fens, &moves)).into_iter().map(|r| outcome(r, |s| s)).collect())
}

/// Per item `(ok, SAN of the UCI move, or why none)`.
#[pyfunction]
fn san_moves(py: Python<'_>, fens: &Bound<'_, PyAny>, ucis: &Bound<'_, PyAny>) -> PyResult<Vec<(bool, String)>> {
    let (fens, ucis) = (texts(fens)?, texts(ucis)?);
    same_length(fens.len(), ucis.len())?;
    Ok(py.detach(|| batch::san_moves(&fens, &ucis)).into_iter().map(|r| outcome(r, |s| s)).collect())
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
) -> PyResult<Vec<StepTuple>> {
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

/// `(targets, errors)`: a target per prompt ("" where it failed) and `(index, message)` per failure,
/// so that the common all-good batch crosses into Python as one plain list.
#[pyfunction]
fn env_targets(py: Python<'_>, prompts: &Bound<'_, PyAny>) -> PyResult<(Vec<String>, Failures)> {
    let prompts = texts(prompts)?;
    let results = py.detach(|| batch::env_targets(&prompts));
    let mut errors = Vec::new();
    let targets = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| {
            errors.push((i, e.to_string()));
            String::new()
        }))
        .collect();
    Ok((targets, errors))
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

/// Per position what is wrong with its history, or `None`.
#[pyfunction]
fn history_problems(
    py: Python<'_>,
    fens: &Bound<'_, PyAny>,
    histories: &Bound<'_, PyAny>,
) -> PyResult<Vec<Option<String>>> {
    let fens = texts(fens)?;
    let histories: Vec<Vec<String>> = histories.try_iter()?.map(|h| texts(&h?)).collect::<PyResult<_>>()?;
    same_length(fens.len(), histories.len())?;
    Ok(py.detach(|| batch::history_problems(&fens, &histories)))
}

/// Per analysis what is wrong with it, or `None`.
#[pyfunction]
#[pyo3(signature = (fens, moves, evals, max_moves=None))]
fn analysis_problems(
    py: Python<'_>,
    fens: Vec<String>,
    moves: Vec<Vec<String>>,
    evals: Vec<Vec<f64>>,
    max_moves: Option<Whole>,
) -> PyResult<Vec<Option<String>>> {
    let max_moves = saturating_usize_all("max_moves", max_moves)?;
    same_length(fens.len(), moves.len())?;
    same_length(fens.len(), evals.len())?;
    Ok(py.detach(|| batch::analysis_problems(&fens, &moves, &evals, max_moves)))
}

#[pyfunction]
fn perft(py: Python<'_>, fen: &str, depth: Whole) -> PyResult<u64> {
    let depth = depth.at_most("depth", u32::MAX.into())? as u32;
    let fen = fen.to_string();
    py.detach(|| batch::perft(&fen, depth)).map_err(|e| PyValueError::new_err(format!("{e}: {}", echoed(&fen))))
}

/// Per position `(fen, history, move, phase)`.
#[pyfunction]
#[pyo3(signature = (n, seed, start=Whole::Fits(0), opening_share=0.2, endgame_share=0.2, illegal_share=0.01),
       text_signature = "(n, seed, start=0, opening_share=0.2, endgame_share=0.2, illegal_share=0.01)")]
fn generate_positions(
    py: Python<'_>,
    n: Whole,
    seed: Whole,
    start: Whole,
    opening_share: f64,
    endgame_share: f64,
    illegal_share: f64,
) -> PyResult<Vec<PositionTuple>> {
    let (n, seed, start) = stream("n", n, seed, start)?;
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

/// Per puzzle `(fen, history, mates)`.
#[pyfunction]
#[pyo3(signature = (n, seed, start=Whole::Fits(0)), text_signature = "(n, seed, start=0)")]
fn mate_in_one_positions(py: Python<'_>, n: Whole, seed: Whole, start: Whole) -> PyResult<Vec<MateTuple>> {
    let (n, seed, start) = stream("n", n, seed, start)?;
    Ok(py
        .detach(|| crate::mate::mate_in_one_positions(n, seed, start))
        .into_iter()
        .map(|p| (p.fen, p.history, p.mates))
        .collect())
}

/// `(n, seed, start)` of a generator's stream: `n` items from index `start`, all of whose indices fit 64 bits.
fn stream(name: &str, n: Whole, seed: Whole, start: Whole) -> PyResult<(usize, u64, u64)> {
    let n = n.at_most(name, MAX_GENERATED)?;
    let seed = seed.at_most("seed", u64::MAX)?;
    let start = start.at_most("start", u64::MAX - n)?;
    Ok((n as usize, seed, start))
}

/// A file's error keeps its kind (FileNotFoundError, PermissionError) and says which file; a bad game, or a file
/// that is no PGN, is a ValueError.
fn pgn_error(e: PgnError) -> PyErr {
    match e {
        PgnError::Io { source, error } => io::Error::new(error.kind(), format!("{source}: {error}")).into(),
        e @ (PgnError::LongLine { .. } | PgnError::Game(_)) => PyValueError::new_err(e.to_string()),
    }
}

/// The games of `text` (named `name` in messages) if given, else of the files.
fn pgn_source(
    paths: Vec<PathBuf>,
    text: Option<String>,
    name: &str,
) -> Box<dyn Iterator<Item = Result<Game, PgnError>> + Send> {
    match text {
        Some(text) => Box::new(PgnReader::new(io::Cursor::new(text.into_bytes()), name, 0)),
        None => Box::new(read_files(paths)),
    }
}

/// Positions as Python tuples, each with the last `history_len` moves of its history (all when `None`). A game's
/// moves become Python strings once, which its positions' histories share: all of them, asked for, are a pointer
/// a move a position, and memory Python cannot find is a MemoryError, where a Rust copy of each aborted.
fn position_tuples<'py>(
    py: Python<'py>,
    positions: Vec<GamePosition>,
    history_len: Option<usize>,
) -> PyResult<Vec<GamePositionTuple<'py>>> {
    let total: usize = positions.iter().map(|p| p.ply.min(history_len.unwrap_or(usize::MAX))).sum();
    let allowed = MAX_HISTORY_MOVES.max(crate::a_text::HISTORY_LEN * positions.len());
    if total > allowed {
        return Err(PyValueError::new_err(format!(
            "the histories asked for hold {total} moves in all, more than {allowed}: give a smaller history_len \
             (the default keeps the {} an A: prompt shows)",
            crate::a_text::HISTORY_LEN - 1
        )));
    }
    let mut game: Option<GameStrings<'py>> = None;
    let mut out = Vec::with_capacity(positions.len());
    for p in positions {
        let strings = match &game {
            Some((moves, strings)) if std::sync::Arc::ptr_eq(moves, &p.moves) => strings,
            _ => &game.insert((p.moves.clone(), p.moves.iter().map(|m| PyString::new(py, m)).collect())).1,
        };
        let from = p.ply.saturating_sub(history_len.unwrap_or(usize::MAX));
        let history = PyTuple::new(py, &strings[from..p.ply])?;
        let source = format!("{}:{}", p.source, p.line);
        out.push((p.fen, history, p.mv, p.phase.as_str(), p.game, p.ply, source));
    }
    Ok(out)
}

/// `(games, bad games skipped, their first reasons)`.
#[pyfunction]
#[pyo3(signature = (paths, text=None, name="<text>", skip_bad=false, max_games=None))]
fn pgn_games(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    text: Option<String>,
    name: &str,
    skip_bad: bool,
    max_games: Option<Whole>,
) -> PyResult<(Vec<GameTuple>, usize, Vec<String>)> {
    let max_games = saturating_usize_all("max_games", max_games)?;
    let games = pgn_source(paths, text, name);
    let (games, skipped) = py.detach(|| collect_games(games, skip_bad, max_games)).map_err(pgn_error)?;
    let tuples = games
        .into_iter()
        .map(|g| (g.index, g.source.to_string(), g.line, g.headers.pairs(), crate::fen::to_fen(&g.start), g.moves))
        .collect();
    Ok((tuples, skipped.count, skipped.reasons))
}

/// `(positions, held-out positions, stats)` sampled from real games, each position with the last `history_len`
/// moves of its history (all when `None`: memory then grows with the square of a game's length).
#[pyfunction]
#[pyo3(signature = (paths, text=None, name="<text>", min_ply=Whole::Fits(0), per_game=None, seed=Whole::Fits(0),
                    min_elo=None, max_elo=None, min_base_seconds=None, dedup=true, held_out=0.0, skip_bad=false,
                    max_games=None, max_positions=None, history_len=None),
       text_signature = "(paths, text=None, name='<text>', min_ply=0, per_game=None, seed=0, min_elo=None, \
                         max_elo=None, min_base_seconds=None, dedup=True, held_out=0.0, skip_bad=False, \
                         max_games=None, max_positions=None, history_len=None)")]
#[allow(clippy::too_many_arguments)]
fn pgn_positions<'py>(
    py: Python<'py>,
    paths: Vec<PathBuf>,
    text: Option<String>,
    name: &str,
    min_ply: Whole,
    per_game: Option<Whole>,
    seed: Whole,
    min_elo: Option<Whole>,
    max_elo: Option<Whole>,
    min_base_seconds: Option<Whole>,
    dedup: bool,
    held_out: f64,
    skip_bad: bool,
    max_games: Option<Whole>,
    max_positions: Option<Whole>,
    history_len: Option<Whole>,
) -> PyResult<(Vec<GamePositionTuple<'py>>, Vec<GamePositionTuple<'py>>, PgnStatsTuple)> {
    if !(0.0..1.0).contains(&held_out) {
        return Err(PyValueError::new_err(format!("held_out must lie in [0, 1), got {held_out}")));
    }
    let cfg = SampleConfig {
        min_ply: min_ply.saturating_usize("min_ply")?,
        per_game: saturating_usize_all("per_game", per_game)?,
        seed: seed.at_most("seed", u64::MAX)?,
        min_elo: saturating_all("min_elo", min_elo)?,
        max_elo: saturating_all("max_elo", max_elo)?,
        min_base_seconds: saturating_all("min_base_seconds", min_base_seconds)?,
        dedup,
        held_out,
        skip_bad,
        max_games: saturating_usize_all("max_games", max_games)?,
        max_positions: saturating_usize_all("max_positions", max_positions)?,
    };
    let history_len = saturating_usize_all("history_len", history_len)?;
    let games = pgn_source(paths, text, name);
    let sample = py.detach(|| sample_positions(games, &cfg)).map_err(pgn_error)?;
    let st = sample.stats;
    Ok((
        position_tuples(py, sample.positions, history_len)?,
        position_tuples(py, sample.held_out, history_len)?,
        (st.games, st.bad.count, st.bad.reasons, st.filtered, st.duplicates, st.held_out_games),
    ))
}

/// Column-wise scores as packed little-endian buffers (f64, u32 or u8 per item), which numpy wraps with
/// `frombuffer`: a 100k batch crosses into Python as 17 objects instead of 1.7 million.
#[derive(Default)]
struct ScoreColumns {
    f64s: Vec<(&'static str, Vec<u8>)>,
    task: Vec<u8>,
    well_formed: Vec<u8>,
    best_rank: Vec<u8>,
    best_legal: Vec<u8>,
    hits: Vec<u8>,
    fen_exact: Vec<u8>,
    reward_ok: Vec<u8>,
    terminated_ok: Vec<u8>,
    truncated_ok: Vec<u8>,
    errors: Failures,
}

const F64_COLUMNS: [&str; 8] =
    ["reward", "quality", "best", "candidates", "evals", "eval_error", "best_loss", "fen_similarity"];

impl ScoreColumns {
    fn new(n: usize) -> Self {
        ScoreColumns {
            f64s: F64_COLUMNS.iter().map(|name| (*name, Vec::with_capacity(8 * n))).collect(),
            ..Default::default()
        }
    }

    fn push(&mut self, i: usize, r: Result<crate::reward::Score, crate::reward::ScoreError>) {
        let (score, p, a) = match r {
            Ok(s) => {
                let (p, a) = match &s.parts {
                    Some(Parts::Policy(p)) => (p.clone(), Default::default()),
                    Some(Parts::Env(a)) => (Default::default(), a.clone()),
                    None => Default::default(),
                };
                (Some(s), p, a)
            }
            Err(e) => {
                self.errors.push((i, e.to_string()));
                (None, Default::default(), Default::default())
            }
        };
        let values = [
            score.as_ref().map_or(f64::NAN, |s| s.reward),
            score.as_ref().map_or(f64::NAN, |s| s.quality),
            p.best,
            p.candidates,
            p.evals,
            p.eval_error.unwrap_or(f64::NAN),
            p.best_loss.unwrap_or(f64::NAN),
            a.fen_similarity,
        ];
        for ((_, col), v) in self.f64s.iter_mut().zip(values) {
            col.extend_from_slice(&v.to_le_bytes());
        }
        self.task.push(score.as_ref().map_or(b'?', |s| s.task.as_str().as_bytes()[0]));
        self.well_formed.push(u8::from(score.as_ref().is_some_and(|s| s.well_formed)));
        self.best_rank.push(p.best_rank as u8);
        self.best_legal.push(u8::from(p.best_legal));
        self.hits.push(p.hits as u8);
        self.fen_exact.push(u8::from(a.fen_exact));
        self.reward_ok.push(u8::from(a.reward_ok));
        self.terminated_ok.push(u8::from(a.terminated_ok));
        self.truncated_ok.push(u8::from(a.truncated_ok));
    }

    fn into_py(self, py: Python<'_>) -> PyResult<(Bound<'_, PyDict>, Failures)> {
        let d = PyDict::new(py);
        for (name, col) in &self.f64s {
            d.set_item(*name, PyBytes::new(py, col))?;
        }
        for (name, col) in [
            ("task", &self.task),
            ("well_formed", &self.well_formed),
            ("best_rank", &self.best_rank),
            ("best_legal", &self.best_legal),
            ("hits", &self.hits),
            ("fen_exact", &self.fen_exact),
            ("reward_ok", &self.reward_ok),
            ("terminated_ok", &self.terminated_ok),
            ("truncated_ok", &self.truncated_ok),
        ] {
            d.set_item(name, PyBytes::new(py, col))?;
        }
        Ok((d, self.errors))
    }
}

/// Scores completions. `truth_index[i]` picks prompt i's ground truth from `truths` (-1: none), so that the
/// completions of one group share one converted ground truth. Returns `(columns, errors)`.
#[pyfunction]
#[pyo3(signature = (prompts, completions, truth_index, truths, shaping="continuous", p_reward="rank"))]
fn score<'py>(
    py: Python<'py>,
    prompts: &Bound<'py, PyAny>,
    completions: &Bound<'py, PyAny>,
    truth_index: Vec<i64>,
    truths: Vec<(Vec<String>, Vec<f64>)>,
    shaping: &str,
    p_reward: &str,
) -> PyResult<(Bound<'py, PyDict>, Failures)> {
    let shaping = Shaping::parse(shaping)
        .ok_or_else(|| PyValueError::new_err(format!("shaping must be 'continuous' or 'graduated', got {shaping:?}")))?;
    let policy = PolicyReward::parse(p_reward)
        .ok_or_else(|| PyValueError::new_err(format!("p_reward must be 'rank' or 'cp-loss', got {p_reward:?}")))?;
    let (prompts, completions) = (texts(prompts)?, texts(completions)?);
    same_length(prompts.len(), completions.len())?;
    same_length(prompts.len(), truth_index.len())?;
    if let Some((moves, evals)) = truths.iter().find(|(m, e)| m.len() != e.len()) {
        return Err(PyValueError::new_err(format!("ground truth with {} moves but {} evals", moves.len(), evals.len())));
    }
    if let Some(bad) = truth_index.iter().find(|&&t| t < -1 || t >= truths.len() as i64) {
        return Err(PyValueError::new_err(format!("truth index {bad} out of range for {} ground truths", truths.len())));
    }
    let truths: Vec<GroundTruth> = truths.into_iter().map(|(moves, evals)| GroundTruth { moves, evals }).collect();
    let cols = py.detach(|| {
        let results = batch::score(&prompts, &completions, &truth_index, &truths, Scoring { shaping, policy });
        let mut cols = ScoreColumns::new(results.len());
        for (i, r) in results.into_iter().enumerate() {
            cols.push(i, r);
        }
        cols
    });
    cols.into_py(py)
}

#[pyfunction]
fn policy_targets(
    py: Python<'_>,
    fens: Vec<String>,
    moves: Vec<Vec<String>>,
    evals: Vec<Vec<f64>>,
    best: Vec<String>,
    layout: &str,
) -> PyResult<Vec<String>> {
    same_length(fens.len(), moves.len())?;
    same_length(fens.len(), evals.len())?;
    same_length(fens.len(), best.len())?;
    let layout = crate::p_text::Layout::from_name(layout)
        .ok_or_else(|| PyValueError::new_err(format!("unknown layout {layout:?}: rookworld or compact")))?;
    Ok(py.detach(|| batch::policy_targets(&fens, &moves, &evals, &best, layout)))
}

type PolicyAnswerTuple = (Vec<String>, Vec<Option<f64>>, String);
type EnvAnswerTuple = (String, Option<f64>, Option<bool>, Option<bool>);

/// Per completion `(moves, evals, best)` as the scorer reads a P: answer, or `None` without its structure.
#[pyfunction]
fn parse_policy_answers(completions: &Bound<'_, PyAny>) -> PyResult<Vec<Option<PolicyAnswerTuple>>> {
    Ok(texts(completions)?
        .iter()
        .map(|t| crate::p_text::parse_answer(t).map(|a| (a.moves, a.evals, a.best)))
        .collect())
}

/// Per completion `(fen, reward, terminated, truncated)` as the scorer reads an A: answer, or `None`.
#[pyfunction]
fn parse_env_answers(completions: &Bound<'_, PyAny>) -> PyResult<Vec<Option<EnvAnswerTuple>>> {
    Ok(texts(completions)?
        .iter()
        .map(|t| {
            crate::a_text::parse_env_answer(t).map(|a| (a.fen.to_string(), a.reward, a.terminated, a.truncated))
        })
        .collect())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A P: answer's quality is these weights' sum of its best, candidates and evals parts (reward.rs).
    m.add("P_QUALITY_WEIGHTS", (crate::reward::W_BEST, crate::reward::W_CANDIDATES, crate::reward::W_EVALS))?;
    m.add_function(wrap_pyfunction!(normalize_fens, m)?)?;
    m.add_function(wrap_pyfunction!(legal_moves, m)?)?;
    m.add_function(wrap_pyfunction!(is_legal, m)?)?;
    m.add_function(wrap_pyfunction!(mating_moves, m)?)?;
    m.add_function(wrap_pyfunction!(parse_moves, m)?)?;
    m.add_function(wrap_pyfunction!(san_moves, m)?)?;
    m.add_function(wrap_pyfunction!(env_steps, m)?)?;
    m.add_function(wrap_pyfunction!(env_targets, m)?)?;
    m.add_function(wrap_pyfunction!(env_prompts, m)?)?;
    m.add_function(wrap_pyfunction!(history_problems, m)?)?;
    m.add_function(wrap_pyfunction!(analysis_problems, m)?)?;
    m.add_function(wrap_pyfunction!(perft, m)?)?;
    m.add_function(wrap_pyfunction!(generate_positions, m)?)?;
    m.add_function(wrap_pyfunction!(mate_in_one_positions, m)?)?;
    m.add_function(wrap_pyfunction!(pgn_games, m)?)?;
    m.add_function(wrap_pyfunction!(pgn_positions, m)?)?;
    m.add_function(wrap_pyfunction!(score, m)?)?;
    m.add_function(wrap_pyfunction!(policy_targets, m)?)?;
    m.add_function(wrap_pyfunction!(parse_policy_answers, m)?)?;
    m.add_function(wrap_pyfunction!(parse_env_answers, m)?)?;
    m.add("HISTORY_LEN", crate::a_text::HISTORY_LEN)?;
    m.add("MAX_EVAL", crate::analysis::MAX_EVAL)?;
    Ok(())
}
