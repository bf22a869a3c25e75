//! The history that comes with a position (UCI moves before it, oldest first), checked as far as
//! it can be without the start position.
//!
//! Every entry must be a UCI move some piece could make on an empty board (python-chess's syntax,
//! promotions in lower case, from the 7th to the 8th rank or the 2nd to the 1st), and the last one
//! must have been played by the side not to move into this position: its square of departure is
//! empty, its destination holds the mover's piece (the promoted piece for a promotion, the king
//! on g/c for castling written king-takes-rook), and that piece has a way there (its kind of move,
//! the squares between as empty then as they are now). The A: prompt shows the history to the model; a
//! history that does not lead to the position teaches it nonsense.

use std::fmt;

use shakmaty::uci::UciMove;
use shakmaty::{Chess, Color, File, Position, Rank, Role, Square};

use crate::fen::echoed;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryError {
    /// Entry `index` (1-based, oldest first) is not UCI.
    NotUci { index: usize, text: String },
    /// Entry `index` is UCI that no piece could ever play.
    Impossible { index: usize, text: String, why: &'static str },
    /// The last entry does not end in this position.
    LastMove { text: String, why: String },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::NotUci { index, text } => {
                write!(f, "history move {index} {} is not a UCI move (like e2e4 or e7e8q)", echoed(text))
            }
            HistoryError::Impossible { index, text, why } => write!(f, "history move {index} {} {why}", echoed(text)),
            HistoryError::LastMove { text, why } => {
                write!(f, "the last history move {} does not lead to this position: {why}", echoed(text))
            }
        }
    }
}

impl std::error::Error for HistoryError {}

/// `(from, to, promotion)` of a history entry.
type Step = (Square, Square, Option<Role>);

fn read_step(index: usize, text: &str) -> Result<Step, HistoryError> {
    let not_uci = || HistoryError::NotUci { index, text: text.to_string() };
    // shakmaty also reads upper-case promotions, `0000` and drops (`Q@e4`); python-chess none of them.
    if !(4..=5).contains(&text.len()) || text.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(not_uci());
    }
    let (from, to, promotion) = match UciMove::from_ascii(text.as_bytes()) {
        Ok(UciMove::Normal { from, to, promotion }) => (from, to, promotion),
        _ => return Err(not_uci()),
    };
    let impossible = |why| Err(HistoryError::Impossible { index, text: text.to_string(), why });
    let (df, dr) = (from.file().distance(to.file()), from.rank().distance(to.rank()));
    if from == to {
        return impossible("does not move (its squares are the same)");
    }
    let line = df == 0 || dr == 0 || df == dr;
    let knight = (df, dr) == (1, 2) || (df, dr) == (2, 1);
    if !line && !knight {
        return impossible("is no move any piece can make");
    }
    if let Some(role) = promotion {
        let white = from.rank() == Rank::Seventh && to.rank() == Rank::Eighth;
        let black = from.rank() == Rank::Second && to.rank() == Rank::First;
        if !(white || black) || df > 1 {
            return impossible("promotes without a pawn reaching the last rank");
        }
        if matches!(role, Role::King | Role::Pawn) {
            return impossible("promotes to a king or a pawn");
        }
    }
    Ok((from, to, promotion))
}

/// The square a castling king stands on after `from`-`to`, when `to` is its own rook's corner
/// (king-takes-rook, as python-chess accepts castling in standard chess).
fn castled_king(from: Square, to: Square) -> Option<Square> {
    if from.file() != File::E || from.rank() != to.rank() || !matches!(from.rank(), Rank::First | Rank::Eighth) {
        return None;
    }
    match to.file() {
        File::H => Some(Square::from_coords(File::G, to.rank())),
        File::A => Some(Square::from_coords(File::C, to.rank())),
        _ => None,
    }
}

fn colour(c: Color) -> &'static str {
    match c {
        Color::White => "white",
        Color::Black => "black",
    }
}

fn check_last(pos: &Chess, text: &str, (from, to, promotion): Step) -> Result<(), HistoryError> {
    let mover = !pos.turn();
    let board = pos.board();
    let last = |why: String| Err(HistoryError::LastMove { text: text.to_string(), why });
    let to_move = format!("{} is to move, so {} moved last", capital(colour(!mover)), colour(mover));
    // In standard chess nothing lands on the square a piece just left, castling included.
    if let Some(p) = board.piece_at(from) {
        return last(format!("{from} holds a {} {} ({to_move})", colour(p.color), role_name(p.role)));
    }
    let landed = match board.piece_at(to) {
        None => castled_king(from, to)
            .and_then(|k| board.piece_at(k).filter(|p| p.role == Role::King && p.color == mover).map(|_| k)),
        Some(p) if p.color == mover => Some(to),
        Some(_) => None,
    };
    let Some(square) = landed else {
        return last(format!("{to} holds no {} piece ({to_move})", colour(mover)));
    };
    if let Some(role) = promotion {
        if board.piece_at(square).map(|p| p.role) != Some(role) {
            return last(format!("{to} holds no {} {} though the move promotes to one", colour(mover), role_name(role)));
        }
    }
    let role = if promotion.is_some() { Role::Pawn } else { board.piece_at(square).map_or(Role::Pawn, |p| p.role) };
    match way_of(board, mover, role, from, to) {
        Ok(()) => Ok(()),
        Err(why) => last(format!("the {} {} on {square} could not have come from {from}: {why}", colour(mover),
                                 role_name(board.piece_at(square).map_or(role, |p| p.role)))),
    }
}

