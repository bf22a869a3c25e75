//! Moves as a person types them: UCI or SAN in, SAN out as python-chess's `board.san()` writes it.
//!
//! Reading is lenient where a person's intent is plain and python-chess's `parse_san` is too: a
//! check or mate suffix is ignored whether or not it is right, castling may be written with zeros,
//! the `=` of a promotion may be left out, squares may be joined by `-`, and an `x` that is
//! missing or wrong is forgiven (`Nf3` for `Nxf3`, `ed5` for `exd5`). A pawn move without a file
//! stays a push, so `e5` never means a capture on e5.

use std::fmt;

use shakmaty::san::{San, SanPlus};
use shakmaty::uci::UciMove;
use shakmaty::{CastlingSide, Chess, Move, Position, Role};

use crate::moves::legal_move;

/// Why a text names no move in a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveError {
    /// Neither UCI nor SAN.
    NotAMove,
    /// Not UCI, where only UCI is read.
    NotUci,
    /// Well-formed, but no legal move here fits.
    Illegal,
    /// SAN that fits several legal moves: these, in SAN, sorted.
    Ambiguous(Vec<String>),
}

impl fmt::Display for MoveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoveError::NotAMove => f.write_str("not a move in UCI or SAN"),
            MoveError::NotUci => f.write_str("not a move in UCI"),
            MoveError::Illegal => f.write_str("illegal move in this position"),
            MoveError::Ambiguous(moves) => write!(f, "ambiguous move ({})", moves.join(", ")),
        }
    }
}

impl std::error::Error for MoveError {}

/// The legal move that `text` names in UCI or SAN.
pub fn parse_move(pos: &Chess, text: &str) -> Result<Move, MoveError> {
    let text = text.trim();
    if let Some(m) = legal_move(pos, text) {
        return Ok(m);
    }
    match read_san(text) {
        Some(san) => resolve(pos, san),
        None if is_uci(text) => Err(MoveError::Illegal),
        None => Err(MoveError::NotAMove),
    }
}

/// The legal move that `text` names in UCI, for callers that take nothing else.
pub fn parse_uci(pos: &Chess, text: &str) -> Result<Move, MoveError> {
    match legal_move(pos, text) {
        Some(m) => Ok(m),
        None if is_uci(text) => Err(MoveError::Illegal),
        None => Err(MoveError::NotUci),
    }
}

/// A legal move in SAN with its `+` or `#`, exactly as python-chess's `board.san()` writes it.
pub fn san(pos: &Chess, m: Move) -> String {
    SanPlus::from_move(pos.clone(), m).to_string()
}

fn is_uci(text: &str) -> bool {
    matches!(UciMove::from_ascii(text.as_bytes()), Ok(UciMove::Normal { .. }))
}

/// SAN in any of the spellings the module accepts; `None` for anything else, drops and null moves included.
fn read_san(text: &str) -> Option<San> {
    let body = text.strip_suffix(['+', '#']).unwrap_or(text);
    match body {
        "O-O" | "0-0" => return Some(San::Castle(CastlingSide::KingSide)),
        "O-O-O" | "0-0-0" => return Some(San::Castle(CastlingSide::QueenSide)),
        _ => {}
    }
    let mut ascii: Vec<u8> = body.bytes().filter(|b| *b != b'-').collect();
    if let [.., b'1' | b'8', piece] = ascii[..] {
        if b"QRBNqrbn".contains(&piece) {
            ascii.insert(ascii.len() - 1, b'=');
        }
    }
    match San::from_ascii(&ascii).ok()? {
        san @ San::Normal { .. } => Some(san),
        _ => None,
    }
}

fn resolve(pos: &Chess, san: San) -> Result<Move, MoveError> {
    let legal = pos.legal_moves();
    let fitting = |san: San| -> Vec<Move> { legal.iter().copied().filter(|m| san.matches(*m)).collect() };
    let mut found = fitting(san);
    if found.is_empty() {
        if let Some(forgiven) = other_capture_flag(san) {
            found = fitting(forgiven);
        }
    }
    match found[..] {
        [] => Err(MoveError::Illegal),
        [m] => Ok(m),
        _ => {
            let mut names: Vec<String> = found.iter().map(|m| san_without_suffix(pos, *m)).collect();
            names.sort();
            Err(MoveError::Ambiguous(names))
        }
    }
}

