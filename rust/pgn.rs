//! Real games from PGN files: per game the headers that choose it, its start position and its
//! mainline as UCI moves (python-chess's syntax: castling as `e1g1`, promotions in lower case).
//!
//! Files are read a line at a time, so a multi-gigabyte dump (plain, `.gz` or Lichess's `.zst`,
//! told apart by their first bytes) never sits in memory; a game is kept only while it is read.
//! Movetext is read as python-chess's `chess.pgn.read_game` reads it: `{...}` comments (over
//! several lines too), `;` comments, `%` escape lines, variations in `( ... )` (skipped, nested
//! too), NAGs (`$1`, `!`, `?!`), move numbers (`14.`, `14...`, `1.e4`), results, SAN as people
//! write it (`O-O`, `0-0`, `e8=Q`, `e8Q`, a `+` or `#` right or wrong), a `[FEN]` start. A game
//! ends at a blank line or a tag line after its movetext, or at the end of the file, result or not.
//!
//! Stricter than python-chess, because a training position must come from the game it names: a
//! word that is no move (`Nf9`; python-chess drops it, and then plays the next move for the wrong
//! side), a move after the result, an unclosed comment or a variant other than standard chess makes
//! the whole game bad, with an error naming the file, the game's first line and the move.
//!
//! Bounded by its own limits, not the input's: a line longer than `MAX_LINE` bytes stops the reading with an
//! error naming file and line (`/dev/zero`, or gigabytes of anything without a newline, would otherwise be held
//! whole), and a game longer than `MAX_PLIES` is a bad game, read past without keeping its moves.
//!
//! niklasf's pgn-reader (0.29.0 is the version for shakmaty 0.30) was the first choice; it skips a
//! word it cannot read without a word (`1. e4 e5 2. Nf9 Nc6` gives e4 e5 Nc6) and knows no line
//! numbers, so this reader is written on shakmaty's SAN instead (through `notation`).

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shakmaty::{Chess, Color, Position};

use crate::fen::{echoed, parse_fen, to_fen, FenError};
use crate::moves::uci;
use crate::notation::{parse_move, MoveError};

/// The longest line read, in bytes. Lichess writes a game's movetext on one line, a clock and an evaluation
/// comment with every move (about 45 bytes a ply): the longest legal game, so written, takes under 1 MB.
pub const MAX_LINE: usize = 4 << 20;

/// The most plies a game may have. The 75-move and fivefold-repetition rules end every game within 8,848.5
/// moves (17,697 plies: a pawn move or a capture at least every 75 moves, and there are at most 96 pawn moves
/// and 30 captures), so a longer game is no game of chess, whatever its file says; 9,000 moves is a round bound
/// above it. Without one a game's history grew without end (one legal-looking 20,000-ply game took 5.7 GB).
pub const MAX_PLIES: usize = 18_000;

/// The headers that choose games; others are read past.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    pub event: Option<String>,
    pub site: Option<String>,
    /// `None` where the header is missing or no number (Lichess writes `?` for an unrated player).
    pub white_elo: Option<u32>,
    pub black_elo: Option<u32>,
    /// As written: `300+3`, `-` (correspondence), `40/7200:3600`.
    pub time_control: Option<String>,
    pub result: Option<String>,
    /// The start position, when it is not the standard one.
    pub fen: Option<String>,
}

impl Headers {
    fn set(&mut self, name: &str, value: String) {
        match name {
            "Event" => self.event = Some(value),
            "Site" => self.site = Some(value),
            "WhiteElo" => self.white_elo = value.trim().parse().ok(),
            "BlackElo" => self.black_elo = value.trim().parse().ok(),
            "TimeControl" => self.time_control = Some(value),
            "Result" => self.result = Some(value),
            "FEN" => self.fen = Some(value),
            _ => {}
        }
    }

    /// `(name, value)` of each header present, in PGN's names.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let elo = |e: Option<u32>| e.map(|e| e.to_string());
        [
            ("Event", self.event.clone()),
            ("Site", self.site.clone()),
            ("WhiteElo", elo(self.white_elo)),
            ("BlackElo", elo(self.black_elo)),
            ("TimeControl", self.time_control.clone()),
            ("Result", self.result.clone()),
            ("FEN", self.fen.clone()),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect()
    }
}

