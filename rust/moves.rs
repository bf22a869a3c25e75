//! Legal moves in UCI, and the legality of a UCI string.
//!
//! A move is legal exactly when python-chess's `Move.from_uci(text) in board.legal_moves` holds:
//! its text is the UCI of a legal move, promotions in lower case. Castling may be written as the
//! king's two-square step (`e1g1`, what `legal_uci_moves` lists) or as king-takes-rook (`e1h1`),
//! which python-chess also accepts in standard chess.

use shakmaty::uci::UciMove;
use shakmaty::{CastlingMode, Chess, Move, Position};

pub fn uci(m: Move) -> String {
    m.to_uci(CastlingMode::Standard).to_string()
}

pub fn legal_uci_moves(pos: &Chess) -> Vec<String> {
    pos.legal_moves().into_iter().map(uci).collect()
}

/// The legal move that `text` names, or `None` for anything else (illegal, malformed, other notation).
pub fn legal_move(pos: &Chess, text: &str) -> Option<Move> {
    // shakmaty's parser is laxer than python-chess (upper-case promotions): only lower case passes.
    if !(4..=5).contains(&text.len()) || text.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let parsed = UciMove::from_ascii(text.as_bytes()).ok()?;
    let m = parsed.to_move(pos).ok()?;
    // to_move also reads king-takes-rook castling; python-chess accepts both spellings, nothing else.
    let exact = m.to_uci(CastlingMode::Standard) == parsed || (m.is_castle() && m.to_uci(CastlingMode::Chess960) == parsed);
    exact.then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;

    #[test]
    fn twenty_moves_from_the_start() {
        let moves = legal_uci_moves(&Chess::default());
        assert_eq!(moves.len(), 20);
        assert!(moves.contains(&"g1f3".to_string()));
    }

    #[test]
    fn castling_in_both_notations_python_chess_accepts() {
        let pos = parse_fen("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1").unwrap();
        for text in ["e1g1", "e1c1", "e1h1", "e1a1"] {
            assert!(legal_move(&pos, text).is_some_and(|m| m.is_castle()), "{text}");
        }
        assert_eq!(legal_move(&pos, "e1h1"), legal_move(&pos, "e1g1"));
        assert!(!legal_uci_moves(&pos).contains(&"e1h1".to_string()), "listed in standard notation only");
        // Without the right, neither spelling castles (e1h1 would be the king taking its own rook).
        let pos = parse_fen("r3k2r/8/8/8/8/8/8/R3K2R w Qkq - 0 1").unwrap();
        assert!(legal_move(&pos, "e1g1").is_none());
        assert!(legal_move(&pos, "e1h1").is_none());
    }

    #[test]
    fn promotions_lower_case_only() {
        let pos = parse_fen("8/4P3/8/8/8/8/k7/4K3 w - - 0 1").unwrap();
        assert!(legal_move(&pos, "e7e8q").is_some());
        assert!(legal_move(&pos, "e7e8n").is_some());
        assert!(legal_move(&pos, "e7e8Q").is_none());
        assert!(legal_move(&pos, "e7e8").is_none());
        assert!(legal_move(&pos, "e7e8k").is_none());
    }

    #[test]
    fn garbage_is_not_a_move() {
        let pos = Chess::default();
        for text in ["", "0000", "e2e4 ", " e2e4", "e2e9", "zzzz", "e2e4e4", "é2e4", "e2e2", "P@e4"] {
            assert!(legal_move(&pos, text).is_none(), "{text:?}");
        }
    }
}
