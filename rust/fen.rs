//! FEN parsing and writing, matching python-chess.
//!
//! python-chess's `Board(fen)` splits on whitespace, accepts 1 to 6 fields and silently drops
//! castling rights and en-passant squares that the position cannot have; `board.fen()` then
//! prints the en-passant square only when an en-passant capture is legal. We do the same, and
//! reject everything python-chess's `is_valid()` would (missing kings, pawns on the back rank,
//! the side not to move in check, impossible checks).

use std::fmt;

use shakmaty::fen::{Epd, Fen, ParseFenError};
use shakmaty::{CastlingMode, Chess, EnPassantMode, Position, PositionError, PositionErrorKinds};

/// Why a FEN was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenError {
    Empty,
    TooManyFields(usize),
    /// A character python-chess would not accept in a standard FEN (shakmaty's variant syntax).
    BadCharacter(char),
    /// The board field is not 8 ranks of 8 squares; says which rank and why.
    BadBoard(String),
    /// A move counter so large that playing on would overflow it (python-chess would keep counting).
    CounterTooLarge(&'static str),
    Syntax(ParseFenError),
    IllegalPosition(PositionErrorKinds),
}

impl fmt::Display for FenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenError::Empty => f.write_str("empty FEN"),
            FenError::TooManyFields(n) => write!(f, "FEN has {n} fields, at most 6 expected"),
            FenError::BadCharacter(c) => write!(f, "unexpected character {c:?} in FEN"),
            FenError::BadBoard(why) => write!(f, "invalid board part in FEN: {why}"),
            FenError::CounterTooLarge(which) => {
                write!(f, "{which} in FEN is too large (at most {MAX_COUNTER}: no game is that long)")
            }
            FenError::Syntax(e) => e.fmt(f),
            FenError::IllegalPosition(kinds) => {
                let reasons = [
                    (PositionErrorKinds::EMPTY_BOARD, "empty board"),
                    (PositionErrorKinds::MISSING_KING, "missing king"),
                    (PositionErrorKinds::TOO_MANY_KINGS, "too many kings"),
                    (PositionErrorKinds::PAWNS_ON_BACKRANK, "pawns on the back rank"),
                    (PositionErrorKinds::OPPOSITE_CHECK, "the side not to move is in check"),
                    (PositionErrorKinds::IMPOSSIBLE_CHECK, "impossible check"),
                    (PositionErrorKinds::VARIANT, "not standard chess"),
                ];
                let named: Vec<&str> =
                    reasons.iter().filter(|(k, _)| kinds.contains(*k)).map(|(_, s)| *s).collect();
                write!(f, "illegal position: {}", if named.is_empty() { "unknown reason".into() } else { named.join(", ") })
            }
        }
    }
}

impl std::error::Error for FenError {}

const MAX_FIELDS: usize = 6;
/// The largest halfmove clock and fullmove number a FEN may give. The 75-move and fivefold-repetition rules end
/// every game within 8,848.5 moves, so no position of a real game, nor a study's, numbers anywhere near a million;
/// and a game set up at a million can be played on for over four billion moves before shakmaty's u32 counters
/// would overflow (a counter near u32::MAX was accepted, then the position a few moves on was refused, so a
/// game served from it could neither go on nor end).
pub const MAX_COUNTER: u64 = 1_000_000;

/// The most characters of input an error quotes back, as UCI's `ECHO_LIMIT` (rookworld.lm.uci): a message about a
/// megabyte of input stays one readable line.
pub const ECHO_LIMIT: usize = 80;

/// `text` quoted for a message (as `{:?}`), cut to `ECHO_LIMIT` characters with an ellipsis when it was longer.
pub fn echoed(text: &str) -> String {
    match text.char_indices().nth(ECHO_LIMIT) {
        Some((end, _)) => format!("{:?}", format!("{}...", &text[..end])),
        None => format!("{text:?}"),
    }
}