/// One game whose every mainline move is legal.
#[derive(Clone, Debug)]
pub struct Game {
    /// 0-based, counting every game read (bad ones too), across files read together.
    pub index: usize,
    /// The file (or the name given to a text), for messages.
    pub source: Arc<str>,
    /// Line of the game's first tag or move, 1-based.
    pub line: usize,
    pub headers: Headers,
    pub start: Chess,
    /// The mainline in UCI, from `start`.
    pub moves: Vec<String>,
}

/// What makes a game unusable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    BadFen { fen: String, why: FenError },
    Variant(String),
    /// `number` is the move number as PGN writes it: `14` for White's move, `14...` for Black's.
    Move { number: String, text: String, line: usize, fen: String, why: MoveError },
    AfterResult { text: String, line: usize, result: String },
    UnclosedComment { line: usize },
    /// More than `MAX_PLIES` moves.
    TooLong,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::BadFen { fen, why } => write!(f, "its FEN header {} is no legal position: {why}", echoed(fen)),
            Problem::Variant(v) => write!(f, "its variant {} is not standard chess", echoed(v)),
            Problem::Move { number, text, line, fen, why } => {
                let what = match why {
                    MoveError::Illegal => format!("is not legal in {fen}"),
                    MoveError::Ambiguous(moves) => format!("is ambiguous in {fen} ({})", moves.join(", ")),
                    MoveError::NotAMove | MoveError::NotUci => format!("is no move in SAN (position {fen})"),
                };
                write!(f, "move {number} {} (line {line}) {what}", echoed(text))
            }
            Problem::AfterResult { text, line, result } => {
                write!(f, "{} (line {line}) comes after the result {result}", echoed(text))
            }
            Problem::UnclosedComment { line } => write!(f, "the comment opened on line {line} is never closed"),
            Problem::TooLong => write!(
                f,
                "it has more than {MAX_PLIES} plies, more than any game of chess can have (the 75-move and \
                 fivefold-repetition rules end every game within 17,697 plies)"
            ),
        }
    }
}

/// A bad game: where it starts, which it is, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GameError {
    pub source: Arc<str>,
    pub line: usize,
    pub index: usize,
    /// Boxed: a game's `Result` stays small on the good path.
    pub problem: Box<Problem>,
}

impl fmt::Display for GameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: game {}: {}", self.source, self.line, self.index + 1, self.problem)
    }
}

impl std::error::Error for GameError {}

#[derive(Debug)]
pub enum PgnError {
    /// A file that cannot be opened or read (or decompressed).
    Io { source: Arc<str>, error: io::Error },
    /// A line longer than `MAX_LINE` bytes, 1-based: no PGN text (`/dev/zero`, a binary file).
    LongLine { source: Arc<str>, line: usize },
    Game(GameError),
}

