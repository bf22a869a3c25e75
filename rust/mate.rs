//! Mate in one: the moves that checkmate at once, and positions that have at least one.
//!
//! Puzzle positions come from semi-random games, each with its own taste for checks, captures
//! and plain chance. Each game also draws where it starts looking (at once after a prefix of an
//! opening line, after some plies, or once trades have reached an endgame), so that the puzzles
//! are not all early middlegames; the first position from there whose side to move can mate is
//! the puzzle. Position `i` of a seed depends only on `(seed, i)`, as in `generate`.

use rayon::prelude::*;
use shakmaty::{Chess, Move, Position};

use crate::env::game_end;
use crate::fen::to_fen;
use crate::generate::{development_weight, trading_weight, value, ENDGAME_PIECES};
use crate::moves::{legal_move, uci};
use crate::openings::OPENING_LINES;
use crate::rng::Rng;

/// A game that has found no puzzle after this many plies is given up for a fresh one.
pub const MAX_PLIES: usize = 300;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MateInOne {
    /// In python-chess `board.fen()` form; the game is not over.
    pub fen: String,
    /// Every move from the start position to this one, oldest first, in UCI.
    pub history: Vec<String>,
    /// Every move that mates, in UCI, sorted.
    pub mates: Vec<String>,
}

/// The legal moves after which the opponent is checkmated.
pub fn mating_moves(pos: &Chess) -> Vec<Move> {
    pos.legal_moves().into_iter().filter(|m| reply(pos, *m).mate).collect()
}

/// What a move does to the opponent; one play answers both, for the generator's weights and its stop.
struct Reply {
    check: bool,
    mate: bool,
}

fn reply(pos: &Chess, m: Move) -> Reply {
    let mut child = pos.clone();
    child.play_unchecked(m);
    let check = child.is_check();
    // Only a check can mate, and generating the evasions is the costly part.
    Reply { check, mate: check && child.legal_moves().is_empty() }
}

pub fn mate_in_one_positions(n: usize, seed: u64, start: u64) -> Vec<MateInOne> {
    (0..n as u64).into_par_iter().map(|i| mate_in_one_position(seed, start.wrapping_add(i))).collect()
}

pub fn mate_in_one_position(seed: u64, index: u64) -> MateInOne {
    let mut rng = Rng::new(seed, index);
    loop {
        if let Some(puzzle) = play_until_mate(&mut rng) {
            return puzzle;
        }
    }
}

/// Where a game starts looking for a mate.
#[derive(Clone, Copy)]
enum Lookout {
    Now,
    FromPly(usize),
    /// Once fewer than `ENDGAME_PIECES` pieces remain; until then the game trades pieces off.
    Endgame,
}

/// How one game plays once it is looking. Games differ so that the puzzles do: how often a move
/// is anything at all, how much checks appeal, and how much captures do. Capture-shy games keep
/// the material that mates; capture-happy ones drift into bare-king draws.
struct Style {
    random_share: f64,
    check_bonus: f64,
    capture_scale: f64,
}

impl Style {
    fn draw(rng: &mut Rng) -> Style {
        Style {
            random_share: 0.5 * rng.next_f64(),
            check_bonus: [0.0, 3.0, 10.0][rng.below(3)],
            capture_scale: [0.5, 0.0, -0.5][rng.below(3)],
        }
    }

    fn weight(&self, pos: &Chess, m: Move, check: bool) -> f64 {
        // development_weight counts the captured piece's value once; rescale that share.
        let captured = m.capture().map_or(0.0, value);
        let w = (development_weight(pos, m) + (self.capture_scale - 1.0) * captured).max(0.05);
        if check { w + self.check_bonus } else { w }
    }
}