/// Parses a FEN as python-chess does and returns a legal standard-chess position.
pub fn parse_fen(text: &str) -> Result<Chess, FenError> {
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    if fields.is_empty() {
        return Err(FenError::Empty);
    }
    if fields.len() > MAX_FIELDS {
        return Err(FenError::TooManyFields(fields.len()));
    }
    // shakmaty also reads crazyhouse pockets, three-check counters and '_' separators.
    if let Some(c) = text.chars().find(|c| matches!(c, '[' | ']' | '_' | '+' | '~')) {
        return Err(FenError::BadCharacter(c));
    }
    check_board(fields[0])?;
    for (i, which) in [(4, "halfmove clock"), (5, "fullmove number")] {
        let digits = fields.get(i).filter(|f| f.bytes().all(|b| b.is_ascii_digit()));
        if digits.is_some_and(|f| f.trim_start_matches('0').len() > 10 || f.parse::<u64>().is_ok_and(|n| n > MAX_COUNTER)) {
            return Err(FenError::CounterTooLarge(which));
        }
    }
    // shakmaty splits on single spaces; most FENs already are, and need no copy.
    let canonical = !text.starts_with(' ') && !text.ends_with(' ') && !text.contains("  ")
        && !text.bytes().any(|b| b.is_ascii_whitespace() && b != b' ');
    let fen = if canonical {
        Fen::from_ascii(text.as_bytes())
    } else {
        Fen::from_ascii(fields.join(" ").as_bytes())
    }
    .map_err(FenError::Syntax)?;
    let lenient = PositionErrorKinds::INVALID_CASTLING_RIGHTS
        | PositionErrorKinds::INVALID_EP_SQUARE
        | PositionErrorKinds::TOO_MUCH_MATERIAL;
    match fen.into_position::<Chess>(CastlingMode::Standard) {
        Ok(pos) => Ok(pos),
        Err(err) if lenient.contains(err.kinds()) => Ok(recover(err)),
        Err(err) => Err(FenError::IllegalPosition(err.kinds())),
    }
}

/// The board field as python-chess reads it: exactly 8 ranks of 8 squares, no two digits in a row.
///
/// shakmaty is more lenient: it reads a 9th field as a crazyhouse pocket and drops it (so
/// `.../4K3/Q` lost a queen without a word), and adds up adjacent digits (`44`). Its own error
/// does not say which rank is wrong; this one does.
fn check_board(board: &str) -> Result<(), FenError> {
    let bad = |why: String| Err(FenError::BadBoard(why));
    let ranks: Vec<&str> = board.split('/').collect();
    if ranks.len() != 8 {
        return bad(format!("{} ranks, a FEN has 8", ranks.len()));
    }
    for (i, rank) in ranks.iter().enumerate() {
        // The board field lists rank 8 first.
        let number = 8 - i;
        let shown = match rank.char_indices().nth(16) {
            Some((end, _)) => format!("{}...", &rank[..end]),
            None => rank.to_string(),
        };
        let mut squares = 0usize;
        let mut after_digit = false;
        for c in rank.chars() {
            match c {
                '1'..='8' if after_digit => return bad(format!("rank {number} ('{shown}'): two digits in a row")),
                '1'..='8' => {
                    squares += c as usize - '0' as usize;
                    after_digit = true;
                }
                'p' | 'n' | 'b' | 'r' | 'q' | 'k' | 'P' | 'N' | 'B' | 'R' | 'Q' | 'K' => {
                    squares += 1;
                    after_digit = false;
                }
                _ => return bad(format!("rank {number} ('{shown}'): unexpected character {c:?}")),
            }
        }
        if squares != 8 {
            return bad(format!("rank {number} ('{shown}') has {squares} squares, a rank has 8"));
        }
    }
    Ok(())
}