/// Whether a `role` of `mover` could have gone `from`-`to` into this board: its way, with the squares it passed
/// as they are now (only this one move has been made since, so whatever stands between stood there then).
fn way_of(board: &shakmaty::Board, mover: Color, role: Role, from: Square, to: Square) -> Result<(), String> {
    let (df, dr) = (from.file().distance(to.file()), from.rank().distance(to.rank()));
    let forward = if mover == Color::White { to.rank() > from.rank() } else { to.rank() < from.rank() };
    let home = if mover == Color::White { Rank::Second } else { Rank::Seventh };
    let back = if mover == Color::White { Rank::First } else { Rank::Eighth };
    let geometry = match role {
        Role::Knight => (df, dr) == (1, 2) || (df, dr) == (2, 1),
        Role::Bishop => df == dr,
        Role::Rook => df == 0 || dr == 0,
        Role::Queen => df == 0 || dr == 0 || df == dr,
        Role::Pawn => {
            forward && !matches!(from.rank(), Rank::First | Rank::Eighth)  // no pawn stands on either
                && ((df == 0 && (dr == 1 || (dr == 2 && from.rank() == home))) || (df == 1 && dr == 1))
        }
        Role::King => {
            let castling = castled_king(from, to).is_some() || (from.file() == File::E && from.rank() == back
                && to.rank() == back && matches!(to.file(), File::G | File::C));
            if castling && from.rank() == back {
                // The rook castling took lands beside the king: f1 (f8) after O-O, d1 (d8) after O-O-O.
                let rook_file = if matches!(to.file(), File::G | File::H) { File::F } else { File::D };
                let rook = Square::from_coords(rook_file, back);
                return match board.piece_at(rook) {
                    Some(p) if p.role == Role::Rook && p.color == mover => Ok(()),
                    _ => Err(format!("castling puts its rook on {rook}, which holds none")),
                };
            }
            df <= 1 && dr <= 1
        }
    };
    if !geometry {
        return Err(format!("a {} does not move so", role_name(role)));
    }
    if role == Role::Knight {
        return Ok(());
    }
    let between = shakmaty::attacks::between(from, to);
    match between.into_iter().find(|&sq| board.piece_at(sq).is_some()) {
        Some(sq) => Err(format!("{sq} is in the way")),
        None => Ok(()),
    }
}

fn capital(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Pawn => "pawn",
        Role::Knight => "knight",
        Role::Bishop => "bishop",
        Role::Rook => "rook",
        Role::Queen => "queen",
        Role::King => "king",
    }
}

