"""`rookworld play`: a game against the model in the terminal. Your moves in UCI or SAN are checked by the Rust
core; the model's move is chosen as `rookworld uci` chooses it (`rookworld.lm.moves`): the B: move of its P:
answer, or, when that is illegal, the legal move it finds most probable at its B: slot (it says so, and the game
ends with the counts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from rookworld.chess import rules
from rookworld.lm.games import BLACK, COLOUR_NAMES, WHITE, Choice, Game, ModelPlayer
from rookworld.lm.moves import BEST, LIKELIEST


def board_text(fen: str, *, flip: bool = False) -> str:
    """The board as text, white's pieces in capitals, from the side of the player at the bottom."""
    rows = []
    for rank_index, row in enumerate(fen.split()[0].split("/")):
        cells = []
        for ch in row:
            cells.extend(["."] * int(ch) if ch.isdigit() else [ch])
        rows.append((8 - rank_index, cells))
    if flip:
        rows = [(rank, cells[::-1]) for rank, cells in reversed(rows)]
    files = "abcdefgh"[::-1] if flip else "abcdefgh"
    return "\n".join([*(f"{rank} {' '.join(cells)}" for rank, cells in rows), "  " + " ".join(files)])


def _describe(fen: str, move: str) -> str:
    try:
        return f"{move} ({rules.san(fen, move)})"
    except ValueError:
        return move


def play_game(model_player: ModelPlayer, *, user: str = WHITE, start_fen: str = rules.START_FEN,
              read: Callable[[str], str] = input, out: TextIO, max_plies: int = 400) -> Game:
    """Plays one game: the user's moves from `read` (EOF or `quit` resigns), the model's from `model_player`."""
    game = Game(start_fen=start_fen)

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    say(f"You play {COLOUR_NAMES[user]}; moves in UCI (e2e4) or SAN (e4, Nf3, O-O); 'quit' resigns.")
    while not game.ended and len(game.moves) < max_plies:
        if game.turn == user:
            say()
            say(board_text(game.fen, flip=user == BLACK))
            try:
                text = read(f"your move ({COLOUR_NAMES[user]}): ").strip()
            except EOFError:
                text = "quit"
            if text in ("quit", "resign", "exit"):
                game.stop(f"{COLOUR_NAMES[user]} resigned", "0-1" if user == WHITE else "1-0")
                break
            try:
                move = rules.parse_move(game.fen, text)
            except ValueError as e:
                say(f"  {e}")
                continue
            game.play(Choice(move))
        else:
            before = game.fen
            (choice,) = model_player.choose([game])
            if choice.note:
                say(f"  (the model: {choice.note})")
            if game.play(choice):
                say(f"the model plays {_describe(before, choice.move)}")
            else:
                say(f"the model's answer has no legal move: {choice.answer!r}")
    if not game.ended:
        game.stop("ply limit")
    say()
    say(board_text(game.fen, flip=user == BLACK))
    n, counts = len(game.moves), game.source_counts()
    say(f"game over: {game.result or 'no result'} ({game.reason}) after {n} half-move{'' if n == 1 else 's'}; "
        f"the model's moves: {counts[BEST]} its own answer, {counts[LIKELIEST]} the legal move it finds most "
        f"probable (its answer was illegal)")
    say(f"moves: {' '.join(game.moves)}")
    return game
