"""Evaluation suites, measured the way RookWorld reports its models, and one report for all of them.

- `best-move`: P: and A: answers on held-out positions (`rookworld.lm.bestmove`);
- `mate-in-one`: positions where the side to move mates in one; solved when the B: move mates (any mating move,
  as Lichess puzzles count), with the share whose B: is Stockfish's move beside it (BIG-bench's target);
- `selfplay`: the model plays both sides from the start and from opening-book positions, greedy and sampled;
  legal half-moves before its first illegal or unreadable move, as RookWorld counts them;
- `vs-stockfish`: games against Stockfish at a fixed strength, colours alternating, the model's moves chosen as
  `rookworld uci` chooses them (`rookworld.lm.moves`: never illegal); wins, draws and losses with the Elo
  difference and its 95% interval, and how often the model's own B: move was illegal (legality stays measured);
- `ladder`: the model's rating, with its 95% interval, against a pool of opponents from a random mover up to
  Stockfish's UCI_Elo levels, in one fit of every game (`rookworld.lm.ladder`).

Each suite returns a `SuiteResult`: sections of metrics (a section is also the metrics' namespace in training's
`eval/...` curves) and one item per position or game, holding what is needed to check any figure by hand.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rookworld.chess import rules
from rookworld.io.quote import quoted
from rookworld.lm.answers import GREEDY, ROOKWORLD, Decoding, RookWorldLM
from rookworld.lm.bestmove import evaluate, position_outcomes
from rookworld.lm.games import (BLACK, WHITE, Game, ModelPlayer, StockfishPlayer, elo_difference, model_score,
                                play_games)
from rookworld.lm.ladder import ladder_games, run_ladder
from rookworld.lm.moves import LIKELIEST
from rookworld.settings.groups import SUITES, parse_suites

#: Seed offsets of the suites' own positions: streams no training run or other suite draws from.
MATE_SEED_OFFSET = 2_000_003
OPENING_SEED_OFFSET = 3_000_017


@dataclass
class SuiteResult:
    suite: str
    #: The decoding protocol(s) the figures were measured with.
    protocol: str
    #: Section name -> metrics; "n" is the positions or games a section counts.
    sections: dict[str, dict[str, Any]]
    items: list[dict] = field(default_factory=list)
    #: What the positions or the opponent were, for the report's header.
    about: str = ""

    def metrics(self) -> dict[str, Any]:
        """Flat `section/metric` figures, as training logs them under eval/."""
        return {f"{section}/{k}": v for section, m in self.sections.items() for k, v in m.items()}

    def to_dict(self) -> dict:
        return _finite({"suite": self.suite, "protocol": self.protocol, "about": self.about,
                        "sections": self.sections, "items": self.items})


def _finite(obj):
    """JSON has no infinities: an unbounded Elo interval is written as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# -- best move ------------------------------------------------------------------------------------------------------

def best_move(lm: RookWorldLM, records, scorer, *, tasks=("P", "A"), decoding: Decoding = GREEDY, seed: int = 0,
              about: str = "", progress=None) -> SuiteResult:

    sections, items = evaluate(lm.model, lm.tokenizer, records, scorer, tasks=tasks, decoding=decoding, seed=seed,
                               batch_size=lm.batch_size, max_new_tokens=lm.max_new_tokens, compile=lm.compile,
                               progress=progress)
    return SuiteResult("best-move", decoding.name, sections, items, about)


# -- mate in one ----------------------------------------------------------------------------------------------------

def mate_positions(size: int, seed: int) -> list[tuple[str, list[str]]]:
    """`size` generated positions with a mate in one, (fen, its mating moves), of a stream of their own."""
    return [(p.fen, list(p.mates)) for p in rules.mate_in_one_positions(size, seed + MATE_SEED_OFFSET)]


def mates_of(fens: Sequence[str]) -> tuple[list[tuple[str, list[str]]], int]:
    """The positions of a file that have a mate in one, with their mating moves, and how many had none."""
    found = [(f, m) for f, m in zip(fens, rules.mating_moves_batch(fens)) if m]
    return found, len(fens) - len(found)


