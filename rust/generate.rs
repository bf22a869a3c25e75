//! Training positions: deterministic for a seed, legal and unfinished, each with the moves
//! that led to it (for A: histories) and a move to play in it (for the A: task).
//!
//! Position `i` of a seed depends only on `(seed, i)`, so batches can be generated in parallel,
//! in chunks, or resumed part-way, and always agree.

use shakmaty::{Chess, Color, Move, Position, Rank, Role, Square};

use crate::env::game_end;
use crate::moves::{legal_move, uci};
use crate::openings::OPENING_LINES;
use crate::a_text::env_prompt;
use crate::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Opening,
    Middlegame,
    Endgame,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Opening => "opening",
            Phase::Middlegame => "middlegame",
            Phase::Endgame => "endgame",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorConfig {
    pub opening_share: f64,
    pub endgame_share: f64,
    /// Share of A: moves that are well-formed but illegal (the real data has about 0.15%).
    pub illegal_share: f64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig { opening_share: 0.2, endgame_share: 0.2, illegal_share: 0.01 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedPosition {
    /// In python-chess `board.fen()` form.
    pub fen: String,
    /// Every move from the start position to this one, oldest first.
    pub history: Vec<String>,
    /// The move for an A: task: usually legal, sometimes a well-formed illegal one.
    pub mv: String,
    pub phase: Phase,
}

impl GeneratedPosition {
    pub fn env_prompt(&self) -> String {
        env_prompt(&self.fen, &self.mv, &self.history)
    }
}

pub const MIDDLEGAME_PLIES: (usize, usize) = (8, 20);
/// Endgames have fewer pieces than this on the board, kings included.
pub const ENDGAME_PIECES: usize = 14;
const MAX_ENDGAME_PLIES: usize = 400;

pub fn generate_positions(n: usize, seed: u64, start: u64, cfg: &GeneratorConfig) -> Vec<GeneratedPosition> {
    use rayon::prelude::*;
    (0..n as u64).into_par_iter().map(|i| generate_position(seed, start + i, cfg)).collect()
}

pub fn generate_position(seed: u64, index: u64, cfg: &GeneratorConfig) -> GeneratedPosition {
    let mut rng = Rng::new(seed, index);
    let x = rng.next_f64();
    let phase = if x < cfg.opening_share {
        Phase::Opening
    } else if x < cfg.opening_share + cfg.endgame_share {
        Phase::Endgame
    } else {
        Phase::Middlegame
    };
    let game = loop {
        let attempt = match phase {
            Phase::Opening => opening(&mut rng),
            Phase::Middlegame => middlegame(&mut rng),
            Phase::Endgame => endgame(&mut rng),
        };
        if let Some(game) = attempt.filter(|g| game_end(&g.pos).is_none()) {
            break game;
        }
    };
    let mv = if rng.next_f64() < cfg.illegal_share {
        illegal_move(&game.pos, &mut rng)
    } else if rng.next_f64() < 0.5 {
        uci(pick(&game.pos, &mut rng, development_weight))
    } else {
        let moves = game.pos.legal_moves();
        uci(moves[rng.below(moves.len())])
    };
    GeneratedPosition { fen: crate::fen::to_fen(&game.pos), history: game.history, mv, phase }
}

struct Game {
    pos: Chess,
    history: Vec<String>,
}

impl Game {
    fn new() -> Game {
        Game { pos: Chess::default(), history: Vec::new() }
    }

    fn play(&mut self, m: Move) {
        self.history.push(uci(m));
        self.pos.play_unchecked(m);
    }
}

fn opening(rng: &mut Rng) -> Option<Game> {
    let line: Vec<&str> = OPENING_LINES[rng.below(OPENING_LINES.len())].split(' ').collect();
    let plies = rng.between(0, line.len());
    let mut game = Game::new();
    for text in &line[..plies] {
        let m = legal_move(&game.pos, text)?;
        game.play(m);
    }
    Some(game)
}

fn middlegame(rng: &mut Rng) -> Option<Game> {
    let plies = rng.between(MIDDLEGAME_PLIES.0, MIDDLEGAME_PLIES.1);
    let mut game = Game::new();
    for _ in 0..plies {
        if game_end(&game.pos).is_some() {
            return None;
        }
        let m = pick(&game.pos, rng, development_weight);
        game.play(m);
    }
    Some(game)
}

/// Capture-hungry play from the start until few pieces remain, then a few quieter moves.
fn endgame(rng: &mut Rng) -> Option<Game> {
    let mut game = Game::new();
    while game.pos.board().occupied().count() >= ENDGAME_PIECES {
        if game.history.len() >= MAX_ENDGAME_PLIES || game_end(&game.pos).is_some() {
            return None;
        }
        let m = pick(&game.pos, rng, trading_weight);
        game.play(m);
    }
    for _ in 0..rng.between(0, 6) {
        if game_end(&game.pos).is_some() {
            return None;
        }
        let m = pick(&game.pos, rng, development_weight);
        game.play(m);
    }
    Some(game)
}

/// A legal move drawn in proportion to `weight`. The position must have legal moves.
fn pick(pos: &Chess, rng: &mut Rng, weight: fn(&Chess, Move) -> f64) -> Move {
    let moves = pos.legal_moves();
    let weights: Vec<f64> = moves.iter().map(|m| weight(pos, *m)).collect();
    moves[rng.weighted(&weights)]
}

pub(crate) fn value(role: Role) -> f64 {
    match role {
        Role::Pawn => 1.0,
        Role::Knight | Role::Bishop => 3.0,
        Role::Rook => 5.0,
        Role::Queen => 9.0,
        Role::King => 0.0,
    }
}

fn relative_rank(sq: Square, color: Color) -> Rank {
    if color == Color::White { sq.rank() } else { sq.rank().flip_vertical() }
}

fn attacked_by_enemy_pawn(pos: &Chess, sq: Square) -> bool {
    let board = pos.board();
    (board.attacks_to(sq, !pos.turn(), board.occupied()) & board.pawns()).any()
}

/// Plausible play: centre control, development, castling, captures; few king walks,
/// early queen sorties or pieces left where a pawn takes them.
pub(crate) fn development_weight(pos: &Chess, m: Move) -> f64 {
    let to = m.to();
    let (file, rank) = (to.file().to_u32() as i32, to.rank().to_u32() as i32);
    let mut w = 1.0;
    if (3..=4).contains(&file) && (3..=4).contains(&rank) {
        w += 3.0;
    } else if (2..=5).contains(&file) && (2..=5).contains(&rank) {
        w += 1.5;
    }
    if let Some(captured) = m.capture() {
        w += value(captured);
    }
    let from_back_rank = m.from().is_some_and(|sq| relative_rank(sq, pos.turn()) == Rank::First);
    match m.role() {
        Role::Knight | Role::Bishop if from_back_rank => w += 3.0,
        Role::King if m.is_castle() => w += 6.0,
        Role::King => w *= 0.15,
        Role::Queen if pos.fullmoves().get() < 8 => w *= 0.3,
        Role::Pawn if matches!(file, 0 | 1 | 6 | 7) => w *= 0.5,
        _ => {}
    }
    if m.role() != Role::Pawn && attacked_by_enemy_pawn(pos, to) {
        w *= 0.15;
    }
    w
}

pub(crate) fn trading_weight(pos: &Chess, m: Move) -> f64 {
    match m.capture() {
        Some(captured) => 20.0 + 4.0 * value(captured),
        None => development_weight(pos, m),
    }
}

/// A move in valid UCI that is not legal here: mostly a piece of the side to move sent
/// somewhere it cannot go, as a confused model would write it.
fn illegal_move(pos: &Chess, rng: &mut Rng) -> String {
    let board = pos.board();
    let ours: Vec<Square> = board.by_color(pos.turn()).into_iter().collect();
    loop {
        let from = ours[rng.below(ours.len())];
        let to = Square::new(rng.below(64) as u32);
        if to == from {
            continue;
        }
        let mut text = format!("{from}{to}");
        let promoting = board.role_at(from) == Some(Role::Pawn) && relative_rank(to, pos.turn()) == Rank::Eighth;
        if promoting {
            text.push('q');
        }
        if legal_move(pos, &text).is_none() {
            return text;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;

    #[test]
    fn every_opening_line_is_legal() {
        for line in OPENING_LINES {
            let mut pos = Chess::default();
            for text in line.split(' ') {
                let m = legal_move(&pos, text).unwrap_or_else(|| panic!("{text} illegal in {line}"));
                pos.play_unchecked(m);
            }
        }
    }

    #[test]
    fn positions_are_legal_unfinished_and_replayable() {
        let cfg = GeneratorConfig { illegal_share: 0.1, ..Default::default() };
        let positions = generate_positions(600, 42, 0, &cfg);
        let mut illegal = 0;
        for p in &positions {
            let pos = parse_fen(&p.fen).unwrap();
            assert!(game_end(&pos).is_none(), "{}", p.fen);
            let mut replay = Chess::default();
            for text in &p.history {
                replay.play_unchecked(legal_move(&replay, text).unwrap());
            }
            assert_eq!(crate::fen::to_fen(&replay), p.fen);
            if legal_move(&pos, &p.mv).is_none() {
                illegal += 1;
                assert!(p.mv.len() == 4 || p.mv.len() == 5);
            }
            match p.phase {
                Phase::Middlegame => assert!((8..=20).contains(&p.history.len())),
                Phase::Endgame => assert!(pos.board().occupied().count() < ENDGAME_PIECES),
                Phase::Opening => {}
            }
        }
        assert!((30..=100).contains(&illegal), "{illegal} illegal moves");
        let count = |ph| positions.iter().filter(|p| p.phase == ph).count();
        assert!((80..=160).contains(&count(Phase::Opening)));
        assert!((280..=440).contains(&count(Phase::Middlegame)));
        assert!((80..=160).contains(&count(Phase::Endgame)));
    }

    #[test]
    fn same_seed_same_positions_whatever_the_chunking() {
        let cfg = GeneratorConfig::default();
        let whole = generate_positions(50, 7, 0, &cfg);
        let mut chunked = generate_positions(20, 7, 0, &cfg);
        chunked.extend(generate_positions(30, 7, 20, &cfg));
        assert_eq!(whole, chunked);
        assert_ne!(whole, generate_positions(50, 8, 0, &cfg));
    }
}
