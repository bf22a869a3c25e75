//! Training positions from real games (`pgn`): sampled per game, with the game's real history and
//! the move the game played next, filtered by rating and time control, de-duplicated, and split by
//! game into training and held-out positions.
//!
//! Plies: a game of n moves has the positions after plies 0..=n. Ply 0, the start position, counts
//! by default (`min_ply` 0): for a game from a FEN header it is the study or puzzle position, and
//! the standard start, shared by every other game, survives de-duplication only once. The last
//! position counts too, with no next move; checkmates and stalemates among them are left for the
//! caller to drop, as it does for every position file.
//!
//! Two positions are one when board, side to move, castling rights and en-passant square (only
//! when a capture can use it) agree, as `rookworld.ground.data.position_key` says; the move
//! counters do not count. The key is kept as shakmaty's 128-bit Zobrist hash of exactly those,
//! 16 bytes a position, so that millions of games fit.
//!
//! A position's history is its game's moves, shared by all the game's positions, and the plies it
//! takes of them: a copy for each position made memory grow with the square of a game's length.

use std::collections::HashSet;
use std::sync::Arc;

use shakmaty::zobrist::Zobrist128;
use shakmaty::{Chess, Color, EnPassantMode, Position};

use crate::fen::to_fen;
use crate::generate::{Phase, ENDGAME_PIECES};
use crate::moves::legal_move;
use crate::pgn::{Game, PgnError, Skipped};
use crate::rng::Rng;

/// Plies from the standard start before which a position counts as an opening (the generator's
/// opening lines run to 16).
pub const OPENING_PLIES: u32 = 16;

#[derive(Clone, Debug, PartialEq)]
pub struct SampleConfig {
    /// The first ply a position may come after (0: the start position counts).
    pub min_ply: usize,
    /// At most this many positions a game, drawn at random; every one when `None`.
    pub per_game: Option<usize>,
    pub seed: u64,
    /// Both players' Elo must lie within [min, max]; a game without both Elo headers is left out when either is set.
    pub min_elo: Option<Threshold>,
    pub max_elo: Option<Threshold>,
    /// The base time of the TimeControl header (`300` of `300+3`) must be at least this; a game
    /// with none (`-`, `?`, missing) is left out when it is set.
    pub min_base_seconds: Option<Threshold>,
    /// Keep a position only the first time it comes (see the module's notes on what makes two one).
    pub dedup: bool,
    /// The share of games held out, whole: no held-out position comes from a training game, nor
    /// occurs anywhere in one.
    pub held_out: f64,
    /// Count bad games (and keep the first reasons) instead of failing on the first.
    pub skip_bad: bool,
    /// Stop after this many games read, bad and filtered ones included.
    pub max_games: Option<usize>,
    /// Stop once this many training positions are kept.
    pub max_positions: Option<usize>,
}

impl Default for SampleConfig {
    fn default() -> Self {
        SampleConfig {
            min_ply: 0,
            per_game: None,
            seed: 0,
            min_elo: None,
            max_elo: None,
            min_base_seconds: None,
            dedup: true,
            held_out: 0.0,
            skip_bad: false,
            max_games: None,
            max_positions: None,
        }
    }
}

/// A position from a real game.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GamePosition {
    /// In python-chess `board.fen()` form, counters as the game reached them.
    pub fen: String,
    /// The game's moves, shared with its other positions: the first `ply` of them led here (see `history`).
    pub moves: Arc<[String]>,
    /// The move the game played next; `None` after its last move.
    pub mv: Option<String>,
    pub phase: Phase,
    /// The game's index among all games read, and the plies played to reach this position.
    pub game: usize,
    pub ply: usize,
    /// The game's file and first line.
    pub source: Arc<str>,
    pub line: usize,
    /// What makes two positions one (see the module's notes).
    pub key: u128,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Games read, bad and filtered ones included.
    pub games: usize,
    /// Bad games, when `skip_bad` passed over them.
    pub bad: Skipped,
    /// Games left out by the rating and time-control filters.
    pub filtered: usize,
    /// Positions dropped as already kept (held-out ones seen in a training game included).
    pub duplicates: usize,
    pub held_out_games: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub positions: Vec<GamePosition>,
    pub held_out: Vec<GamePosition>,
    pub stats: Stats,
}

impl GamePosition {
    /// The moves from the game's start (its FEN header's position, if it has one) to this one, oldest first.
    pub fn history(&self) -> &[String] {
        &self.moves[..self.ply]
    }
}

/// Elo and base-time bounds as wide as any number a caller gives: one past u32 is simply never reached.
pub type Threshold = u64;