impl fmt::Display for PgnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgnError::Io { source, error } => write!(f, "{source}: {error}"),
            PgnError::LongLine { source, line } => write!(
                f,
                "{source}:{line}: the line goes on past {} MiB without an end, longer than any PGN game's: \
                 not a PGN file?",
                MAX_LINE >> 20
            ),
            PgnError::Game(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PgnError {}

/// A game's mainline words (moves and results), before they are played.
struct Word {
    text: String,
    line: usize,
    result: bool,
}

/// A game's mainline words, at most `MAX_PLIES` and a result: past them a game is only marked too long, so that its
/// memory stays bounded however long its file says it is.
#[derive(Default)]
struct Words {
    kept: Vec<Word>,
    too_many: bool,
}

impl Words {
    fn push(&mut self, word: Word) {
        if self.kept.len() > MAX_PLIES {
            self.too_many = true;
        } else {
            self.kept.push(word);
        }
    }
}

struct RawGame {
    line: usize,
    headers: Headers,
    variant: Option<String>,
    words: Words,
    open_comment: Option<usize>,
}

impl RawGame {
    fn new(line: usize) -> RawGame {
        RawGame { line, headers: Headers::default(), variant: None, words: Words::default(), open_comment: None }
    }

    fn tag(&mut self, line: &str) {
        if let Some((name, value)) = parse_tag(line) {
            if name == "Variant" {
                self.variant = Some(value);
            } else {
                self.headers.set(name, value);
            }
        }
    }
}

/// `[Name "value"]` with `\"` and `\\` escapes; `None` for a malformed tag, which python-chess ignores too.
fn parse_tag(line: &str) -> Option<(&str, String)> {
    let inner = line.trim().strip_prefix('[')?;
    let (name, rest) = inner.split_at(inner.find(|c: char| c.is_whitespace() || c == '"')?);
    let mut chars = rest.trim_start().strip_prefix('"')?.chars();
    let mut value = String::new();
    loop {
        match chars.next()? {
            '"' => break,
            '\\' => value.push(chars.next()?),
            c => value.push(c),
        }
    }
    (!name.is_empty()).then_some((name, value))
}

/// Where the movetext scan stands between lines: inside a comment (opened on which line), how deep in variations.
#[derive(Default)]
struct Scan {
    comment_from: Option<usize>,
    depth: usize,
}

/// Adds the mainline words of one movetext line; comments, variations, NAGs and move numbers fall away.
fn scan_line(line: &str, number: usize, scan: &mut Scan, words: &mut Words) {
    let mut rest = line;
    loop {
        if scan.comment_from.is_some() {
            match rest.find('}') {
                Some(i) => {
                    rest = &rest[i + 1..];
                    scan.comment_from = None;
                }
                None => return,
            }
        }
        rest = rest.trim_start();
        let Some(c) = rest.chars().next() else { return };
        match c {
            ';' => return,
            '{' => scan.comment_from = Some(number),
            '(' => scan.depth += 1,
            ')' => scan.depth = scan.depth.saturating_sub(1),
            '}' => {}  // a stray brace; python-chess passes over it too
            _ => {
                let end = rest.find(|c: char| c.is_whitespace() || "{}();".contains(c)).unwrap_or(rest.len());
                if scan.depth == 0 {
                    push_word(&rest[..end], number, words);
                }
                rest = &rest[end..];
                continue;
            }
        }
        rest = &rest[1..];
    }
}

fn push_word(word: &str, line: usize, words: &mut Words) {
    if matches!(word, "1-0" | "0-1" | "1/2-1/2" | "*") {
        words.push(Word { text: word.to_string(), line, result: true });
        return;
    }
    // A NAG may be glued on (`e4$1`); `$5` alone leaves nothing.
    let word = &word[..word.find('$').unwrap_or(word.len())];
    let word = strip_move_number(word);
    let word = word.strip_suffix("e.p.").unwrap_or(word).trim_end_matches(['!', '?']);
    // Evaluation glyphs some programs write as text (`+-`, `=`, `+/=`, `∞`) say nothing about the moves;
    // `--`, python-chess's null move, is no move of a real game.
    let glyph = word.chars().all(|c| "+-=/~∞±∓⩲⩱".contains(c)) && !word.chars().all(|c| c == '-');
    if word.is_empty() || glyph {
        return;
    }
    words.push(Word { text: word.to_string(), line, result: false });
}

/// `14.`, `14...`, `14.Nf3` and `14` lose their number; `0-0` keeps its zeros.
fn strip_move_number(word: &str) -> &str {
    let digits = word.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &word[digits..];
    if digits == 0 || digits == word.len() || rest.starts_with('.') {
        rest.trim_start_matches('.')
    } else {
        word
    }
}

/// Games from PGN text, one at a time, as the text is read.
pub struct PgnReader<R> {
    input: R,
    source: Arc<str>,
    line: usize,
    next_index: usize,
    buf: Vec<u8>,
    /// The tag line that ended the last game's movetext: the next game's first.
    pending: Option<String>,
    failed: bool,
}

impl<R: BufRead> PgnReader<R> {
    /// `source` names the input in messages; `first_index` is the index of its first game.
    pub fn new(input: R, source: &str, first_index: usize) -> PgnReader<R> {
        PgnReader {
            input,
            source: source.into(),
            line: 0,
            next_index: first_index,
            buf: Vec::new(),
            pending: None,
            failed: false,
        }
    }

    /// The index the next game will get.
    pub fn next_index(&self) -> usize {
        self.next_index
    }

    fn next_line(&mut self) -> Result<Option<String>, PgnError> {
        self.buf.clear();
        let io = |error| PgnError::Io { source: self.source.clone(), error };
        let read = (&mut self.input).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut self.buf).map_err(io)?;
        if read == 0 {
            return Ok(None);
        }
        self.line += 1;
        // At most MAX_LINE bytes and the newline that ends them.
        if self.buf.len() > MAX_LINE && self.buf.last() != Some(&b'\n') {
            return Err(PgnError::LongLine { source: self.source.clone(), line: self.line });
        }
        let mut bytes = &self.buf[..];
        if self.line == 1 {
            bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
        }
        // Old files are often Latin-1: names and comments may lose letters, moves are ASCII.
        let text = String::from_utf8_lossy(bytes);
        Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()))
    }

    fn read_raw(&mut self) -> Result<Option<RawGame>, PgnError> {
        let mut game: Option<RawGame> = None;
        if let Some(tag) = self.pending.take() {
            let mut g = RawGame::new(self.line);
            g.tag(&tag);
            game = Some(g);
        }
        let mut scan = Scan::default();
        let mut in_movetext = false;
        while let Some(line) = self.next_line()? {
            if scan.comment_from.is_none() {
                if line.starts_with('%') {
                    continue;
                }
                if line.starts_with('[') {
                    if in_movetext {
                        self.pending = Some(line);
                        break;
                    }
                    game.get_or_insert_with(|| RawGame::new(self.line)).tag(&line);
                    continue;
                }
                if line.trim().is_empty() {
                    if in_movetext {
                        break;
                    }
                    continue;
                }
                if !in_movetext && line.starts_with(';') {
                    continue;
                }
            }
            in_movetext = true;
            let g = game.get_or_insert_with(|| RawGame::new(self.line));
            scan_line(&line, self.line, &mut scan, &mut g.words);
        }
        if let Some(g) = game.as_mut() {
            g.open_comment = scan.comment_from;
        }
        Ok(game)
    }
}