/// Checks `history` (UCI moves before `pos`, oldest first) as far as it can be without the game's start.
pub fn check_history<S: AsRef<str>>(pos: &Chess, history: &[S]) -> Result<(), HistoryError> {
    let mut last = None;
    for (i, text) in history.iter().enumerate() {
        last = Some((text.as_ref(), read_step(i + 1, text.as_ref())?));
    }
    match last {
        Some((text, step)) => check_last(pos, text, step),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fen::parse_fen;

    fn check(fen: &str, history: &[&str]) -> Result<(), String> {
        check_history(&parse_fen(fen).unwrap(), history).map_err(|e| e.to_string())
    }

    const AFTER_E4: &str = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1";

    #[test]
    fn a_history_that_leads_to_the_position_passes() {
        assert_eq!(check(AFTER_E4, &["e2e4"]), Ok(()));
        assert_eq!(check(AFTER_E4, &[]), Ok(()));
        let after_e4_e5 = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2";
        assert_eq!(check(after_e4_e5, &["e2e4", "e7e5"]), Ok(()));
    }

    #[test]
    fn the_last_move_must_be_the_side_not_to_move_s() {
        // White to move, yet the history ends with White's e2e4: e4 holds a white pawn but e2 is the wrong side's.
        let after_e4_e5 = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2";
        assert_eq!(
            check(after_e4_e5, &["e2e4"]),
            Err("the last history move \"e2e4\" does not lead to this position: e4 holds no black piece \
                 (White is to move, so black moved last)".into())
        );
        // The destination is empty.
        assert!(check(AFTER_E4, &["e2d3"]).unwrap_err().contains("d3 holds no white piece"));
        // The square it left is still occupied.
        assert!(check(AFTER_E4, &["e2e4", "g1f3"]).is_err());
        assert!(check(AFTER_E4, &["f1e2"]).unwrap_err().contains("f1 holds a white bishop"));
    }

    #[test]
    fn castling_in_either_spelling_and_promotion_to_the_right_piece() {
        let castled = "r3k2r/8/8/8/8/8/8/R4RK1 b kq - 1 1";
        assert_eq!(check(castled, &["e1g1"]), Ok(()));
        assert_eq!(check(castled, &["e1h1"]), Ok(()));
        assert!(check(castled, &["e1c1"]).is_err());
        let black_castled = "2kr3r/8/8/8/8/8/8/R3K2R w KQ - 1 2";
        assert_eq!(check(black_castled, &["e8c8"]), Ok(()));
        assert_eq!(check(black_castled, &["e8a8"]), Ok(()));
        let promoted = "4Q3/8/8/8/8/8/k7/4K3 b - - 0 1";
        assert_eq!(check(promoted, &["e7e8q"]), Ok(()));
        assert!(check(promoted, &["e7e8n"]).unwrap_err().contains("e8 holds no white knight"));
        let captured_promoting = "3N4/8/8/8/8/8/k7/4K3 b - - 0 1";
        assert_eq!(check(captured_promoting, &["e7d8n"]), Ok(()));
    }

    #[test]
    fn the_piece_that_landed_must_have_a_way_from_where_it_left() {
        let castled = "rnbqkbnr/pppppppp/8/8/8/5NP1/PPPPPPBP/RNBQ1RK1 b kq - 3 4";
        for (bad, why) in [
            ("h1f1", "the white rook on f1 could not have come from h1: g1 is in the way"),
            ("b3b1", "the white knight on b1 could not have come from b3: a knight does not move so"),
            ("d3f1", "the white rook on f1 could not have come from d3: a rook does not move so"),
            ("d3b3", "b3 holds no white piece"),
            ("e4g3", "the white pawn on g3 could not have come from e4: a pawn does not move so"),
            ("g4g3", "the white pawn on g3 could not have come from g4: a pawn does not move so"),
        ] {
            let msg = check(castled, &[bad]).unwrap_err();
            assert!(msg.contains(why), "{bad}: {msg}");
        }
        for good in ["e1g1", "e1h1", "c3b1", "h1g1", "e1f1", "a3b1", "e5f3"] {
            assert_eq!(check(castled, &[good]), Ok(()), "{good}");
        }
        // Pawns: forward only, two squares from home with the square between empty, one diagonally.
        assert_eq!(check(AFTER_E4, &["e3e4"]), Ok(()));
        assert!(check(AFTER_E4, &["e5e4"]).unwrap_err().contains("a pawn does not move so"));
        assert!(check(AFTER_E4, &["e6e4"]).unwrap_err().contains("a pawn does not move so"));
        assert!(check(AFTER_E4, &["f3e4"]).is_ok() && check(AFTER_E4, &["g2e4"]).is_err());
        // Castling's rook must stand beside its king.
        assert!(check("r3k2r/8/8/8/8/8/8/R5K1 b kq - 1 1", &["e1g1"]).unwrap_err().contains("f1, which holds none"));
    }

    #[test]
    fn every_entry_must_be_a_move_some_piece_can_make() {
        for (bad, why) in [
            ("e2e9", "is not a UCI move"),
            ("E2E4", "is not a UCI move"),
            ("e7e8Q", "is not a UCI move"),
            ("0000", "is not a UCI move"),
            ("Q@e4", "is not a UCI move"),
            ("e2e4,", "is not a UCI move"),
            ("e2e2", "does not move"),
            ("a1c4", "is no move any piece can make"),
            ("e2e4q", "promotes without a pawn reaching the last rank"),
            ("a7c8q", "promotes without a pawn reaching the last rank"),
            ("e7e8k", "promotes to a king or a pawn"),
        ] {
            let msg = check(AFTER_E4, &[bad, "e2e4"]).unwrap_err();
            assert!(msg.starts_with(&format!("history move 1 {bad:?} ")) && msg.contains(why), "{bad}: {msg}");
        }
        for good in ["g1f3", "a1h8", "h2h1", "b2a1q", "e7e8n"] {
            assert_eq!(check(AFTER_E4, &[good, "e2e4"]), Ok(()), "{good}");
        }
    }

    #[test]
    fn an_entry_is_quoted_at_most_to_the_echo_limit() {
        let msg = check(AFTER_E4, &[&"e2e4".repeat(250_000), "e2e4"]).unwrap_err();
        assert!(msg.len() < 160 && msg.contains("e2e4e2e4...\" is not a UCI move"), "{msg}");
    }

    #[test]
    fn generated_positions_and_their_histories_agree() {
        for p in crate::generate::generate_positions(300, 7, 0, &Default::default()) {
            assert_eq!(check(&p.fen, &p.history.iter().map(String::as_str).collect::<Vec<_>>()), Ok(()), "{}", p.fen);
        }
        for p in crate::mate::mate_in_one_positions(100, 7, 0) {
            assert_eq!(check(&p.fen, &p.history.iter().map(String::as_str).collect::<Vec<_>>()), Ok(()), "{}", p.fen);
        }
    }
}