pub fn position_key(pos: &Chess) -> u128 {
    pos.zobrist_hash::<Zobrist128>(EnPassantMode::Legal).0
}

/// The base seconds of a PGN TimeControl: `300` of `300+3`, `7200` of `40/7200:3600`; `None` for `-`, `?` and the like.
pub fn base_seconds(time_control: &str) -> Option<Threshold> {
    let first = time_control.trim().split(':').next()?;
    let period = first.split_once('/').map_or(first, |(_, secs)| secs);
    period.split('+').next()?.parse().ok()
}

/// Whether the game passes the rating and time-control filters.
pub fn wanted(game: &Game, cfg: &SampleConfig) -> bool {
    let h = &game.headers;
    if cfg.min_elo.is_some() || cfg.max_elo.is_some() {
        let within = |elo: Option<u32>| {
            elo.map(Threshold::from)
                .is_some_and(|e| cfg.min_elo.is_none_or(|lo| e >= lo) && cfg.max_elo.is_none_or(|hi| e <= hi))
        };
        if !(within(h.white_elo) && within(h.black_elo)) {
            return false;
        }
    }
    match cfg.min_base_seconds {
        Some(min) => h.time_control.as_deref().and_then(base_seconds).is_some_and(|s| s >= min),
        None => true,
    }
}