/// One game; `None` when it ends, or runs past `MAX_PLIES`, before a puzzle turns up.
fn play_until_mate(rng: &mut Rng) -> Option<MateInOne> {
    let mut pos = Chess::default();
    let mut history = Vec::new();
    let x = rng.next_f64();
    let lookout = if x < 0.25 {
        let line: Vec<&str> = OPENING_LINES[rng.below(OPENING_LINES.len())].split(' ').collect();
        for text in &line[..rng.between(0, line.len())] {
            let m = legal_move(&pos, text)?;
            history.push(uci(m));
            pos.play_unchecked(m);
        }
        Lookout::Now
    } else if x < 0.75 {
        Lookout::FromPly(rng.between(12, 60))
    } else {
        Lookout::Endgame
    };
    let style = Style::draw(rng);
    while history.len() < MAX_PLIES && game_end(&pos).is_none() {
        let moves = pos.legal_moves();
        let looking = match lookout {
            Lookout::Now => true,
            Lookout::FromPly(ply) => history.len() >= ply,
            Lookout::Endgame => pos.board().occupied().count() < ENDGAME_PIECES,
        };
        let uniform = rng.next_f64() < style.random_share;
        let m = if looking {
            let replies: Vec<Reply> = moves.iter().map(|m| reply(&pos, *m)).collect();
            if replies.iter().any(|r| r.mate) {
                let mut mates: Vec<String> =
                    moves.iter().zip(&replies).filter(|(_, r)| r.mate).map(|(m, _)| uci(*m)).collect();
                mates.sort();
                return Some(MateInOne { fen: to_fen(&pos), history, mates });
            }
            let weights: Vec<f64> = moves
                .iter()
                .zip(&replies)
                .map(|(m, r)| if uniform { 1.0 } else { style.weight(&pos, *m, r.check) })
                .collect();
            moves[rng.weighted(&weights)]
        } else {
            // Before the lookout only the chosen move is played out: a mate there would end the
            // game meant to reach it, so it is set aside and another drawn.
            let base: fn(&Chess, Move) -> f64 =
                if matches!(lookout, Lookout::Endgame) { trading_weight } else { development_weight };
            let mut weights: Vec<f64> = moves.iter().map(|m| if uniform { 1.0 } else { base(&pos, *m) }).collect();
            loop {
                if weights.iter().all(|w| *w == 0.0) {
                    return None;
                }
                let i = rng.weighted(&weights);
                if !reply(&pos, moves[i]).mate {
                    break moves[i];
                }
                weights[i] = 0.0;
            }
        };
        history.push(uci(m));
        pos.play_unchecked(m);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;

    fn mates_of(fen: &str) -> Vec<String> {
        let mut mates: Vec<String> = mating_moves(&parse_fen(fen).unwrap()).into_iter().map(uci).collect();
        mates.sort();
        mates
    }

    #[test]
    fn known_mates() {
        // Back-rank mate.
        assert_eq!(mates_of("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"), ["a1a8"]);
        // Scholar's mate: the bishop on c4 guards f7, nothing black can take the queen there.
        assert_eq!(mates_of("r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR w KQkq - 2 3"), ["f3f7"]);
        // Two rooks, two mates; Rh1+ lets the king out to g8.
        assert_eq!(mates_of("7k/8/6K1/8/8/8/8/RR6 w - - 0 1"), ["a1a8", "b1b8"]);
        // Black mates too, here by promoting (to a queen or a rook alike).
        assert_eq!(mates_of("8/8/8/8/8/k7/p4PPP/6K1 b - - 0 1"), ["a2a1q", "a2a1r"]);
    }

    #[test]
    fn no_mate_from_the_start_or_in_a_finished_game() {
        assert!(mating_moves(&Chess::default()).is_empty());
        // Black is already mated: no legal moves at all.
        assert!(mates_of("R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1").is_empty());
    }

    #[test]
    fn puzzles_are_unfinished_replayable_and_have_exactly_their_mates() {
        let puzzles = mate_in_one_positions(300, 11, 0);
        let (mut white, mut endgames) = (0, 0);
        for p in &puzzles {
            let pos = parse_fen(&p.fen).unwrap();
            assert!(game_end(&pos).is_none(), "{}", p.fen);
            assert!(!p.mates.is_empty());
            assert!(p.mates.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates: {:?}", p.mates);
            assert_eq!(mates_of(&p.fen), p.mates);
            let mut replay = Chess::default();
            for text in &p.history {
                replay.play_unchecked(legal_move(&replay, text).unwrap());
            }
            assert_eq!(to_fen(&replay), p.fen);
            white += usize::from(pos.turn().is_white());
            endgames += usize::from(pos.board().occupied().count() < ENDGAME_PIECES);
        }
        assert!((90..=210).contains(&white), "{white} of 300 with white to move");
        let mut fens: Vec<&str> = puzzles.iter().map(|p| p.fen.as_str()).collect();
        fens.sort_unstable();
        fens.dedup();
        assert!(fens.len() >= 290, "{} distinct", fens.len());
        assert!(endgames >= 30, "{endgames} endgames");
        assert!(puzzles.iter().any(|p| p.mates.len() >= 2));
    }

    #[test]
    fn same_seed_same_puzzles_whatever_the_chunking() {
        let whole = mate_in_one_positions(40, 3, 0);
        let mut chunked = mate_in_one_positions(15, 3, 0);
        chunked.extend(mate_in_one_positions(25, 3, 15));
        assert_eq!(whole, chunked);
        assert_eq!(mate_in_one_position(3, 17), whole[17]);
        assert_ne!(whole, mate_in_one_positions(40, 4, 0));
    }

    /// `cargo test --release --lib -- --ignored --nocapture puzzle_speed`
    #[test]
    #[ignore]
    fn puzzle_speed() {
        let n = 20_000;
        let t = std::time::Instant::now();
        let puzzles = mate_in_one_positions(n, 1, 0);
        let secs = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let single: Vec<MateInOne> = (0..2000).map(|i| mate_in_one_position(2, i)).collect();
        let single_rate = single.len() as f64 / t.elapsed().as_secs_f64();
        let plies: usize = puzzles.iter().map(|p| p.history.len()).sum();
        let (mut mates, mut pieces) = (std::collections::BTreeMap::new(), [0usize; 4]);
        let mut white = 0;
        for p in &puzzles {
            *mates.entry(p.mates.len()).or_insert(0) += 1;
            let pos = parse_fen(&p.fen).unwrap();
            let bucket = match pos.board().occupied().count() {
                0..=13 => 0,
                14..=21 => 1,
                22..=27 => 2,
                _ => 3,
            };
            pieces[bucket] += 1;
            white += usize::from(pos.turn().is_white());
        }
        println!(
            "{n} puzzles in {secs:.2}s: {:.0}/s on {} threads ({single_rate:.0}/s on one); mean {:.1} plies; \
             white to move {white}; pieces <14, 14-21, 22-27, 28+: {pieces:?}; by number of mates {mates:?}",
            n as f64 / secs,
            rayon::current_num_threads(),
            plies as f64 / n as f64,
        );
    }
}
