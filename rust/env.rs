//! The A: environment: one move applied to a position, as the RookWorld data generator did it
//! with python-chess.

use std::fmt;

use shakmaty::{Chess, Position};

use crate::fen::to_fen;
use crate::moves::legal_move;

/// python-chess's `is_seventyfive_moves()`: 150 half-moves without a capture or pawn move.
pub const SEVENTY_FIVE_MOVE_HALFMOVES: u32 = 150;

/// The reward the environment gives the mover. Its text is a Python float, as in the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reward {
    Legal,
    Win,
    Draw,
    Illegal,
}

impl Reward {
    pub fn as_str(self) -> &'static str {
        match self {
            Reward::Legal => "0.001",
            Reward::Win => "1.0",
            Reward::Draw => "0.5",
            Reward::Illegal => "-1.0",
        }
    }

    pub fn value(self) -> f64 {
        match self {
            Reward::Legal => 0.001,
            Reward::Win => 1.0,
            Reward::Draw => 0.5,
            Reward::Illegal => -1.0,
        }
    }
}

/// How a game ended, as python-chess's `outcome(claim_draw=False)` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GameEnd {
    Checkmate,
    Stalemate,
    InsufficientMaterial,
    SeventyFiveMoves,
}

/// `None` while the game goes on. shakmaty's own `outcome()` lacks the 75-move rule.
pub fn game_end(pos: &Chess) -> Option<GameEnd> {
    let has_moves = !pos.legal_moves().is_empty();
    if !has_moves && pos.is_check() {
        Some(GameEnd::Checkmate)
    } else if pos.is_insufficient_material() {
        Some(GameEnd::InsufficientMaterial)
    } else if !has_moves {
        Some(GameEnd::Stalemate)
    } else if pos.halfmoves() >= SEVENTY_FIVE_MOVE_HALFMOVES {
        Some(GameEnd::SeventyFiveMoves)
    } else {
        None
    }
}

/// The result of one A: step. Only the fields the data has; an illegal move is the one case
/// with `truncated`, so the flags cannot contradict the reward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub fen: String,
    pub reward: Reward,
}

impl Transition {
    pub fn terminated(&self) -> bool {
        matches!(self.reward, Reward::Win | Reward::Draw)
    }

    pub fn truncated(&self) -> bool {
        self.reward == Reward::Illegal
    }
}

impl Transition {
    /// Appends the A: target text to `out`.
    pub fn write_target(&self, out: &mut String) {
        out.push_str(&self.fen);
        out.push('+');
        out.push_str(self.reward.as_str());
        out.push_str(if self.terminated() { "+1" } else { "+0" });
        out.push_str(if self.truncated() { "+1" } else { "+0" });
    }
}

/// The A: target text: `{new_fen}+{reward}+{terminated}+{truncated}`.
impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}+{}+{}+{}",
            self.fen,
            self.reward.as_str(),
            u8::from(self.terminated()),
            u8::from(self.truncated())
        )
    }
}

/// Plays `mv` (UCI text) in `pos`. Anything that is not a legal move leaves the board as it was.
pub fn step(pos: &Chess, mv: &str) -> Transition {
    let Some(m) = legal_move(pos, mv) else {
        return Transition { fen: to_fen(pos), reward: Reward::Illegal };
    };
    let mut next = pos.clone();
    next.play_unchecked(m);
    let reward = match game_end(&next) {
        None => Reward::Legal,
        Some(GameEnd::Checkmate) => Reward::Win,
        Some(_) => Reward::Draw,
    };
    Transition { fen: to_fen(&next), reward }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;

    fn target(fen: &str, mv: &str) -> String {
        step(&parse_fen(fen).unwrap(), mv).to_string()
    }

    #[test]
    fn first_move_of_a_game() {
        assert_eq!(
            target("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4"),
            "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
        );
    }

    #[test]
    fn real_sample_from_the_data() {
        assert_eq!(
            target("8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31", "a6a5"),
            "8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0"
        );
    }

    #[test]
    fn checkmate_wins() {
        // Fool's mate.
        assert_eq!(
            target("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", "d8h4"),
            "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3+1.0+1+0"
        );
    }

    #[test]
    fn stalemate_and_insufficient_material_draw() {
        assert_eq!(target("7k/8/5KQ1/8/8/8/8/8 w - - 0 1", "g6g5"), "7k/8/5K2/6Q1/8/8/8/8 b - - 1 1+0.001+0+0");
        assert_eq!(target("7k/8/5K2/6Q1/8/8/8/8 w - - 0 1", "g5g6"), "7k/8/5KQ1/8/8/8/8/8 b - - 1 1+0.5+1+0");
        assert_eq!(target("7k/8/5K2/8/8/8/8/6n1 w - - 0 1", "f6g5"), "7k/8/8/6K1/8/8/8/6n1 b - - 1 1+0.5+1+0");
    }

    #[test]
    fn seventy_five_move_rule() {
        assert_eq!(target("7k/8/5K2/8/8/8/8/R7 w - - 149 120", "a1a2"), "7k/8/5K2/8/8/8/R7/8 b - - 150 120+0.5+1+0");
        assert_eq!(target("7k/8/5K2/8/8/8/P7/R7 w - - 149 120", "a2a3"), "7k/8/5K2/8/8/P7/8/R7 b - - 0 120+0.001+0+0");
    }

    #[test]
    fn illegal_moves_leave_the_board_and_truncate() {
        let start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1";
        for mv in ["e2e5", "e7e5", "", "hello", "e1g1", "e1h1"] {
            assert_eq!(target(start, mv), format!("{start}+-1.0+0+1"));
        }
    }

    #[test]
    fn en_passant_square_only_when_capturable() {
        assert_eq!(
            target("4k3/8/8/3p4/8/8/4P3/4K3 w - - 0 1", "e2e4"),
            "4k3/8/8/3p4/4P3/8/8/4K3 b - - 0 1+0.001+0+0"
        );
        assert_eq!(
            target("4k3/8/8/8/3p4/8/4P3/4K3 w - - 0 1", "e2e4"),
            "4k3/8/8/8/3pP3/8/8/4K3 b - e3 0 1+0.001+0+0"
        );
    }
}