/// FNV-1a: a hash that stays the same across Rust releases, unlike std's.
fn fnv1a(bytes: impl IntoIterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whether a game is held out: decided by its start and moves alone, so the same game is on the
/// same side wherever it stands in whichever file, and so are its copies.
pub fn is_held_out(game: &Game, seed: u64, share: f64) -> bool {
    if share <= 0.0 {
        return false;
    }
    let mut h = fnv1a(to_fen(&game.start).into_bytes(), 0xcbf2_9ce4_8422_2325);
    for m in &game.moves {
        h = fnv1a(m.bytes().chain([b' ']), h);
    }
    Rng::new(seed, h).next_f64() < share
}

pub fn phase_of(pos: &Chess) -> Phase {
    let plies = 2 * (pos.fullmoves().get() - 1) + u32::from(pos.turn() == Color::Black);
    if pos.board().occupied().count() < ENDGAME_PIECES {
        Phase::Endgame
    } else if plies < OPENING_PLIES {
        Phase::Opening
    } else {
        Phase::Middlegame
    }
}

/// The plies a game's positions are taken after, ascending: `per_game` of them at random (by the seed
/// and the game's index, so a game's choice never depends on the games around it), or all.
pub fn chosen_plies(game: &Game, cfg: &SampleConfig) -> Vec<usize> {
    let mut plies: Vec<usize> = (cfg.min_ply..=game.moves.len()).collect();
    if let Some(k) = cfg.per_game.filter(|&k| k < plies.len()) {
        let mut rng = Rng::new(cfg.seed, game.index as u64);
        for i in 0..k {
            let j = i + rng.below(plies.len() - i);
            plies.swap(i, j);
        }
        plies.truncate(k);
        plies.sort_unstable();
    }
    plies
}

/// Replays a game, calling `visit` with each position and the plies played to reach it.
fn replay(game: &Game, mut visit: impl FnMut(usize, &Chess)) {
    let mut pos = game.start.clone();
    visit(0, &pos);
    for (i, text) in game.moves.iter().enumerate() {
        let m = legal_move(&pos, text).expect("pgn gives legal moves only");
        pos.play_unchecked(m);
        visit(i + 1, &pos);
    }
}

/// The positions of a game after the given plies (ascending).
pub fn game_positions(game: &Game, plies: &[usize]) -> Vec<GamePosition> {
    let mut out = Vec::with_capacity(plies.len());
    let mut wanted = plies.iter().peekable();
    let moves: Arc<[String]> = game.moves.as_slice().into();
    replay(game, |ply, pos| {
        if wanted.next_if_eq(&&ply).is_some() {
            out.push(GamePosition {
                fen: to_fen(pos),
                moves: moves.clone(),
                mv: game.moves.get(ply).cloned(),
                phase: phase_of(pos),
                game: game.index,
                ply,
                source: game.source.clone(),
                line: game.line,
                key: position_key(pos),
            });
        }
    });
    out
}

/// Samples positions from games as they are read.
pub fn sample_positions(
    games: impl IntoIterator<Item = Result<Game, PgnError>>,
    cfg: &SampleConfig,
) -> Result<Sample, PgnError> {
    let mut sample = Sample::default();
    let mut kept: HashSet<u128> = HashSet::new();
    // Every position of every training game, whether sampled or not: a held-out position must be new to training.
    let mut in_training: HashSet<u128> = HashSet::new();
    for item in games {
        if cfg.max_games.is_some_and(|n| sample.stats.games >= n)
            || cfg.max_positions.is_some_and(|n| sample.positions.len() >= n)
        {
            break;
        }
        let game = match item {
            Ok(game) => game,
            Err(PgnError::Game(e)) if cfg.skip_bad => {
                sample.stats.games += 1;
                sample.stats.bad.note(&e);
                continue;
            }
            Err(e) => return Err(e),
        };
        sample.stats.games += 1;
        if !wanted(&game, cfg) {
            sample.stats.filtered += 1;
            continue;
        }
        let positions = game_positions(&game, &chosen_plies(&game, cfg));
        if is_held_out(&game, cfg.seed, cfg.held_out) {
            sample.stats.held_out_games += 1;
            sample.held_out.extend(positions);
            continue;
        }
        if cfg.held_out > 0.0 {
            replay(&game, |_, pos| {
                in_training.insert(position_key(pos));
            });
        }
        for p in positions {
            if !cfg.dedup || kept.insert(p.key) {
                sample.positions.push(p);
            } else {
                sample.stats.duplicates += 1;
            }
        }
    }
    if let Some(n) = cfg.max_positions {
        sample.positions.truncate(n);
    }
    // Held-out games may come before the training games they share positions with: settled at the end.
    let before = sample.held_out.len();
    let mut seen = HashSet::new();
    sample.held_out.retain(|p| !in_training.contains(&p.key) && (!cfg.dedup || seen.insert(p.key)));
    sample.stats.duplicates += before - sample.held_out.len();
    Ok(sample)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;
    use crate::history::check_history;
    use crate::pgn::read_text;

    const GAMES: &str = "\
[Event \"Blitz\"]\n[WhiteElo \"2100\"]\n[BlackElo \"1900\"]\n[TimeControl \"300+3\"]\n\n\
1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. Ba4 Nf6 5. O-O Be7 6. Re1 b5 7. Bb3 d6 8. c3 O-O 1/2-1/2\n\n\
[Event \"Bullet\"]\n[WhiteElo \"1500\"]\n[BlackElo \"1600\"]\n[TimeControl \"60+0\"]\n\n\
1. Nf3 Nf6 2. Ng1 Ng8 3. e4 e5 4. d4 exd4 5. c3 dxc3 6. Nxc3 *\n\n\
[Event \"Correspondence\"]\n[TimeControl \"-\"]\n\n\
1. d4 d5 2. c4 e6 3. Nc3 Nf6 4. Bg5 Be7 0-1\n\n\
[Event \"Endgame study\"]\n[FEN \"8/8/8/4k3/8/8/4P3/4K3 w - - 0 60\"]\n[SetUp \"1\"]\n\n\
60. e4 Kd4 61. e5 Kxe5 *\n";

    fn games(text: &str) -> Vec<Game> {
        read_text(text, "games.pgn").map(Result::unwrap).collect()
    }

    fn sample(cfg: &SampleConfig) -> Sample {
        sample_positions(read_text(GAMES, "games.pgn"), cfg).unwrap()
    }

    fn all() -> SampleConfig {
        SampleConfig { dedup: false, ..Default::default() }
    }

    #[test]
    fn every_position_with_its_history_and_next_move() {
        let s = sample(&all());
        assert_eq!(s.positions.len(), 17 + 12 + 9 + 5);
        let first = &s.positions[0];
        assert_eq!(first.fen, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1");
        assert_eq!((first.ply, first.mv.as_deref(), first.phase), (0, Some("e2e4"), Phase::Opening));
        let castled = &s.positions[16];
        assert_eq!(castled.fen, "r1bq1rk1/2p1bppp/p1np1n2/1p2p3/4P3/1BP2N2/PP1P1PPP/RNBQR1K1 w - - 1 9");
        assert_eq!((castled.ply, castled.mv.as_deref(), castled.phase), (16, None, Phase::Middlegame));
        assert_eq!(castled.history().last().map(String::as_str), Some("e8g8"));
        // The knights' dance resets the halfmove clock only at e4, and the fullmove number runs on.
        let danced = &s.positions[17 + 4];
        assert_eq!(danced.fen, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 4 3");
        let study: Vec<&GamePosition> = s.positions.iter().filter(|p| p.game == 3).collect();
        assert_eq!(study[0].fen, "8/8/8/4k3/8/8/4P3/4K3 w - - 0 60");
        assert_eq!(study[0].history(), Vec::<String>::new());
        assert_eq!(study[4].fen, "8/8/8/4k3/8/8/8/4K3 w - - 0 62");
        assert_eq!(study[4].history(), ["e2e4", "e5d4", "e4e5", "d4e5"]);
        assert!(study.iter().all(|p| p.phase == Phase::Endgame && &*p.source == "games.pgn" && p.line == 20));
    }

    #[test]
    fn histories_replay_to_their_positions() {
        for p in sample(&all()).positions {
            let pos = parse_fen(&p.fen).unwrap();
            assert_eq!(check_history(&pos, p.history()), Ok(()), "{}", p.fen);
            let g = &games(GAMES)[p.game];
            let mut replayed = g.start.clone();
            for m in p.history() {
                let m = legal_move(&replayed, m).unwrap();
                replayed.play_unchecked(m);
            }
            assert_eq!(to_fen(&replayed), p.fen);
            if let Some(m) = &p.mv {
                assert!(legal_move(&pos, m).is_some());
            }
        }
    }

    #[test]
    fn en_passant_square_only_when_a_capture_can_use_it() {
        let g = &games("1. e4 d5 2. e5 f5 3. d4 *")[0];
        let fens: Vec<String> = game_positions(g, &[1, 4, 5]).into_iter().map(|p| p.fen).collect();
        assert_eq!(fens, [
            "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
            "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
            "rnbqkbnr/ppp1p1pp/8/3pPp2/3P4/8/PPP2PPP/RNBQKBNR b KQkq - 0 3",
        ]);
    }

    #[test]
    fn per_game_sampling_and_min_ply_are_seeded() {
        let cfg = SampleConfig { per_game: Some(3), min_ply: 2, seed: 9, ..all() };
        let s = sample(&cfg);
        assert_eq!(s.positions.len(), 3 * 4);
        assert!(s.positions.iter().all(|p| p.ply >= 2));
        assert_eq!(s.positions, sample(&cfg).positions);
        assert_ne!(s.positions, sample(&SampleConfig { seed: 10, ..cfg.clone() }).positions);
        // A game's choice is its own: reading it alone picks the same plies.
        let alone = games(GAMES).pop().unwrap();
        assert_eq!(chosen_plies(&alone, &cfg), s.positions[9..].iter().map(|p| p.ply).collect::<Vec<_>>());
        let short = SampleConfig { per_game: Some(100), ..cfg };
        assert_eq!(sample(&short).positions.len(), 15 + 10 + 7 + 3);
    }

    #[test]
    fn duplicates_are_dropped_whatever_their_counters() {
        let s = sample(&SampleConfig::default());
        // Every game but the study starts at the start; the bullet game's knights go back to it (counters 4 3)
        // and it goes on 3. e4 e5 as the first game began.
        assert_eq!(s.stats.duplicates, 5);
        assert_eq!(s.positions.len(), 43 - 5);
        let keys: HashSet<u128> = s.positions.iter().map(|p| p.key).collect();
        assert_eq!(keys.len(), s.positions.len());
        let fens: HashSet<String> =
            s.positions.iter().map(|p| p.fen.split(' ').take(4).collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(fens.len(), s.positions.len(), "the key is position_key's: the FEN less its counters");
    }

    #[test]
    fn rating_and_time_control_filters() {
        let games_of = |cfg: SampleConfig| {
            let s = sample(&cfg);
            let mut g: Vec<usize> = s.positions.iter().map(|p| p.game).collect();
            g.dedup();
            (g, s.stats.filtered)
        };
        assert_eq!(games_of(SampleConfig { min_elo: Some(1800), ..all() }), (vec![0], 3));
        assert_eq!(games_of(SampleConfig { max_elo: Some(1600), ..all() }), (vec![1], 3));
        assert_eq!(games_of(SampleConfig { min_elo: Some(1500), max_elo: Some(2100), ..all() }), (vec![0, 1], 2));
        assert_eq!(games_of(SampleConfig { min_base_seconds: Some(180), ..all() }), (vec![0], 3));
        assert_eq!(games_of(SampleConfig { min_base_seconds: Some(60), ..all() }), (vec![0, 1], 2));
        assert_eq!(base_seconds("300+3"), Some(300));
        assert_eq!(base_seconds("40/7200:3600"), Some(7200));
        assert_eq!(base_seconds("600"), Some(600));
        assert_eq!(base_seconds("-"), None);
        assert_eq!(base_seconds("?"), None);
    }

    #[test]
    fn held_out_games_share_no_position_with_training_games() {
        let mut text = String::new();
        // Transpositions on purpose: the same few opening moves in several orders.
        let lines = ["1. e4 e5 2. Nf3 Nc6 3. Bc4", "1. Nf3 Nc6 2. e4 e5 3. Bb5", "1. d4 d5 2. c4 e6 3. Nc3",
                     "1. c4 e6 2. d4 d5 3. Nf3", "1. e4 c5 2. Nf3 d6 3. d4", "1. Nf3 d6 2. e4 c5 3. c3"];
        for round in 0..20 {
            for l in lines {
                text.push_str(&format!("[Round \"{round}\"]\n\n{l} {} *\n\n", ["a6", "h6", "a5", "h5"][round % 4]));
            }
        }
        let cfg = SampleConfig { held_out: 0.3, seed: 5, ..Default::default() };
        let s = sample_positions(read_text(&text, "t.pgn"), &cfg).unwrap();
        assert!(s.stats.held_out_games > 10 && s.stats.held_out_games < 110, "{:?}", s.stats);
        assert!(!s.held_out.is_empty());
        let all_games = games(&text);
        let held: HashSet<usize> = s.held_out.iter().map(|p| p.game).collect();
        let trained: HashSet<usize> = s.positions.iter().map(|p| p.game).collect();
        assert!(held.is_disjoint(&trained));
        let mut training_keys = HashSet::new();
        for g in all_games.iter().filter(|g| !is_held_out(g, 5, 0.3)) {
            replay(g, |_, pos| {
                training_keys.insert(position_key(pos));
            });
        }
        assert!(s.held_out.iter().all(|p| !training_keys.contains(&p.key)));
        // Identical games fall on the same side.
        for g in &all_games {
            let twin = all_games.iter().find(|o| o.moves == g.moves && o.index != g.index).unwrap();
            assert_eq!(is_held_out(g, 5, 0.3), is_held_out(twin, 5, 0.3));
        }
        assert!(all_games.iter().all(|g| !is_held_out(g, 5, 0.0)));
    }

    #[test]
    fn bad_games_fail_or_are_counted() {
        let text = format!("{GAMES}\n[Event \"bad\"]\n\n1. e4 e5 2. Ke3 *\n\n1. Nf9 *\n\n[FEN \"bad\"]\n\n*\n\n1. d4 *\n");
        let err = sample_positions(read_text(&text, "g.pgn"), &all()).unwrap_err().to_string();
        assert!(err.starts_with("g.pgn:26: game 5: move 2 \"Ke3\" (line 28) is not legal in "), "{err}");
        let s = sample_positions(read_text(&text, "g.pgn"), &SampleConfig { skip_bad: true, ..all() }).unwrap();
        let reasons = &s.stats.bad.reasons;
        assert_eq!((s.stats.games, s.stats.bad.count, reasons.len()), (8, 3, 3));
        assert!(reasons[1].starts_with("g.pgn:30: game 6: move 1 \"Nf9\""), "{reasons:?}");
        assert!(reasons[2].starts_with("g.pgn:32: game 7: its FEN header \"bad\""), "{reasons:?}");
        assert_eq!(s.positions.last().map(|p| (p.game, p.ply)), Some((7, 1)));
    }

    #[test]
    fn a_game_s_positions_share_its_moves() {
        let g = &games("1. Nf3 Nf6 2. Ng1 Ng8 3. e4 *")[0];
        let positions = game_positions(g, &chosen_plies(g, &all()));
        assert!(positions.windows(2).all(|w| Arc::ptr_eq(&w[0].moves, &w[1].moves)));
        assert_eq!(positions[3].history(), ["g1f3", "g8f6", "f3g1"]);
        assert_eq!(positions[5].history().len(), 5);
    }

    #[test]
    fn bounds_past_any_header_keep_or_leave_every_game() {
        let wide = SampleConfig { max_elo: Some(Threshold::MAX), per_game: Some(usize::MAX), ..all() };
        assert_eq!(sample(&wide).stats.filtered, 2);
        let none = SampleConfig { min_elo: Some(Threshold::MAX), ..all() };
        assert_eq!(sample(&none).stats.filtered, 4);
        let none = SampleConfig { min_base_seconds: Some(Threshold::MAX), ..all() };
        assert_eq!(sample(&none).stats.filtered, 4);
        assert!(sample(&SampleConfig { min_ply: usize::MAX, ..all() }).positions.is_empty());
    }

    #[test]
    fn limits_stop_early() {
        let s = sample(&SampleConfig { max_games: Some(2), ..all() });
        assert_eq!((s.stats.games, s.positions.len()), (2, 17 + 12));
        let s = sample(&SampleConfig { max_positions: Some(20), ..all() });
        assert_eq!((s.stats.games, s.positions.len()), (2, 20));
    }
}