impl<R: BufRead> Iterator for PgnReader<R> {
    type Item = Result<Game, PgnError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.read_raw() {
            Ok(Some(raw)) => {
                let index = self.next_index;
                self.next_index += 1;
                Some(play(raw, index, &self.source).map_err(PgnError::Game))
            }
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Names python-chess gives standard chess in a `Variant` header (Lichess writes `From Position` with a FEN).
const STANDARD: [&str; 6] = ["standard", "chess", "classical", "normal", "illegal", "from position"];

/// Plays a game's mainline from its start.
fn play(raw: RawGame, index: usize, source: &Arc<str>) -> Result<Game, GameError> {
    let fail = |problem| Err(GameError { source: source.clone(), line: raw.line, index, problem: Box::new(problem) });
    if let Some(line) = raw.open_comment {
        return fail(Problem::UnclosedComment { line });
    }
    if raw.words.too_many {
        return fail(Problem::TooLong);
    }
    if let Some(v) = raw.variant.as_ref().filter(|v| !STANDARD.contains(&v.trim().to_lowercase().as_str())) {
        return fail(Problem::Variant(v.clone()));
    }
    let start = match &raw.headers.fen {
        None => Chess::default(),
        Some(fen) => match parse_fen(fen) {
            Ok(pos) => pos,
            Err(why) => return fail(Problem::BadFen { fen: fen.clone(), why }),
        },
    };
    let mut pos = start.clone();
    let mut moves = Vec::with_capacity(raw.words.kept.len());
    let mut result: Option<&str> = None;
    for word in &raw.words.kept {
        if word.result {
            result.get_or_insert(&word.text);
            continue;
        }
        if let Some(result) = result {
            return fail(Problem::AfterResult { text: word.text.clone(), line: word.line, result: result.into() });
        }
        match parse_move(&pos, &word.text) {
            Ok(m) => {
                moves.push(uci(m));
                pos.play_unchecked(m);
            }
            Err(why) => {
                let dots = if pos.turn() == Color::White { "" } else { "..." };
                let number = format!("{}{dots}", pos.fullmoves());
                return fail(Problem::Move { number, text: word.text.clone(), line: word.line, fen: to_fen(&pos), why });
            }
        }
    }
    Ok(Game { index, source: source.clone(), line: raw.line, headers: raw.headers, start, moves })
}

/// Reasons of bad games kept for the caller's message; the rest are only counted.
pub const MAX_REASONS: usize = 5;

/// Bad games passed over: how many, and the first `MAX_REASONS` errors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub count: usize,
    pub reasons: Vec<String>,
}

impl Skipped {
    pub fn note(&mut self, e: &GameError) {
        self.count += 1;
        if self.reasons.len() < MAX_REASONS {
            self.reasons.push(e.to_string());
        }
    }
}

/// The good games, at most `max_games` games read (bad ones included); a bad game fails the
/// whole unless `skip_bad`, which counts it instead.
pub fn collect_games(
    games: impl IntoIterator<Item = Result<Game, PgnError>>,
    skip_bad: bool,
    max_games: Option<usize>,
) -> Result<(Vec<Game>, Skipped), PgnError> {
    let (mut good, mut skipped) = (Vec::new(), Skipped::default());
    for item in games.into_iter().take(max_games.unwrap_or(usize::MAX)) {
        match item {
            Ok(game) => good.push(game),
            Err(PgnError::Game(e)) if skip_bad => skipped.note(&e),
            Err(e) => return Err(e),
        }
    }
    Ok((good, skipped))
}

/// Games from PGN text in memory, named `source` in messages.
pub fn read_text<'a>(text: &'a str, source: &str) -> PgnReader<&'a [u8]> {
    PgnReader::new(text.as_bytes(), source, 0)
}