def mate_in_one(lm: RookWorldLM, positions: Sequence[tuple[str, list[str]]], *, decoding: Decoding = GREEDY,
                seed: int = 0, stockfish=None, about: str = "", progress=None) -> SuiteResult:
    """Solved when the B: move mates; `stockfish` (a StockfishPool), when given, adds the share whose B: is
    Stockfish's first move."""
    fens = [f for f, _ in positions]
    if progress is not None:
        progress.total = len(fens)
    answers = lm.policy(fens, decoding=decoding, seed=seed, progress=progress)
    engine_moves = ([a.candidates[0].move if a.candidates else None for a in stockfish.analyse(fens)]
                    if stockfish is not None else [None] * len(fens))
    legal = rules.is_legal(fens, [a.best or "" for a in answers])
    items = []
    for (fen, mates), a, ok, sf in zip(positions, answers, legal, engine_moves):
        items.append({"fen": fen, "mates": mates, "completion": a.text, "best": a.best, "legal": ok,
                      "mate": a.best in mates, "stockfish": sf, "stockfish_match": None if sf is None else a.best == sf,
                      "mate_in_candidates": any(m in mates for m in a.moves)})
    m = {"n": len(items), "format_valid": _mean([a.well_formed for a in answers]),
         "mate_rate": _mean([i["mate"] for i in items]),
         "stockfish_match": _mean([i["stockfish_match"] for i in items]) if stockfish is not None else None,
         "legal_best_move": _mean([i["legal"] for i in items]),
         "mate_in_candidates": _mean([i["mate_in_candidates"] for i in items])}
    return SuiteResult("mate-in-one", decoding.name, {"mate-in-one": m}, items, about)


# -- self-play ------------------------------------------------------------------------------------------------------

def opening_fens(games: int, seed: int) -> list[str]:
    """The start position, then `games` - 1 positions along the opening book's lines (seeded)."""
    book = rules.generate_positions(max(games - 1, 0), seed + OPENING_SEED_OFFSET, opening_share=1.0,
                                    endgame_share=0.0, illegal_share=0.0)
    return [rules.START_FEN, *(p.fen for p in book)][:games]


def selfplay_metrics(games: Sequence[Game]) -> dict[str, Any]:
    """RookWorld's count: legal half-moves before the first illegal or unreadable move; the illegal share is
    of the moves attempted."""
    legal = [len(g.moves) for g in games]
    illegal = sum(g.illegal_by is not None for g in games)
    return {"n": len(games), "legal_half_moves": _mean(legal),
            "illegal_share": illegal / max(sum(legal) + illegal, 1),
            "games_with_result": _mean([g.result is not None and g.illegal_by is None for g in games]),
            "ended_by_illegal": _mean([g.illegal_by is not None for g in games]),
            "ply_limit": _mean([g.reason == "ply limit" for g in games])}


def selfplay(lm: RookWorldLM, *, games: int, seed: int = 0, max_plies: int = 200,
             decodings: Sequence[Decoding] = (GREEDY, ROOKWORLD), progress=None) -> SuiteResult:
    """The model plays both sides from each start position, once per decoding."""
    starts = opening_fens(games, seed)
    _count_games(progress, len(starts) * len(decodings))
    sections, items = {}, []
    for decoding in decodings:
        played = [Game(start_fen=f) for f in starts]
        play_games(played, [ModelPlayer(lm, decoding, seed=seed)], lambda g: 0, max_plies=max_plies,
                   progress=progress)
        sections[f"selfplay/{decoding.name}"] = selfplay_metrics(played)
        items.extend({"decoding": decoding.name, **g.to_dict()} for g in played)
    return SuiteResult("selfplay", "+".join(d.name for d in decodings), sections, items,
                       f"{len(starts)} start positions (the start and the opening book), up to {max_plies} plies")


def _count_games(progress, games: int) -> None:
    """A suite's bar counts games as they end. How long a game lasts is not known before it ends (a few moves, or
    the ply limit): its bar shows no time left, where a bound of every game at the ply limit said an hour for a
    suite of three minutes."""
    if progress is not None:
        progress.total = games
        progress.shows_eta = False


# -- against Stockfish ----------------------------------------------------------------------------------------------

def _share(sources: Sequence[str], wanted: tuple[str, ...]) -> float | None:
    return sum(s in wanted for s in sources) / len(sources) if sources else None


