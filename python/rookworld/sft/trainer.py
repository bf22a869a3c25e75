"""`rookworld sft`: supervised training of a GPT-2 policy on P:/A: text, as RookWorld-LM itself was made.

One step reads `rows_per_step` rows (one document each, or packed; see `rookworld.sft.samples`), split over ranks and
micro-batches, and takes one AdamW step on the mean token NLL of the tokens the loss counts. The run around the
steps (device, DDP, checkpoints, resume, signals, logging) is `Run`'s, shared with `rookworld train`; the output
directory also holds the latest model itself, so it is a `--model` for `rookworld train` and for transformers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rookworld.chess.fields import FIELDS, parse_weights
from rookworld.chess.rewards import EVERY_MOVE, RewardScorer
from rookworld.chess.stockfish import Role, pool_for
from rookworld.harness.distributed import accumulating, data_parallel, unwrapped
from rookworld.harness.optimizer import step_if_finite
from rookworld.harness.run import Run
from rookworld.harness.runlog import fmt
from rookworld.lm.bestmove import heldout_records
from rookworld.lm.suites import training_metrics
from rookworld.net.device import peak_memory_gb, peak_tflops
from rookworld.net.head import NLL
from rookworld.net.logprobs import LogProbs, PassOptions, token_logprobs
from rookworld.net.memory import fresh_gpt
from rookworld.net.model import GPTConfig
from rookworld.net.tokenizer import vocabulary
from rookworld.settings.config import SFTConfig
from rookworld.sft.legality import LegalTokens, MoveSlots, SoftSlots, legal_loss, move_shares, soft_loss
from rookworld.sft.samples import Rows, collate, eval_rows, positions, read_samples, relayout, tokenize


def summary(m: dict[str, Any]) -> list[str]:
    """The summary line of an SFT step, after "step N/M"."""
    return [f"loss {fmt(m, 'loss', '{:.4f}')}", f"lr {fmt(m, 'lr', '{:.2e}')}", f"{fmt(m, 'time/step', '{:.2f}')} s",
            f"{fmt(m, 'tokens_per_s', '{:,.0f}')} tokens/s"]


def fresh_model(cfg: SFTConfig, vocab_size: int) -> nn.Module:
    """A GPT of --init's shape drawn from --seed, leaving the process's own generator as it was."""
    layers, heads, width = cfg.model_shape
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return fresh_gpt(GPTConfig(n_layer=layers, n_head=heads, n_embd=width, vocab_size=vocab_size),
                         cfg.device).eval()


def step_flops(model: nn.Module, tokens: float, counted: float, context: float) -> float:
    """Training FLOPs (forward and backward) of a step over `tokens` tokens, `counted` of them through the lm_head:
    6 per weight of the matmuls plus attention at `context` tokens (nanoGPT's estimate, the position table left
    out). The lm_head's share is counted only where it runs (see `token_logprobs`'s `scored`)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - c.block_size * c.n_embd
    head = c.vocab_size * c.n_embd
    return tokens * (6 * (n - head) + 12 * c.n_layer * c.n_embd * context) + counted * 6 * head


@dataclass(frozen=True)
class MicroBatchLoss:
    """What `SFTTrainer._loss` gives of one micro-batch."""

    nll: torch.Tensor  # the weighted NLL's sum over the normalizer, detached
    weight: float  # the sum of its tokens' weights
    legal: torch.Tensor | None  # the summed legality loss of its move slots (None without slots)
    logprobs: torch.Tensor  # [B, T - 1] each token's log-prob (0 where not counted), detached
    soft: torch.Tensor | None = None  # the summed soft best move loss of its chosen move's slots (None: none)


def every_move_shares(cfg: SFTConfig, fens: list[str], say) -> dict[str, dict[str, float]]:
    """For --soft-best-weight: q over each position's legal moves (`move_shares`) from Stockfish's analysis of every
    legal move at --stockfish-depth (in --stockfish-cache when given), by FEN as the P: prompts write it."""
    unique = list(dict.fromkeys(fens))
    say(f"soft best move: Stockfish's eval of every legal move of {len(unique):,} positions (depth "
        f"{cfg.stockfish_depth}{', cached in ' + cfg.stockfish_cache if cfg.stockfish_cache else ''}) ...")
    t0 = time.perf_counter()
    with pool_for(Role.ANALYSIS, path=cfg.stockfish_path, workers=cfg.stockfish_workers, depth=cfg.stockfish_depth,
                  cache_path=cfg.stockfish_cache, multipv=EVERY_MOVE) as pool:
        analyses = pool.analyse(unique)
    say(f"soft best move: analysed in {time.perf_counter() - t0:.0f} s")
    return {fen: move_shares(list(zip(a.moves, a.evals)), cfg.soft_best_temperature)
            for fen, a in zip(unique, analyses) if a.candidates}