/// A PGN file, plain, gzip or zstd (told apart by their magic bytes, whatever the name), as a text stream.
pub fn open(path: &Path) -> io::Result<Box<dyn BufRead + Send>> {
    let file = File::open(path)?;
    // Linux opens a directory as a file, and only its first read fails ("Is a directory (os error 21)").
    if file.metadata()?.is_dir() {
        return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory: give the PGN files in it"));
    }
    let mut file = BufReader::with_capacity(1 << 16, file);
    let magic = file.fill_buf()?;
    Ok(if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(BufReader::with_capacity(1 << 16, flate2::bufread::MultiGzDecoder::new(file)))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(BufReader::with_capacity(1 << 16, Zstd::new(file)))
    } else {
        Box::new(file)
    })
}

/// zstd that may hold several frames (as `cat a.zst b.zst` makes); ruzstd's own stream reads only one.
struct Zstd<R> {
    source: R,
    decoder: ruzstd::decoding::FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> Zstd<R> {
    fn new(source: R) -> Zstd<R> {
        Zstd { source, decoder: ruzstd::decoding::FrameDecoder::new(), in_frame: false }
    }
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
        use ruzstd::decoding::BlockDecodingStrategy;
        let bad = |e: FrameDecoderError| io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}"));
        loop {
            if self.in_frame {
                while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                    self.decoder.decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1)).map_err(bad)?;
                }
                let n = self.decoder.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                self.in_frame = false;
            }
            if self.source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            match self.decoder.reset(&mut self.source) {
                Ok(()) => self.in_frame = true,
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame { length, .. })) => {
                    io::copy(&mut (&mut self.source).take(u64::from(length)), &mut io::sink())?;
                }
                Err(e) => return Err(bad(e)),
            }
        }
    }
}

/// The games of several files, read one after another with indices running on; a file is opened
/// only when the one before it is done.
pub struct Files {
    paths: std::vec::IntoIter<PathBuf>,
    current: Option<PgnReader<Box<dyn BufRead + Send>>>,
    next_index: usize,
}

pub fn read_files(paths: Vec<PathBuf>) -> Files {
    Files { paths: paths.into_iter(), current: None, next_index: 0 }
}