/// The same SAN with its capture mark toggled, except for a pawn move without a file: with the
/// mark it could be a capture from either side, which the text did not say.
fn other_capture_flag(san: San) -> Option<San> {
    match san {
        San::Normal { role, file, rank, capture, to, promotion } if role != Role::Pawn || file.is_some() => {
            Some(San::Normal { role, file, rank, capture: !capture, to, promotion })
        }
        _ => None,
    }
}

fn san_without_suffix(pos: &Chess, m: Move) -> String {
    San::from_move(pos, m).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;
    use crate::moves::uci;

    fn uci_of(fen: &str, text: &str) -> Result<String, MoveError> {
        parse_move(&parse_fen(fen).unwrap(), text).map(uci)
    }

    fn san_of(fen: &str, text: &str) -> String {
        let pos = parse_fen(fen).unwrap();
        san(&pos, legal_move(&pos, text).unwrap())
    }

    const START: &str = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1";
    const CASTLES: &str = "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1";
    const PROMOTES: &str = "8/4P3/8/8/8/8/k7/4K3 w - - 0 1";
    const SCHOLAR: &str = "r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR w KQkq - 2 3";

    #[test]
    fn uci_and_san_from_the_start() {
        for (text, want) in [
            ("e2e4", "e2e4"), ("e4", "e2e4"), ("Pe4", "e2e4"), ("e2-e4", "e2e4"),
            ("Nf3", "g1f3"), ("  Nf3 ", "g1f3"), ("Ng1f3", "g1f3"), ("Ng1-f3", "g1f3"),
        ] {
            assert_eq!(uci_of(START, text).as_deref(), Ok(want), "{text}");
        }
        assert_eq!(san_of(START, "e2e4"), "e4");
        assert_eq!(san_of(START, "g1f3"), "Nf3");
    }

    #[test]
    fn castling() {
        for (text, want) in [
            ("O-O", "e1g1"), ("0-0", "e1g1"), ("O-O+", "e1g1"), ("e1g1", "e1g1"), ("e1h1", "e1g1"),
            ("O-O-O", "e1c1"), ("0-0-0", "e1c1"),
        ] {
            assert_eq!(uci_of(CASTLES, text).as_deref(), Ok(want), "{text}");
        }
        assert_eq!(san_of(CASTLES, "e1g1"), "O-O");
        assert_eq!(san_of(CASTLES, "e1c1"), "O-O-O");
        assert_eq!(uci_of("r3k2r/8/8/8/8/8/8/R3K2R w - - 0 1", "O-O"), Err(MoveError::Illegal));
        // Black castles long with check: the rook lands on d8 facing the king on d1.
        assert_eq!(san_of("r3k3/8/8/8/8/8/8/3K4 b q - 0 1", "e8c8"), "O-O-O+");
    }

    #[test]
    fn promotion() {
        for (text, want) in [
            ("e8=Q", "e7e8q"), ("e8Q", "e7e8q"), ("e8=q", "e7e8q"), ("e7e8Q", "e7e8q"),
            ("e8=N", "e7e8n"), ("e8N", "e7e8n"), ("e7e8r", "e7e8r"),
        ] {
            assert_eq!(uci_of(PROMOTES, text).as_deref(), Ok(want), "{text}");
        }
        assert_eq!(uci_of(PROMOTES, "e8"), Err(MoveError::Illegal), "a promotion must name its piece");
        assert_eq!(uci_of(PROMOTES, "e7e8"), Err(MoveError::Illegal));
        assert_eq!(san_of(PROMOTES, "e7e8q"), "e8=Q");
        assert_eq!(san_of(PROMOTES, "e7e8r"), "e8=R");
        // A knight on e8 checks a king on d6.
        assert_eq!(san_of("8/4P3/3k4/8/8/8/8/4K3 w - - 0 1", "e7e8n"), "e8=N+");
    }

    #[test]
    fn ambiguity_and_disambiguation() {
        let two_knights = "4k3/8/8/8/8/5N2/8/1N2K3 w - - 0 1";
        assert_eq!(uci_of(two_knights, "Nd2"), Err(MoveError::Ambiguous(vec!["Nbd2".into(), "Nfd2".into()])));
        assert_eq!(MoveError::Ambiguous(vec!["Nbd2".into(), "Nfd2".into()]).to_string(), "ambiguous move (Nbd2, Nfd2)");
        assert_eq!(uci_of(two_knights, "Nbd2").as_deref(), Ok("b1d2"));
        assert_eq!(uci_of(two_knights, "Nfd2").as_deref(), Ok("f3d2"));
        assert_eq!(uci_of(two_knights, "N1d2").as_deref(), Ok("b1d2"));
        assert_eq!(san_of(two_knights, "b1d2"), "Nbd2");
        assert_eq!(san_of(two_knights, "b1c3"), "Nc3");
        // Same file: the rank tells them apart.
        let two_rooks = "4k3/8/R7/8/8/8/8/R3K3 w - - 0 1";
        assert_eq!(san_of(two_rooks, "a1a3"), "R1a3");
        assert_eq!(uci_of(two_rooks, "R6a3").as_deref(), Ok("a6a3"));
        // Three queens: only file and rank together single one out.
        let queens = "7k/8/8/8/Q1Q5/8/Q7/4K3 w - - 0 1";
        assert_eq!(san_of(queens, "a4b3"), "Qa4b3");
        assert_eq!(uci_of(queens, "Qa4b3").as_deref(), Ok("a4b3"));
        // A pinned knight does not make the other one ambiguous.
        assert_eq!(san_of("4k3/4r3/8/8/8/5N2/4N3/4K3 w - - 0 1", "f3d4"), "Nd4");
    }

    #[test]
    fn check_and_mate_suffixes() {
        assert_eq!(san_of(SCHOLAR, "f3f7"), "Qxf7#");
        assert_eq!(san_of(SCHOLAR, "c4f7"), "Bxf7+");
        for text in ["Qxf7", "Qxf7#", "Qxf7+", "Qf7", "Qf3xf7", "f3f7"] {
            assert_eq!(uci_of(SCHOLAR, text).as_deref(), Ok("f3f7"), "{text}");
        }
    }

    #[test]
    fn capture_marks_are_forgiven_but_pawn_pushes_stay_pushes() {
        let pos = "rnbqkbnr/ppp1pppp/8/3p4/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2";
        assert_eq!(uci_of(pos, "exd5").as_deref(), Ok("e4d5"));
        assert_eq!(uci_of(pos, "ed5").as_deref(), Ok("e4d5"));
        assert_eq!(uci_of(pos, "d5"), Err(MoveError::Illegal));
        assert_eq!(uci_of(pos, "e5").as_deref(), Ok("e4e5"));
        assert_eq!(uci_of(START, "Nxf3").as_deref(), Ok("g1f3"));
        // En passant.
        let ep = "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3";
        assert_eq!(uci_of(ep, "exf6").as_deref(), Ok("e5f6"));
        assert_eq!(san_of(ep, "e5f6"), "exf6");
    }

    #[test]
    fn errors_say_why() {
        for text in ["", "hello", "0000", "--", "Z0", "N@f3", "e2e9", "nf3", "O-O-O-O", "e4!!", "é4"] {
            assert_eq!(uci_of(START, text), Err(MoveError::NotAMove), "{text:?}");
        }
        for text in ["Ke2", "e5", "e2e5", "O-O", "Nf6", "g1g3", "Qxd7"] {
            assert_eq!(uci_of(START, text), Err(MoveError::Illegal), "{text:?}");
        }
        let pos = Chess::default();
        assert_eq!(parse_uci(&pos, "e2e4").map(uci).as_deref(), Ok("e2e4"));
        assert_eq!(parse_uci(&pos, "e2e5"), Err(MoveError::Illegal));
        assert_eq!(parse_uci(&pos, "e4"), Err(MoveError::NotUci));
    }

    #[test]
    fn every_legal_move_round_trips() {
        let cfg = crate::generate::GeneratorConfig::default();
        let mut moves = 0;
        for p in crate::generate::generate_positions(200, 5, 0, &cfg) {
            let pos = parse_fen(&p.fen).unwrap();
            for m in pos.legal_moves() {
                let written = san(&pos, m);
                assert_eq!(parse_move(&pos, &written), Ok(m), "{written} in {}", p.fen);
                assert_eq!(parse_move(&pos, &uci(m)), Ok(m));
                moves += 1;
            }
        }
        assert!(moves > 4000);
    }
}
