"""The commands besides train and sft: each one's settings, composed of the shared groups and of its own (declared
here once), and what `rookworld --help` says of it. Train's and sft's are in `rookworld.settings.config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rookworld.io.quote import quoted
from rookworld.chess.stockfish.limits import MAX_NODES
from rookworld.settings import shipped
from rookworld.settings.base import existing_files, non_negative, positive, share
from rookworld.settings.config import SFTConfig, TrainConfig
from rookworld.settings.declare import (DECODING, GAME, OPPONENT, OUTPUT, POSITIONS, RUNS, SERVER, SUITES_, Meaning,
                                        Settings, composed, group, setting)
from rookworld.settings.groups import (BadLinesSettings, CompletionSettings, DataSettings, DecodeBatchSettings,
                                       DecodingSettings, EvalSizeSettings, GameSettings, IllegalShareSettings,
                                       LayoutSettings, ModelSettings, OutputSettings, SeedSettings,
                                       StockfishNodesSettings, StockfishSettings, suites)


@group
class PositionsOnly:
    count: int | None = setting(None, "number of positions (required unless --from or --pgn, which it limits)",
                                POSITIONS, check=positive)
    opening_share: float = setting(0.2, "share of opening positions", POSITIONS, check=share)
    endgame_share: float = setting(0.2, "share of endgames", POSITIONS, check=share)
    source: str | None = setting(None, "read positions from FILE (FEN, EPD or JSONL a line) instead of generating "
                                       "them", POSITIONS, flag="from", metavar="FILE", check=existing_files)
    annotate: bool = setting(False, "add Stockfish analyses and the P:/A: prompts and targets (what train and eval "
                                    "read)", POSITIONS)
    exclude: str | None = setting(None, "leave out the positions of this file (a positions file, as --from reads; "
                                        "compared by board, side to move, castling and en passant) and generate on "
                                        "until --count: a held-out set's, so that no training position is among "
                                        "them", POSITIONS, metavar="FILE", check=existing_files)
    pgn: list = setting([], "positions from the games of a PGN file (plain, .gz or .zst, as Lichess's dumps; "
                            "repeat for several), each with the moves that led to it as history and the game's "
                            "next move as its A: move",
                        POSITIONS, metavar="FILE", check=existing_files)
    min_elo: int | None = setting(None, "PGN: only games whose players both have a WhiteElo/BlackElo of at least this",
                                  POSITIONS, check=positive)
    max_elo: int | None = setting(None, "PGN: only games whose players both have an Elo of at most this", POSITIONS,
                                  check=positive)
    min_base_time: int | None = setting(None, "PGN: only games whose TimeControl gives each player at least this "
                                              "many seconds (300+3: 300)", POSITIONS, check=positive)
    selfplay: bool = setting(False, "positions from games Stockfish plays against itself at --stockfish-depth, "
                                    "each move drawn among its five best with --selfplay-temperature, every "
                                    "position with its game's moves as history; --annotate labels them with the "
                                    "analyses that chose the moves", POSITIONS)
    selfplay_temperature: float = setting(0.3, "self-play: how far below the best move (in pawns) a move is still "
                                               "drawn e^-1 as often; 0: always the best", POSITIONS,
                                          check=non_negative)
    opening_temperature: float = setting(1.0, "self-play: the same for the first 12 half-moves, which spreads the "
                                              "games over many openings", POSITIONS, check=non_negative)
    from_model: str | None = setting(None, "positions from games MODEL (a model directory) plays against itself, "
                                           "sampled, a legal fall-back played wherever its B: move is not: where it "
                                           "goes wrong, as legality self-training wants (see --model-positions)",
                                     POSITIONS, metavar="MODEL")
    model_positions: str = setting("failures", "--from-model: the positions kept: failures (where its B: move was "
                                               "illegal or missing) or all it moved in", POSITIONS,
                                   choices=("failures", "all"))
    per_game: int | None = setting(None, "at most this many positions from each game, drawn at random "
                                         "(default: all)", POSITIONS, check=positive)
    a_history: str = setting("every", "the history an A: prompt shows: every (a length from the move alone to the "
                                      "ten most recent moves, drawn per position, so that the next state is read "
                                      "from the board) or full (the history as the source gives it; a prompt "
                                      "shows its ten most recent moves)", POSITIONS, choices=("every", "full"))
    quiet: bool = setting(False, "no progress bar", OUTPUT)

    def check_together(self, need) -> None:
        need(self.opening_share + self.endgame_share <= 1.0, "--opening-share + --endgame-share must not exceed 1")
        need(self.count is not None or self.source is not None or bool(self.pgn),
             "--count is required (or --from FILE, or --pgn FILE)")
        sources = [name for name, given in (("--from", self.source), ("--pgn", self.pgn), ("--selfplay", self.selfplay),
                                            ("--from-model", self.from_model)) if given]
        need(len(sources) <= 1, f"{' and '.join(sources)} are different sources of positions: give one")
        need(self.count is not None or not self.selfplay, "--selfplay needs --count")


@composed(seed=Meaning("random seed of everything drawn: the positions, their A: moves and histories (the same "
                       "seed, the same file)", POSITIONS),
          layout=Meaning(shown="rookworld"),
          max_plies=Meaning("--from-model: a game of the model's stops after this many half-moves"),
          out=Meaning("the JSONL file to write the positions to (- for stdout)"))
class PositionsSettings(PositionsOnly, SeedSettings, IllegalShareSettings, BadLinesSettings, LayoutSettings,
                        GameSettings, OutputSettings, StockfishSettings, StockfishNodesSettings, Settings):
    required = ("out",)


def tasks(option: str, value: str) -> str | None:
    names = [t.strip().upper() for t in value.split(",") if t.strip()]
    ok = names and all(t in ("P", "A") for t in names)
    return None if ok else f"{option} must be P, A or P,A, got {quoted(value)}"


@group
class EvalOnly:
    suite: str = setting("best-move", "suites to run, comma-separated: best-move, mate-in-one, selfplay, "
                                      "vs-stockfish, ladder", SUITES_, check=suites)
    tasks: str = setting("P,A", "best-move's tasks: P, A or P,A", SUITES_, check=tasks)
    games: int = setting(8, "selfplay: start positions (each played greedy and sampled); vs-stockfish: games; "
                            "ladder: games a pairing",
                         GAME, check=positive)


@group
class OpponentSettings:
    """Stockfish as the opponent: eval's vs-stockfish suite, and serve's games."""

    opponent_elo: int | None = setting(None, "Stockfish's strength as UCI_Elo (Stockfish 15.1: 1350-2850; the "
                                             "default is 1350)", OPPONENT, check=positive)
    opponent_skill: int | None = setting(None, "Stockfish's strength as Skill Level 0-20 instead of an Elo", OPPONENT,
                                         check=non_negative)
    opponent_nodes: int = setting(20_000, "nodes Stockfish searches per move", OPPONENT, check=positive,
                                  most=MAX_NODES)

    def check_together(self, need) -> None:
        need(self.opponent_elo is None or self.opponent_skill is None,
             "give --opponent-elo or --opponent-skill, not both")
        need(self.opponent_skill is None or self.opponent_skill <= 20,
             f"--opponent-skill must lie in 0-20, got {self.opponent_skill}")


#: The model ask, play, uci and eval load unless told: where it is found, else the hub's.
USED_MODEL = Meaning(shown=f"{shipped.MODEL}, here or in the clone rookworld was installed from; without one, "
                           f"{shipped.HUB_MODEL} from the hub", default=shipped.MODEL)
#: Their seed: they draw nothing but the tokens of --protocol rookworld.
SAMPLING_SEED = Meaning("random seed of --protocol rookworld's sampling (greedy decoding draws nothing)", DECODING)


@composed(model=USED_MODEL,
          seed=Meaning("random seed: of the generated held-out positions (without --data), of the A: moves, and of "
                       "sampled decoding (--protocol rookworld, selfplay's sampled games)", SUITES_),
          data=Meaning("positions of the best-move and mate-in-one suites: a positions file (JSONL of rookworld "
                       "positions, FEN or EPD a line)", shown="generated held-out positions of --seed"),
          eval_size=Meaning("positions of the best-move and mate-in-one suites: the first N of --data, or N generated",
                            SUITES_, shown="all of --data, or 128 generated", default=None),
          max_plies=Meaning("a game stops after this many half-moves (vs-stockfish counts it a draw)"),
          out=Meaning("the JSON file to write the results to: every suite's figures and, per position or game, what "
                      "the model wrote and how it scored"))
class EvalSettings(DataSettings, BadLinesSettings, EvalOnly, OpponentSettings, EvalSizeSettings, GameSettings,
                   ModelSettings, DecodingSettings, DecodeBatchSettings, SeedSettings, CompletionSettings,
                   OutputSettings, StockfishSettings, StockfishNodesSettings, Settings):
    # eval's decode batch had the training commands' name, which means rows per forward/backward there.
    renamed: ClassVar[dict[str, str]] = {"micro_batch_size": "decode_batch_size", "batch_size": "decode_batch_size"}
    gone: ClassVar[dict[str, str]] = {"samples": "--out holds every completion now"}


@group
class AskOnly:
    position: str = setting(None, "the position (quote it: a FEN has spaces)", POSITIONS, nargs="1", metavar="FEN")
    move: str | None = setting(None, "a move to play in it (UCI or SAN)", POSITIONS, nargs="?", metavar="MOVE")
    history: str = setting("", "UCI moves before MOVE, oldest first, for the A: prompt", POSITIONS)
    json: bool = setting(False, "print the answers as JSON", OUTPUT)


@composed(model=USED_MODEL, seed=SAMPLING_SEED)
class AskSettings(AskOnly, ModelSettings, DecodingSettings, SeedSettings, StockfishSettings, StockfishNodesSettings,
                  Settings):
    pass


@group
class PlayOnly:
    colour: str = setting("white", "your colour", GAME, choices=("white", "black"), aliases=("color",))
    fen: str | None = setting(None, "start from this position (a FEN) instead of the initial one", GAME)


@composed(max_plies=400, model=USED_MODEL, seed=SAMPLING_SEED)
class PlaySettings(PlayOnly, GameSettings, ModelSettings, DecodingSettings, SeedSettings, Settings):
    pass


@composed(model=USED_MODEL, seed=SAMPLING_SEED)
class UciSettings(ModelSettings, DecodingSettings, SeedSettings, CompletionSettings, Settings):
    pass


#: Sessions at once: each holds a Stockfish process of its own, and past a few hundred the machine, not the setting,
#: says no, in a way a client cannot read.
MAX_SESSIONS = 256


def port(option: str, value: int) -> str | None:
    return None if 0 <= value <= 65535 else f"{option} must lie in 0-65535, got {value}"


@group
class ServeOnly:
    host: str = setting("127.0.0.1", "the address to listen on (0.0.0.0: every interface, as in a container)",
                        SERVER)
    port: int = setting(8000, "the port to listen on (0: a free one, said at start)", SERVER, check=port)
    max_sessions: int = setting(8, "OpenEnv sessions served at once (each game's opponent is a Stockfish process "
                                   "of its own)", SERVER, check=positive, most=MAX_SESSIONS)


@composed()
class ServeSettings(ServeOnly, OpponentSettings, GameSettings, StockfishSettings, Settings):
    pass


@group
class PlotOnly:
    runs: list = setting([], "output directories of rookworld train or sft", RUNS, nargs="+", metavar="RUN_DIR")
    title: str | None = setting(None, "a title above the panels", OUTPUT)


@composed(out=Meaning("the PNG file to draw the curves into", shown="curves.png in the first RUN_DIR"))
class PlotSettings(PlotOnly, OutputSettings, Settings):
    pass


@dataclass(frozen=True)
class Command:
    """A subcommand as `rookworld --help` and its own `--help` describe it."""

    name: str
    settings: type[Settings]
    help: str
    description: str
    usage: str | None = None


COMMANDS = [
    Command("positions", PositionsSettings, "generate training positions (JSONL)",
            "Generate legal, unfinished chess positions, each with the moves that led to it and a move for an A: "
            "task. The same seed always gives the same positions."),
    Command("eval", EvalSettings, "measure a model: best move, mate-in-one, self-play, games against Stockfish",
            "Measures a model the way RookWorld reports its models. Suites (--suite, comma-separated): best-move "
            "(the default: P: best move, top 5, legal best move, candidate overlap, eval error and A: next state, "
            "FEN similarity, reward/terminated/truncated accuracy on held-out positions), mate-in-one (the B: move "
            "mates; and is Stockfish's move), selfplay (legal half-moves before the first illegal move, greedy and "
            "sampled), vs-stockfish (wins, draws, losses and the Elo difference against Stockfish at a fixed "
            "strength). --data is the positions file of best-move and mate-in-one (which keeps its positions that "
            "have a mate in one); without it, generated positions of streams no training run draws from (seed "
            "--seed). Decoding is greedy unless --protocol rookworld (temperature 0.6, top-k 5, as RookWorld's "
            "scripts); every report names its protocol."),
    Command("ask", AskSettings, "the model's answer for a position (P:), and for a move played in it (A:)",
            "Puts a position to the model: its P: answer (candidates, evals, best move), every move marked legal or "
            "not, and, when Stockfish is there, Stockfish's five and the reward the answer would get in training. "
            "With MOVE (UCI or SAN), also its A: answer for playing it, next to the true transition."),
    Command("play", PlaySettings, "play a game against the model in the terminal",
            "A game against the model. Type moves in UCI (e2e4) or SAN (e4, Nf3, O-O); 'quit' resigns. The model "
            "plays the B: move of its P: answer; when that is illegal it plays the legal move it finds most probable "
            "at its B:, and says so."),
    Command("uci", UciSettings, "the model as a UCI engine, for chess GUIs, cutechess-cli and lichess-bot",
            "Speaks UCI on standard input and output: a GUI, a tournament manager or lichess-bot runs `rookworld uci "
            "--model M` as an engine. The move is the B: move of the model's P: answer when it is legal, else the legal "
            "move the model finds most probable at its B: (an info string says which); "
            "the answer's candidates and evals are shown as info multipv lines. Options Protocol, Seed, Device and "
            "MultiPV (their defaults from the flags) are set with setoption."),
    Command("serve", ServeSettings, "serve chess as an OpenEnv environment: games against Stockfish, P:/A: tasks "
            "(needs OpenEnv: pip install 'rookworld[openenv]')",
            "An OpenEnv server (HTTP and WebSocket, as OpenEnv's EnvClient speaks it; rookworld.integrations.openenv "
            "has the typed client). Each session resets to a game against Stockfish (task game: step with a move in "
            "UCI or SAN, or a whole P: answer; a move's reward is rookworld's P: reward, plus the result's at the "
            "end; an illegal or unreadable move loses) or to one P: or A: prompt (task policy, env or mixed: step "
            "with the answer, rewarded as in training), from a FEN or the generated position of a seed. Sessions "
            "share one Stockfish pool for the rewards; each game has its own opponent engine, ended with its "
            "session. SIGTERM or Ctrl-C stops the server and every engine."),
    Command("train", TrainConfig, "fine-tune RookWorld-LM with GRPO on P: and A: tasks",
            "GRPO on mixed P:/A: chess tasks with verifiable rewards (Stockfish for P:, the rules for A:). Settings "
            "come from the defaults, then --config FILE.toml, then flags; --resume DIR continues a run with its "
            "saved settings (flags still override). Under torchrun it trains data-parallel.",
            usage="%(prog)s [--config FILE.toml] [--model DIR] [--output-dir DIR] [options]"),
    Command("sft", SFTConfig, "supervised training on P:/A: text (RookWorld datasets, or rookworld positions "
            "--annotate)",
            "Supervised training of a GPT-2 policy on RookWorld P:/A: samples, as RookWorld-LM was made: documents "
            "are [EOS] + text, one a row (or packed into full rows with --pack); continue a checkpoint (--model) or "
            "start a fresh GPT-2 (--init). The output directory holds the latest model, a --model for rookworld "
            "train. Settings, --config, --resume and torchrun work as for rookworld train.",
            usage="%(prog)s (--init SIZE | --model DIR) --data FILE [--output-dir DIR] [options]"),
    Command("plot", PlotSettings, "draw training curves of one or more runs (needs matplotlib: pip install "
            "'rookworld[plot]')",
            "Reads each RUN_DIR's metrics.jsonl and draws its curves (rewards per task, KL, losses, evaluation "
            "metrics) into one PNG, several runs overlaid, so settings compare by looking."),
]