class SFTTrainer:
    def __init__(self, cfg: SFTConfig, *, stream=None, tokenizer=None, process_settings: bool = False):
        self.cfg = cfg
        data = read_samples(cfg.data, cfg.skip_bad)  # a bad line is reported before any model is loaded
        held_out = read_samples([cfg.eval_data], cfg.skip_bad) if cfg.eval_data else None
        policy, label = None, None
        if cfg.init is not None and cfg.resume is None:
            tokenizer = tokenizer or vocabulary(cfg.vocabulary)
            policy = fresh_model(cfg, tokenizer.vocab_size)
        if cfg.init is not None:
            layers, heads, width = cfg.model_shape
            label = f"a fresh GPT-2 {cfg.init}: {layers} layers, {heads} heads, {width} wide"
            if cfg.vocabulary != "gpt2":
                label += f", the {cfg.vocabulary} vocabulary"
        self.run = run = Run(cfg, command="sft", policy=policy, tokenizer=tokenizer, stream=stream, summary=summary,
                             label=label, process_settings=process_settings)
        for line in data.report():
            run.log.say(f"warning: --data: {line}")
        if held_out is not None:
            for line in held_out.report():
                run.log.say(f"warning: --eval-data: {line}")
        # P: text in each file's own layout, or rewritten in --layout's.
        ranked = cfg.candidate_order == "ranked"
        laid_out = (lambda samples: samples) if cfg.layout is None else (
            lambda samples: relayout(samples, cfg.layout, ranked))
        self.docs = tokenize(laid_out(data.samples), run.tokenizer, cfg.loss_on, parse_weights(cfg.field_weights))
        self.rows = Rows(self.docs, cfg.seq_len, cfg.pack, cfg.seed)
        n_tokens = sum(len(d) for d in self.docs.ids)
        tasks = [s.task for s in data.samples]
        rows = f"rows of {cfg.seq_len}" if cfg.pack else "rows (a document each)"
        run.log.say(f"data: {len(tasks)} samples ({tasks.count('P')} P:, {tasks.count('A')} A:), {n_tokens:,} "
                    f"tokens, {self.rows.per_pass} {rows} a pass; {cfg.rows_per_step} rows a step, "
                    f"loss on {cfg.loss_on} tokens")
        # The hidden states kept for the legality loss, which reads the move slots' logits off them.
        options = PassOptions(compile=run.context.compile_logprobs, keep_hidden=not cfg.pack)
        self.policy_pass = LogProbs(run.policy, options)
        self.policy_pass = data_parallel(self.policy_pass, run.device, run.dist.enabled)
        run.build_optimizer()
        self.eval_docs = tokenize(laid_out(held_out.samples), run.tokenizer, cfg.loss_on) if held_out else None
        self.eval_records = positions(held_out.samples, cfg.eval_size) if held_out else None
        self.pool = None
        # Also measured (held-out) when it is not trained on, so runs with and without it compare.
        self.legal = LegalTokens(run.tokenizer) if not cfg.pack else None
        self.shares = every_move_shares(cfg, [p[0] for p in self.docs.policy if p is not None], run.log.say) \
            if cfg.soft_best_weight > 0 else {}
        # The card's dense bf16 peak, for MFU: None off CUDA or for a card whose peak is not known.
        self.peak_tflops = peak_tflops(torch.cuda.get_device_name(run.device)) if run.device.type == "cuda" else None

    def _slots(self, batch, docs: list[int | None], documents) -> MoveSlots | None:
        """The move slots of a micro-batch's rows (`docs`: the document each row holds), for the legality loss."""
        if self.legal is None:
            return None
        policy = [None if d is None else documents.policy[d] for d in docs]
        return self.legal.batch([None if p is None else (*p, ids) for p, (ids, _) in zip(policy, batch)],
                                self.run.device)

    def _soft_slots(self, batch, docs: list[int | None]) -> SoftSlots | None:
        """The chosen move's slots of a micro-batch's training rows with their soft targets (--soft-best-weight)."""
        if not self.shares:
            return None
        policy = [None if d is None else self.docs.policy[d] for d in docs]
        return self.legal.soft_batch([None if p is None or p[0] not in self.shares else (self.shares[p[0]], p[1], ids)
                                      for p, (ids, _) in zip(policy, batch)], self.run.device,
                                     self.cfg.choice_slot)

    def _loss(self, batch, normalizer: float, backward: bool, slots: MoveSlots | None = None,
              soft: SoftSlots | None = None, aux_normalizers: tuple[float, float] = (1.0, 1.0)) -> MicroBatchLoss:
        """One micro-batch of rows: its weighted NLL over normalizer, the legality loss of its move slots and the soft
        best move's of its chosen move's slots. With backward, it takes --legal-weight x legal and --soft-best-weight x soft
        over their `aux_normalizers` too."""
        dev = self.run.device
        ids, weights = (torch.from_numpy(a).to(dev) for a in collate(batch, self.run.tokenizer.pad_id))
        weights = weights[:, 1:]
        counted = weights > 0
        # Rows are right-padded, so under plain causal attention no real token sees a pad: no attention mask,
        # and SDPA may take its fused causal kernel. Only counted positions go through the lm_head.
        keep = (slots is not None and len(slots) > 0) or (soft is not None and len(soft) > 0)
        options = PassOptions(compile=self.run.context.compile_logprobs, keep_hidden=keep)
        with self.run.autocast():
            if backward:  # the NLL's gradients made in the same pass over the vocabulary
                out = self.policy_pass(ids, None, 1, wanted=counted, loss=NLL(normalizer, weights.reshape(-1)))
                nll = out.loss
            else:
                out = token_logprobs(self.run.policy, ids, None, options, wanted=counted)
                nll = -(out.logprobs.float() * weights).sum() / normalizer
            # out.hidden[:, j - 1] predicts token j
            head = lambda at: self.run.policy.lm_head(out.hidden[at.rows, at.columns - 1])  # noqa: E731
            legal = legal_loss(head(slots), slots.allowed).sum() if slots is not None and len(slots) else None
            soft_sum = soft_loss(head(soft), soft.target).sum() if soft is not None and len(soft) else None
        if backward:
            total = nll
            for term, w, n in ((legal, self.cfg.legal_weight, aux_normalizers[0]),
                               (soft_sum, self.cfg.soft_best_weight, aux_normalizers[1])):
                if term is not None and w > 0:
                    total = total + w * term / n
            total.backward()
        return MicroBatchLoss(nll.detach(), float(weights.sum()), None if legal is None else legal.detach(),
                              out.logprobs.detach(), None if soft_sum is None else soft_sum.detach())

    def train_step(self) -> dict[str, Any]:
        cfg, run = self.cfg, self.run
        t0 = time.perf_counter()
        if run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(run.device)
        per_rank = cfg.rows_per_step // run.dist.world
        first = run.step * cfg.rows_per_step + run.dist.rank * per_rank
        rows = [self.rows.row(first + i) for i in range(per_rank)]
        docs = [self.rows.document(first + i) for i in range(per_rank)]
        # The weighted token mean is over every rank's tokens: DDP averages the ranks' gradients.
        weight, counted = run.comm.sum([float(sum(w[1:].sum() for _, w in rows)),
                                        float(sum((w[1:] > 0).sum() for _, w in rows))])
        run.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=run.device)
        cuts = range(0, len(rows), cfg.micro_batch_size)
        micro = [rows[i : i + cfg.micro_batch_size] for i in cuts]
        slots = [self._slots(batch, docs[i : i + cfg.micro_batch_size], self.docs) if cfg.legal_weight > 0 else None
                 for i, batch in zip(cuts, micro)]
        soft = [self._soft_slots(batch, docs[i : i + cfg.micro_batch_size]) for i, batch in zip(cuts, micro)]
        # The legality and soft losses are means over every rank's slots, as the NLL is over their tokens.
        n_slots, n_soft = run.comm.sum([float(sum(len(s) for s in slots if s is not None)),
                                        float(sum(len(s) for s in soft if s is not None))])
        aux = (max(n_slots, 1.0) / run.dist.world, max(n_soft, 1.0) / run.dist.world)
        legal_total, soft_total = torch.zeros((), device=run.device), torch.zeros((), device=run.device)
        for j, (batch, batch_slots, batch_soft) in enumerate(zip(micro, slots, soft)):
            with accumulating(self.policy_pass, last=j == len(micro) - 1):
                part = self._loss(batch, max(weight, 1e-12) / run.dist.world, backward=True, slots=batch_slots,
                                  soft=batch_soft, aux_normalizers=aux)
            total += part.nll
            if part.legal is not None:
                legal_total += part.legal
            if part.soft is not None:
                soft_total += part.soft
        params = [p for g in run.optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
        with run.writing():  # from the first weight changed to the counter, a step is done whole
            step_if_finite(run.optimizer, norm, total)
            lr = run.optimizer.param_groups[0]["lr"]
            run.scheduler.step()
            if run.device.type == "cuda":
                torch.cuda.synchronize(run.device)
            step_time = time.perf_counter() - t0
            loss, grad_norm = run.comm.mean([float(total), float(norm)])
            run.step += 1
        all_tokens = run.comm.sum([float(sum(len(i) for i, _ in rows))])[0]
        context = cfg.seq_len if cfg.pack else all_tokens / (per_rank * run.dist.world)
        # Each rank's `total` is its share of the global token mean times the number of ranks (for DDP's
        # averaging), so their mean is the global mean.
        m = {"step": run.step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": all_tokens / step_time,
             "time/step": step_time, "peak_memory_gb": peak_memory_gb(run.device)}
        if cfg.legal_weight > 0:
            m["legal_loss"] = run.comm.sum([float(legal_total)])[0] / max(n_slots, 1.0)
        if cfg.soft_best_weight > 0:
            m["soft_best_loss"] = run.comm.sum([float(soft_total)])[0] / max(n_soft, 1.0)
        if self.peak_tflops is not None:
            flops = step_flops(self.run.policy, all_tokens, counted, context)
            m["mfu"] = flops / step_time / (run.dist.world * self.peak_tflops * 1e12)
        return m

    def _heldout_loss(self) -> dict[str, float]:
        """The token mean NLL on --eval-data's samples (every target token weighs 1, whatever --field-weights
        says, so that runs compare), the legal mass of their move slots, and with one document a row each field's
        own mean NLL (`rookworld.chess.fields`)."""
        cfg, docs = self.cfg, self.eval_docs
        rows = eval_rows(docs, cfg.seq_len, cfg.pack)
        total = counted = legal = 0.0
        n_slots = 0
        by_field = np.zeros((2, len(FIELDS) + 1))  # [summed NLL, tokens] per field number
        for i in range(0, len(rows), cfg.micro_batch_size):
            batch = rows[i : i + cfg.micro_batch_size]
            slots = self._slots(batch, list(range(i, i + len(batch))), docs)  # row d is document d
            part = self._loss(batch, 1.0, backward=False, slots=slots)
            total, counted = total + float(part.nll), counted + part.weight
            if part.legal is not None:
                legal, n_slots = legal + float(part.legal), n_slots + len(slots)
            if not cfg.pack:
                nll = -part.logprobs.float().cpu().numpy()
                for r, (_, weights) in enumerate(batch):
                    fields, keep = docs.fields[i + r][1:], weights[1:-1] > 0  # token j's NLL is nll[r, j - 1]
                    np.add.at(by_field[0], fields[keep], nll[r, : len(fields)][keep])
                    np.add.at(by_field[1], fields[keep], 1.0)
        m = {"eval/loss": total / max(counted, 1.0)}
        if n_slots:
            # exp(-mean legality loss): the geometric mean of the probability a move token gives to legal moves
            m["eval/legal_mass"] = math.exp(-legal / n_slots)
        for f, name in enumerate(FIELDS, 1):
            if by_field[1, f]:
                m[f"eval/field_loss/{name}"] = by_field[0, f] / by_field[1, f]
        return m

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """The loss on --eval-data's samples, and the --eval-suites on its positions (or the generated held-out
        ones)."""
        cfg, m = self.cfg, {}
        if self.eval_docs is not None:
            m.update(self._heldout_loss())
        records = self.eval_records or heldout_records(cfg.eval_size, cfg.seed)
        if self.pool is None and any(r.analysis is None for r in records):

            self.pool = pool_for(Role.ANALYSIS, path=cfg.stockfish_path, workers=cfg.stockfish_workers,
                                 depth=cfg.stockfish_depth, cache_path=cfg.stockfish_cache)
        m.update(training_metrics(self.run.policy, self.run.tokenizer, cfg, records, RewardScorer(self.pool),
                                  compile=self.run.context.compile))
        return m

    def train(self) -> dict[str, Any]:
        """The run: SFT steps to --steps, each logged, and evaluated and saved when due; a stop asked for ends it
        after the step in progress, saved. Returns the last step's metrics."""
        cfg, run, last = self.cfg, self.run, {}
        if not run.begin():
            return {}
        with run.looping():
            last_eval = run.first_evaluation(self.evaluate)
            while run.step < cfg.steps and not run.interrupted:
                m = run.step_or_keep(self.train_step, dict, dict)
                if m is None:
                    break
                if run.due(cfg.eval_every) and run.evaluate(self.evaluate, m):
                    last_eval = m
                run.record(m)
                if cfg.save_every and run.step % cfg.save_every == 0:
                    run.save({})
                last = m
                if run.stop_asked():
                    break
            run.finish({}, {}, last_eval)
        return last

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.policy_pass = unwrapped(self.policy_pass)  # before the process group goes (`Comm.close`)
        self.run.comm.close()
        self.run.close()  # the output directory is free for the next run, in this process too