def vs_stockfish(player, opponent, *, games: int, seed: int = 0, max_plies: int = 200,
                 decoding_name: str = "greedy", progress=None) -> SuiteResult:
    """`games` games of `player` against `opponent` (any `games.Player`), in pairs from the same start position
    with the colours swapped. The model's moves are counted by where they came from: its own B: move, or a
    fall-back to a candidate or to its likeliest legal move."""
    starts = opening_fens((games + 1) // 2, seed)
    played = [Game(start_fen=starts[i // 2]) for i in range(games)]
    _count_games(progress, len(played))
    colour = {id(g): WHITE if i % 2 == 0 else BLACK for i, g in enumerate(played)}
    play_games(played, [player, opponent], lambda g: 0 if g.turn == colour[id(g)] else 1, max_plies=max_plies,
               progress=progress)
    scores = [model_score(g, colour[id(g)]) for g in played]
    wins, draws, losses = scores.count(1.0), scores.count(0.5), scores.count(0.0)
    elo, low, high = elo_difference(wins, draws, losses)
    m = {"n": len(played), "wins": wins, "draws": draws, "losses": losses, "score": _mean(scores),
         "elo_difference": elo, "elo_low": low, "elo_high": high,
         "lost_by_illegal": sum(g.illegal_by == colour[id(g)] for g in played),
         "ply_limit": _mean([g.reason == "ply limit" for g in played])}
    sources = [s for g in played for s in g.sources if s is not None]
    m |= {"model_moves": len(sources), "own_move_illegal": _share(sources, (LIKELIEST,)),
          "games_all_own": _mean([LIKELIEST not in g.sources for g in played]),
          # the opponent's crashes survived (StockfishPlayer restarts its engine and asks again)
          "opponent_restarts": getattr(opponent, "restarts", 0)}
    items = [{"model_colour": colour[id(g)], "score": s, **g.to_dict()} for g, s in zip(played, scores)]
    return SuiteResult("vs-stockfish", decoding_name, {"vs-stockfish": m}, items,
                       f"against {opponent.name}, up to {max_plies} plies")


def ladder(lm: RookWorldLM, opts: SuiteOptions, progress=None) -> SuiteResult:
    """The model's rating on the ladder (`rookworld.lm.ladder`), its moves chosen as vs-stockfish chooses them."""
    _count_games(progress, ladder_games(opts.games))
    player = ModelPlayer(lm, opts.decoding, seed=opts.seed, fallback=True)
    sections, items, about = run_ladder(player, opening_fens((opts.games + 1) // 2, opts.seed), games=opts.games,
                                        seed=opts.seed, max_plies=opts.max_plies, stockfish_path=opts.stockfish_path,
                                        progress=progress)
    return SuiteResult("ladder", opts.decoding.name, sections, items, about)


# -- running several, and the report ---------------------------------------------------------------------------------

@dataclass
class SuiteOptions:
    """What the suites need beyond the model: shared by `rookworld eval` and training's periodic evaluation."""

    size: int = 128
    games: int = 8
    seed: int = 0
    max_plies: int = 200
    tasks: tuple[str, ...] = ("P", "A")
    decoding: Decoding = GREEDY
    opponent_elo: int | None = 1350
    opponent_skill: int | None = None
    opponent_nodes: int = 20_000
    stockfish_path: str | None = None


def run_suites(lm: RookWorldLM, names: Sequence[str], opts: SuiteOptions, *, records=None, scorer=None,
               mate_fens: Sequence[str] | None = None, progress: Callable[[str, int, str], Any] | None = None
               ) -> list[SuiteResult]:
    """Each named suite in turn. `records` and `scorer` serve best-move (and `scorer.stockfish` mate-in-one's
    Stockfish column); `mate_fens` replaces the generated mate-in-one positions. `progress(label, total, unit)`
    makes a progress bar for a suite (a context manager), or None."""
    def bar(label, total, unit):
        return progress(label, total, unit) if progress is not None else contextlib.nullcontext()

    out = []
    for name in names:
        if name == "best-move":
            with bar("best-move", len(records), "prompts") as p:
                out.append(best_move(lm, records, scorer, tasks=opts.tasks, decoding=opts.decoding, seed=opts.seed,
                                     progress=p))
        elif name == "mate-in-one":
            if mate_fens is None:
                positions, about = mate_positions(opts.size, opts.seed), f"generated, seed {opts.seed}"
            else:
                positions, none = mates_of(list(mate_fens))
                about = f"from a file; {none} position(s) without a mate in one left out" if none else "from a file"
            with bar("mate-in-one", len(positions), "positions") as p:
                out.append(mate_in_one(lm, positions, decoding=opts.decoding, seed=opts.seed,
                                       stockfish=scorer.stockfish if scorer is not None else None, about=about,
                                       progress=p))
        elif name == "selfplay":
            with bar("selfplay", 2 * opts.games, "games") as p:
                out.append(selfplay(lm, games=opts.games, seed=opts.seed, max_plies=opts.max_plies, progress=p))
        elif name == "vs-stockfish":
            player = ModelPlayer(lm, opts.decoding, seed=opts.seed, fallback=True)
            with StockfishPlayer(opts.stockfish_path, elo=opts.opponent_elo, skill=opts.opponent_skill,
                                 nodes=opts.opponent_nodes) as opponent, \
                    bar("vs-stockfish", opts.games, "games") as p:
                out.append(vs_stockfish(player, opponent, games=opts.games, seed=opts.seed,
                                        max_plies=opts.max_plies, decoding_name=opts.decoding.name, progress=p))
        elif name == "ladder":
            with bar("ladder", ladder_games(opts.games), "games") as p:
                out.append(ladder(lm, opts, p))
        else:
            raise ValueError(f"unknown suite {quoted(name)}: choose from {', '.join(SUITES)}")
    return out


#: Where training_metrics puts the best-move suite's outcome per position (position_outcomes), which the run
#: writes to held-out.jsonl, not to metrics.jsonl.
OUTCOMES_KEY = "eval/outcomes"


def training_metrics(model, tokenizer, cfg, records, scorer, *, compile: bool | None = None) -> dict[str, Any]:
    """Training's periodic evaluation: the config's --eval-suites, as eval/<section>/<metric> (best-move's
    sections are the tasks: eval/P/..., eval/A/...)."""
    lm = RookWorldLM(model, tokenizer, batch_size=cfg.decode_batch_size, max_new_tokens=cfg.max_new_tokens,
                     compile=compile)
    opts = SuiteOptions(size=cfg.eval_size, games=cfg.eval_games, seed=cfg.seed, stockfish_path=cfg.stockfish_path)
    results = run_suites(lm, parse_suites(cfg.eval_suites), opts, records=records, scorer=scorer)
    m: dict[str, Any] = {f"eval/{k}": v for r in results for k, v in r.metrics().items()}
    for r in results:
        if r.suite == "best-move":
            m[OUTCOMES_KEY] = position_outcomes(r.items)
    return m


_PERCENT, _FLOAT, _COUNT, _ELO, _RATING = "percent", "float", "count", "elo", "rating"
_LABELS: dict[str, tuple[str, str]] = {
    "format_valid": ("format valid", _PERCENT), "mean_reward": ("mean reward", _FLOAT),
    "best_move_accuracy": ("best move", _PERCENT), "top5_accuracy": ("best move in top 5", _PERCENT),
    "legal_best_move": ("legal best move", _PERCENT), "candidate_overlap": ("candidate overlap", _PERCENT),
    "eval_mae": ("eval MAE (pawns)", _FLOAT), "next_state_exact": ("next state exact", _PERCENT),
    "fen_similarity": ("FEN similarity", _PERCENT), "reward_accuracy": ("reward accuracy", _PERCENT),
    "terminated_accuracy": ("terminated accuracy", _PERCENT), "truncated_accuracy": ("truncated accuracy", _PERCENT),
    "mate_rate": ("B: mates", _PERCENT), "stockfish_match": ("B: is Stockfish's move", _PERCENT),
    "mate_in_candidates": ("a mate among M:", _PERCENT),
    "legal_half_moves": ("legal half-moves", _FLOAT), "illegal_share": ("illegal moves", _PERCENT),
    "games_with_result": ("games with a result", _PERCENT), "ended_by_illegal": ("ended by an illegal move", _PERCENT),
    "ply_limit": ("stopped at the ply limit", _PERCENT),
    "wins": ("wins", _COUNT), "draws": ("draws", _COUNT), "losses": ("losses", _COUNT), "score": ("score", _PERCENT),
    "elo_difference": ("Elo difference", _ELO), "elo_low": ("  95% low", _ELO), "elo_high": ("  95% high", _ELO),
    "lost_by_illegal": ("lost by an illegal move", _COUNT), "model_moves": ("the model's moves", _COUNT),
    "own_move_illegal": ("its own B: move illegal", _PERCENT),
    "games_all_own": ("games without an illegal B: of its own", _PERCENT),
    "opponent_restarts": ("opponent restarts", _COUNT),
    "rating": ("rating (Elo)", _RATING), "rating_low": ("  95% low", _RATING), "rating_high": ("  95% high", _RATING),
}
_TITLES = {"P": ("P: policy", "positions"), "A": ("A: environment", "positions"),
           "mate-in-one": ("mate-in-one", "positions"), "vs-stockfish": ("vs-stockfish", "games"),
           "ladder": ("ladder: the model", "games")}


def _value(value, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if kind == _PERCENT:
        return f"{100 * value:.1f}%"
    if kind == _COUNT:
        return str(int(value))
    if kind == _ELO:
        return f"{value:+.0f}" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")
    if kind == _RATING:
        return f"{value:.0f}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def format_report(results: Sequence[SuiteResult]) -> str:
    """One table for every suite; each section names its protocol, so no figure is read under another's."""
    lines = []
    for r in results:
        for k, (section, m) in enumerate(r.sections.items()):
            title, unit = _TITLES.get(section, (section, "games"))
            protocol = section.split("/", 1)[1] if section.startswith("selfplay/") else r.protocol
            about = f": {r.about}" if r.about and k == 0 else ""  # once a suite, with its first section
            lines.append(f"{title} ({m['n']} {unit}, {protocol}){about}")
            for key, value in m.items():
                if key == "n" or (key == "stockfish_match" and value is None):
                    continue
                label, kind = _LABELS.get(key, (key, _FLOAT))
                lines.append(f"  {label:<26} {_value(value, kind):>8}")
    return "\n".join(lines)