fn recover(err: PositionError<Chess>) -> Chess {
    err.ignore_invalid_castling_rights()
        .or_else(PositionError::ignore_invalid_ep_square)
        .or_else(PositionError::ignore_too_much_material)
        .expect("only recoverable kinds remain")
}

/// The position as python-chess's `board.fen()` prints it.
pub fn to_fen(pos: &Chess) -> String {
    let mut s = String::with_capacity(96);
    write_fen(pos, &mut s);
    s
}

/// Appends the FEN to `out` (no intermediate String).
///
/// Past `MAX_COUNTER` the counters stay at it, so that every FEN written here is one `parse_fen` reads: a game set
/// up at the limit is played on (with counters that counted on, its next position was refused, and the game could
/// neither go on nor end). python-chess counts on instead; no real game comes within a hundred times of the limit.
pub fn write_fen(pos: &Chess, out: &mut String) {
    use fmt::Write;
    Epd::from_position(pos, EnPassantMode::Legal).append_to_string(out);
    let halfmoves = u64::from(pos.halfmoves()).min(MAX_COUNTER);
    let fullmoves = u64::from(pos.fullmoves().get()).min(MAX_COUNTER);
    let _ = write!(out, " {halfmoves} {fullmoves}"); // writing to a String cannot fail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_start_position() {
        let start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1";
        assert_eq!(to_fen(&parse_fen(start).unwrap()), start);
    }

    #[test]
    fn fills_missing_fields_like_python_chess() {
        let pos = parse_fen("  8/8/8/8/8/8/8/K6k   b ").unwrap();
        assert_eq!(to_fen(&pos), "8/8/8/8/8/8/8/K6k b - - 0 1");
    }

    #[test]
    fn drops_an_en_passant_square_no_capture_can_use() {
        let pos = parse_fen("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1").unwrap();
        assert_eq!(to_fen(&pos), "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1");
    }

    #[test]
    fn drops_castling_rights_without_rook() {
        let pos = parse_fen("4k3/8/8/8/8/8/8/4K2R w KQ - 0 1").unwrap();
        assert_eq!(to_fen(&pos), "4k3/8/8/8/8/8/8/4K2R w K - 0 1");
    }

    #[test]
    fn rejects_bad_fens_with_reasons() {
        assert_eq!(parse_fen(""), Err(FenError::Empty));
        assert!(matches!(parse_fen("8/8/8/8/8/8/8/8 w - - 0 1"), Err(FenError::IllegalPosition(_))));
        assert!(matches!(parse_fen("rnbqkbnr/pppppppp/8/8 w"), Err(FenError::BadBoard(_))));
        assert!(matches!(parse_fen("8/8/8/8/8/8/8/K6k x"), Err(FenError::Syntax(_))));
        assert_eq!(parse_fen("a b c d e f g").unwrap_err(), FenError::TooManyFields(7));
        assert_eq!(parse_fen("7k/8/8/8/8/8/8/K7 w - - 4294967295 1"), Err(FenError::CounterTooLarge("halfmove clock")));
        assert_eq!(parse_fen("7k/8/8/8/8/8/8/K7 w - - 0 99999999999999999999"), Err(FenError::CounterTooLarge("fullmove number")));
        assert!(parse_fen("7k/8/8/8/8/8/8/K7 w - - 150 00000000000000001").is_ok());
        assert!(parse_fen("7k/8/8/8/8/8/8/K7 w - - 1000000 1000000").is_ok());
        // Accepted, this one overflowed a few moves later.
        assert_eq!(parse_fen("7k/8/8/8/8/8/8/K7 w - - 0 4294967294"), Err(FenError::CounterTooLarge("fullmove number")));
        assert_eq!(parse_fen("7k/8/8/8/8/8/8/K7 b - - 1000001 1"), Err(FenError::CounterTooLarge("halfmove clock")));
        let msg = parse_fen("8/8/8/8/8/8/8/K7 w - - 0 1").unwrap_err().to_string();
        assert!(msg.contains("missing king"), "{msg}");
    }

    #[test]
    fn a_game_from_the_largest_counters_plays_to_its_end() {
        use shakmaty::Position;
        let mut pos = parse_fen("7k/8/8/8/8/8/8/K7 w - - 999999 1000000").unwrap();
        // The kings walk to and fro for ten thousand moves, past where any game ends: the counters count on.
        for i in 0..20_000 {
            let mv = ["a1a2", "h8h7", "a2a1", "h7h8"][i % 4];
            pos.play_unchecked(crate::moves::legal_move(&pos, mv).unwrap());
        }
        // The position counts on; what is written stays at the limit, and reads back.
        assert_eq!((pos.halfmoves(), pos.fullmoves().get()), (1_019_999, 1_010_000));
        assert_eq!(to_fen(&pos), "7k/8/8/8/8/8/8/K7 w - - 1000000 1000000");
        assert_eq!(to_fen(&parse_fen(&to_fen(&pos)).unwrap()), to_fen(&pos));
    }

    #[test]
    fn echoed_input_is_cut_to_the_echo_limit() {
        assert_eq!(echoed("e2e4"), "\"e2e4\"");
        assert_eq!(echoed(&"x".repeat(80)), format!("{:?}", "x".repeat(80)));
        assert_eq!(echoed(&"é".repeat(1_000_000)), format!("\"{}...\"", "é".repeat(80)));
    }

    fn board_error(fen: &str) -> String {
        match parse_fen(fen) {
            Err(FenError::BadBoard(why)) => why,
            other => panic!("{fen}: expected a board error, got {other:?}"),
        }
    }

    #[test]
    fn refuses_a_ninth_rank_instead_of_dropping_its_pieces() {
        // shakmaty alone read the 9th field as a crazyhouse pocket and returned the board without the queen.
        assert_eq!(board_error("4k3/8/8/8/8/8/8/4K3/Q w - - 0 1"), "9 ranks, a FEN has 8");
        assert_eq!(board_error("4k3/8/8/8/8/8/4K3 w - - 0 1"), "7 ranks, a FEN has 8");
    }

    #[test]
    fn refuses_two_digits_in_a_row_though_they_add_up_to_eight() {
        assert_eq!(board_error("4k3/8/8/8/8/8/44/4K3 w - - 0 1"), "rank 2 ('44'): two digits in a row");
        assert_eq!(board_error("4k3/8/8/8/8/8/8/4K12 w - - 0 1"), "rank 1 ('4K12'): two digits in a row");
    }

    #[test]
    fn names_the_rank_with_the_wrong_number_of_squares() {
        assert_eq!(board_error("4k3/8/8/8/8/p7p/8/4K3 w - - 0 1"), "rank 3 ('p7p') has 9 squares, a rank has 8");
        assert_eq!(board_error("4k3/8/8/8//8/8/4K3 w - - 0 1"), "rank 4 ('') has 0 squares, a rank has 8");
        assert_eq!(board_error("4k3/8/8/8/8/8/8/4K2 w - - 0 1"), "rank 1 ('4K2') has 7 squares, a rank has 8");
        assert_eq!(board_error("4k3/8/8/8/8/8/8/4K3x w - - 0 1"), "rank 1 ('4K3x'): unexpected character 'x'");
        assert_eq!(board_error("4k3/8/8/8/8/8/8/4K003 w - - 0 1"), "rank 1 ('4K003'): unexpected character '0'");
        let long = format!("4k3/8/8/8/8/8/8/{} w - - 0 1", "K".repeat(40));
        assert_eq!(board_error(&long), format!("rank 1 ('{}...') has 40 squares, a rank has 8", "K".repeat(16)));
        let msg = parse_fen("4k3/8/8/8/8/p7p/8/4K3 w - - 0 1").unwrap_err().to_string();
        assert_eq!(msg, "invalid board part in FEN: rank 3 ('p7p') has 9 squares, a rank has 8");
    }
}