impl Iterator for Files {
    type Item = Result<Game, PgnError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(reader) = self.current.as_mut() {
                match reader.next() {
                    Some(item) => return Some(item),
                    None => {
                        self.next_index = reader.next_index();
                        self.current = None;
                    }
                }
            }
            let path = self.paths.next()?;
            let name = path.to_string_lossy();
            match open(&path) {
                Ok(input) => self.current = Some(PgnReader::new(input, &name, self.next_index)),
                Err(error) => return Some(Err(PgnError::Io { source: name.into(), error })),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn games(text: &str) -> Vec<Result<Game, PgnError>> {
        read_text(text, "games.pgn").collect()
    }

    fn moves(text: &str) -> Vec<Vec<String>> {
        games(text).into_iter().map(|g| g.unwrap().moves).collect()
    }

    fn error(text: &str) -> String {
        let all = games(text);
        let bad: Vec<String> = all.iter().filter_map(|g| g.as_ref().err().map(|e| e.to_string())).collect();
        assert_eq!(bad.len(), 1, "{bad:?}");
        bad[0].clone()
    }

    fn line(ucis: &str) -> Vec<String> {
        ucis.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn comments_variations_nags_and_numbers_fall_away() {
        let text = "[Event \"Test\"]\n[White \"A\"]\n\n\
            1. e4 {best by test} e5 $1 2.Nf3 (2. f4 exf4 (2... d5) 3. Nf3) Nc6!? ; a rest-of-line comment Bb5\n\
            % an escape line: 3. d4\n\
            3. Bb5 {a comment\nover two lines ( 3. d4 ) with a blank one\n\n} a6?! 4... \n1-0\n";
        assert_eq!(moves(text), vec![line("e2e4 e7e5 g1f3 b8c6 f1b5 a7a6")]);
        // A NAG glued on, dots spaced, evaluation glyphs as text.
        assert_eq!(moves("1. e4$1 ... e5 2.Nf3 += 2... Nc6 +- *"), vec![line("e2e4 e7e5 g1f3 b8c6")]);
    }

    #[test]
    fn castling_both_sides_and_promotion() {
        let text = "1. e4 d5 2. Nf3 Be6 3. Be2 Qd6 4. O-O Nc6 5. b3 0-0-0 *";
        assert_eq!(moves(text), vec![line("e2e4 d7d5 g1f3 c8e6 f1e2 d8d6 e1g1 b8c6 b2b3 e8c8")]);
        let text = "[SetUp \"1\"]\n[FEN \"8/4P3/8/8/8/8/k7/4K3 w - - 0 1\"]\n\n1. e8=Q Kb2 2. Qe5+ *";
        let g = games(text).remove(0).unwrap();
        assert_eq!(g.moves, line("e7e8q a2b2 e8e5"));
        assert_eq!(to_fen(&g.start), "8/4P3/8/8/8/8/k7/4K3 w - - 0 1");
        assert_eq!(moves("[FEN \"8/4P3/8/8/8/8/k7/4K3 w - - 0 1\"]\n\n1. e8N"), vec![line("e7e8n")]);
    }

    #[test]
    fn a_game_cut_off_ends_at_the_blank_line_or_the_next_tags() {
        let text = "[Event \"cut\"]\n\n1. d4 d5 2. c4\n\n[Event \"next\"]\n\n1. e4 *\n[Event \"no blank line\"]\n1. c4\n";
        let all: Vec<Game> = games(text).into_iter().map(Result::unwrap).collect();
        assert_eq!(all.iter().map(|g| g.moves.clone()).collect::<Vec<_>>(),
                   vec![line("d2d4 d7d5 c2c4"), line("e2e4"), line("c2c4")]);
        assert_eq!(all.iter().map(|g| (g.index, g.line)).collect::<Vec<_>>(), vec![(0, 1), (1, 5), (2, 8)]);
        assert_eq!(all[0].headers.event.as_deref(), Some("cut"));
        assert_eq!(all[0].headers.result, None);
    }

    #[test]
    fn headers_that_matter() {
        let text = "[Event \"Rated Blitz game\"]\n[Site \"https://lichess.org/abcd\"]\n[Result \"1/2-1/2\"]\n\
                    [WhiteElo \"1850\"]\n[BlackElo \"?\"]\n[TimeControl \"300+3\"]\n[Annotator \"A \\\"quoted\\\" name\"]\n\n\
                    1. e4 1/2-1/2\n";
        let g = games(text).remove(0).unwrap();
        assert_eq!(g.headers, Headers {
            event: Some("Rated Blitz game".into()),
            site: Some("https://lichess.org/abcd".into()),
            white_elo: Some(1850),
            black_elo: None,
            time_control: Some("300+3".into()),
            result: Some("1/2-1/2".into()),
            fen: None,
        });
        assert_eq!(parse_tag("[Annotator \"A \\\"quoted\\\" name\"]"), Some(("Annotator", "A \"quoted\" name".into())));
        assert_eq!(parse_tag("[Broken"), None);
    }

    #[test]
    fn a_bad_game_names_file_line_game_and_move() {
        let text = "[Event \"good\"]\n\n1. e4 e5 *\n\n[Event \"bad\"]\n[Round \"2\"]\n\n1. e4 e5\n2. Nf3 Nc6 3. Nf9 a6 *\n";
        assert_eq!(error(text), "games.pgn:5: game 2: move 3 \"Nf9\" (line 9) is no move in SAN \
                                 (position r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3)");
        assert_eq!(error("1. e4 e5 2. Ke3 *"), "games.pgn:1: game 1: move 2 \"Ke3\" (line 1) is not legal in \
                                               rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2");
        assert!(error("1. e4 Ke6 *").contains("move 1... \"Ke6\""));
        let two_knights = "[FEN \"4k3/8/8/8/8/5N2/8/1N2K3 w - - 0 1\"]\n\n1. Nd2 *";
        assert!(error(two_knights).ends_with("is ambiguous in 4k3/8/8/8/8/5N2/8/1N2K3 w - - 0 1 (Nbd2, Nfd2)"));
        assert!(error("[FEN \"8/8/8/8/8/8/8/8 w - - 0 1\"]\n\n*").contains("its FEN header \"8/8/8/8/8/8/8/8 w - - 0 1\" is no legal position"));
        assert!(error("[Variant \"Chess960\"]\n\n1. e4 *").contains("variant \"Chess960\" is not standard chess"));
        assert!(games("[Variant \"From Position\"]\n[FEN \"4k3/8/8/8/8/8/4P3/4K3 w - - 0 1\"]\n\n1. e4 *")[0].is_ok());
        assert_eq!(error("1. e4 e5 1-0 2. Nf3"), "games.pgn:1: game 1: \"Nf3\" (line 1) comes after the result 1-0");
        assert_eq!(error("1. e4 {never closed\n\n2. d4 *\n"), "games.pgn:1: game 1: the comment opened on line 1 is never closed");
        assert!(error("1. e4 -- 2. d4 *").contains("\"--\""), "null moves are not read");
    }

    #[test]
    fn a_game_longer_than_any_legal_game_is_a_bad_game() {
        let dance = |plies: usize| "Nf3 Nf6 Ng1 Ng8 ".repeat(plies / 4);
        let longest = format!("{}\n\n1. d4 *\n", dance(MAX_PLIES));
        let all = games(&longest);
        assert_eq!(all[0].as_ref().unwrap().moves.len(), MAX_PLIES);
        // 20,000 plies, as a probe sent: one bad game, and the game after it is read.
        let text = format!("[Event \"dance\"]\n\n{}\n\n1. d4 *\n", dance(20_000));
        let all = games(&text);
        let e = all[0].as_ref().unwrap_err().to_string();
        assert!(e.starts_with("games.pgn:1: game 1: it has more than 18000 plies, more than any game"), "{e}");
        assert_eq!(all[1].as_ref().unwrap().moves, line("d2d4"));
    }

    #[test]
    fn a_line_without_an_end_stops_the_reading_naming_file_and_line() {
        let mut text = "[Event \"x\"]\n\n1. e4 *\n\n".to_string();
        text.push_str(&"\0".repeat(MAX_LINE + 1));
        let all = games(&text);
        assert_eq!(all.len(), 2);
        assert!(all[0].is_ok());
        let e = all[1].as_ref().unwrap_err();
        assert!(matches!(e, PgnError::LongLine { line: 5, .. }), "{e}");
        assert_eq!(e.to_string(), "games.pgn:5: the line goes on past 4 MiB without an end, longer than any PGN \
                                   game's: not a PGN file?");
        // A line of exactly the limit is read.
        let long_comment = format!("1. e4 {{{}}} e5 *\n", "c".repeat(MAX_LINE - 13));
        assert_eq!(long_comment.len(), MAX_LINE + 1);
        assert_eq!(moves(&long_comment), vec![line("e2e4 e7e5")]);
    }

    #[test]
    fn quoted_input_is_cut_to_the_echo_limit() {
        let e = error(&format!("[FEN \"{}\"]\n\n*", "8/".repeat(500_000)));
        assert!(e.len() < 200 && e.contains("its FEN header \"8/8/8/") && e.contains("...\" is no legal"), "{e}");
        let e = error(&format!("1. {} *", "N".repeat(1_000_000)));
        assert!(e.len() < 300 && e.contains(&format!("\"{}...\"", "N".repeat(80))), "{e}");
        let e = error(&format!("[Variant \"{}\"]\n\n*", "v".repeat(1000)));
        assert!(e.len() < 200, "{e}");
    }

    #[test]
    fn games_after_a_bad_one_are_read() {
        let text = "1. e4 e5 2. Ke3 *\n\n1. d4 *\n\n1. Nf9\n\n1. c4 *\n";
        let all = games(text);
        assert!(all[0].is_err());
        assert_eq!(all[1].as_ref().unwrap().moves, line("d2d4"));
        assert_eq!(all[1].as_ref().unwrap().index, 1);
        let err = collect_games(read_text(text, "g.pgn"), false, None).unwrap_err().to_string();
        assert!(err.starts_with("g.pgn:1: game 1: move 2 \"Ke3\""), "{err}");
        let (good, skipped) = collect_games(read_text(text, "g.pgn"), true, None).unwrap();
        assert_eq!(good.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(skipped.count, 2);
        assert!(skipped.reasons[1].starts_with("g.pgn:5: game 3: move 1 \"Nf9\""), "{:?}", skipped.reasons);
        let (good, skipped) = collect_games(read_text(text, "g.pgn"), true, Some(2)).unwrap();
        assert_eq!((good.len(), skipped.count), (1, 1));
    }

    #[test]
    fn move_numbers_and_words() {
        assert_eq!(strip_move_number("14."), "");
        assert_eq!(strip_move_number("14..."), "");
        assert_eq!(strip_move_number("14...Nf6"), "Nf6");
        assert_eq!(strip_move_number("1.e4"), "e4");
        assert_eq!(strip_move_number("12"), "");
        assert_eq!(strip_move_number("0-0"), "0-0");
        assert_eq!(strip_move_number("0-0-0+"), "0-0-0+");
        assert_eq!(strip_move_number("..."), "");
        assert_eq!(moves("1. e4 d5 2. exd5 c5 3. dxc6 e.p. *"), vec![line("e2e4 d7d5 e4d5 c7c5 d5c6")]);
    }

    #[test]
    fn leading_comments_bom_and_crlf() {
        let text = "\u{feff}; a file comment\n% and an escape\n\n[Event \"x\"]\r\n\r\n1. e4 e5\r\n\r\n";
        let all: Vec<Game> = games(text).into_iter().map(Result::unwrap).collect();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].line, 4);
        assert_eq!(all[0].moves, line("e2e4 e7e5"));
        assert!(games("").is_empty());
        assert!(games("\n\n  \n").is_empty());
    }

    #[test]
    fn compressed_files_read_like_plain_ones() {
        use std::io::Write;
        let text = "[Event \"a\"]\n\n1. e4 e5 *\n\n[Event \"b\"]\n\n1. d4 d5 *\n";
        let dir = std::env::temp_dir().join(format!("rookworld-pgn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("g.pgn");
        std::fs::write(&plain, text).unwrap();
        let gz = dir.join("g.pgn.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        // Two zstd frames, one game each.
        let zst = dir.join("g.pgn.zst");
        let (a, b) = text.split_at(text.find("[Event \"b\"]").unwrap());
        let level = ruzstd::encoding::CompressionLevel::Fastest;
        let mut frames = ruzstd::encoding::compress_to_vec(a.as_bytes(), level);
        frames.extend(ruzstd::encoding::compress_to_vec(b.as_bytes(), level));
        std::fs::write(&zst, frames).unwrap();
        let all: Vec<Game> = read_files(vec![plain, gz, zst.clone()]).map(Result::unwrap).collect();
        assert_eq!(all.len(), 6);
        assert_eq!(all.iter().map(|g| g.index).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
        for pair in all.chunks(2) {
            assert_eq!((pair[0].moves.clone(), pair[1].moves.clone()), (line("e2e4 e7e5"), line("d2d4 d7d5")));
        }
        assert_eq!(all[5].line, 5);
        assert_eq!(&*all[5].source, zst.to_string_lossy());
        let folder = read_files(vec![dir.clone()]).next().unwrap().unwrap_err();
        assert!(folder.to_string().ends_with("is a directory: give the PGN files in it"), "{folder}");
        let missing = read_files(vec![dir.join("missing.pgn")]).next().unwrap().unwrap_err();
        assert!(matches!(&missing, PgnError::Io { error, .. } if error.kind() == io::ErrorKind::NotFound), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
