"""The trunk's products that eager decoding made on the CPU, kept so that the update's first pass over the same tokens,
with the same weights, takes them instead of making them again: with one minibatch and one epoch (the defaults), the
update's forward then costs its LayerNorms, attention and GELUs, not its products. Its backward is the same.

The memo reaches the model as an argument of the pass (`GPT.trunk(..., products=)`, a `Products`): sampling gives
each pass `memo.recording(model, where)`, the update's pass `Replay.phase(model, name)`. Only a CPU model takes one
(`ProductMemo.fits`), so no CUDA path and no compiled region ever sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rookworld.net.model import GPT, GPTConfig, Linear, linear, linear_grads, wants_grad


class _Replayed(torch.autograd.Function):
    """A product already made (by sampling, with the same weights): its value as it was, a Linear's gradients."""

    @staticmethod
    def forward(ctx, x, weight, bias, y):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        return (*linear_grads(dy, x, weight, ctx.needs_input_grad, ctx.has_bias), None)


class ProductMemo:
    """Layout, for each trunk Linear by name: `prompts` [g, P, N] (prefill's: g prompts over their last P columns)
    and `completions` [B, n, N] (column j: the product for completion token j, made when decoding fed that token;
    zero where decoding never fed it: a row's last token or a dropped group's, whose products no loss term reaches).

    Recording: `generate(..., memo=memo)`; the prefill and each decode step take `recording(model, where)`.
    Replaying: `Replay(memo, rows, left, width).phase(model, "prompt" | "completion")`, the products of the
    update's `GPT.prompt_trunk` and `GPT.continue_trunk` of the model that sampled.
    """

    def __init__(self, rows: int, new_tokens: int, rows_per_prompt: int, prompt_left: int):
        self.shape, self.rows_per_prompt, self.prompt_left = (rows, new_tokens), rows_per_prompt, prompt_left
        self.prompts: dict[str, torch.Tensor] = {}
        self.completions: dict[str, torch.Tensor] = {}
        self._names: dict[nn.Module, str] | None = None
        self._model: GPT | None = None

    @staticmethod
    def fits(model: GPT) -> bool:
        """Whether a memo may serve `model`: on the CPU, without dropout (the update's pass would drop what
        sampling did not)."""
        return model.device.type == "cpu" and model.config.dropout == 0

    @staticmethod
    def bytes_needed(config: GPTConfig, prompts: int, prompt_width: int, rows: int, new_tokens: int) -> int:
        """What a memo of these shapes holds, in float32."""
        widths = config.n_layer * 9 * config.n_embd  # c_attn 3C, attn c_proj C, c_fc 4C, mlp c_proj C
        return 4 * widths * (prompts * prompt_width + rows * new_tokens)

    def recording(self, model: GPT, where: tuple) -> _Recording:
        """The `Products` of one sampling pass of `model`: each made, and kept at `where`: ("prompt",) for the
        prefill, ("column", rows [b] long, j) for decoding's step j."""
        return _Recording(self, self._named(model), where)

    def _named(self, model: GPT) -> dict[nn.Module, str]:
        """Each trunk Linear of `model`, by module: its name, the key of its products."""
        if not self.fits(model):
            raise ValueError(f"a ProductMemo serves CPU models without dropout, not one on {model.device}")
        if self._names is None or self._model is not model:
            self._names = {m: name for name, m in model.transformer.named_modules() if isinstance(m, Linear)}
            self._model = model
        return self._names


@dataclass(frozen=True)
class _Recording:
    """A sampling pass's `Products`: each made, and kept in the memo at `where`."""

    memo: ProductMemo
    names: dict[nn.Module, str]
    where: tuple

    def product(self, module: Linear, x: torch.Tensor) -> torch.Tensor:
        y, key, memo = linear(x, module.weight, module.bias), self.names[module], self.memo
        if self.where[0] == "prompt":
            memo.prompts[key] = y
            return y
        _, rows, j = self.where
        buf = memo.completions.get(key)
        if buf is None:
            buf = memo.completions[key] = y.new_zeros(*memo.shape, y.shape[-1])
        buf[rows, j] = y.reshape(len(rows), -1)
        return y


@dataclass(frozen=True)
class _Replaying:
    """An update pass's `Products`: each taken from the memo, as `replay` says, with the Linear's gradients."""

    replay: Replay
    names: dict[nn.Module, str]
    phase: str

    def product(self, module: Linear, x: torch.Tensor) -> torch.Tensor:
        r, key, shape = self.replay, self.names[module], x.shape[:-1]
        memo = r.memo
        if self.phase == "prompt":
            y = memo.prompts[key][r.rows[:: memo.rows_per_prompt] // memo.rows_per_prompt, r.left - memo.prompt_left:]
        elif key in memo.completions:
            y = memo.completions[key][r.rows, :r.width]
        else:  # decoding fed no token (every row ended at its first): no product any loss term reaches
            y = torch.zeros(*shape, module.out_features, device=x.device)
        if y.shape[:-1] != shape:
            raise RuntimeError(f"ProductMemo: {key} kept {tuple(y.shape[:-1])} where the pass asks {tuple(shape)}")
        if wants_grad(x, module.weight, module.bias):
            flat = x.reshape(-1, x.shape[-1]).contiguous()
            y = _Replayed.apply(flat, module.weight, module.bias, y.reshape(flat.shape[0], -1))
        return y.view(*x.shape[:-1], module.out_features)


@dataclass(frozen=True)
class Replay:
    """Which of a memo's products a log-prob pass over rollout rows `rows` (whole groups, in order; prompt columns
    from `left` on, `width` completion columns) takes: `phase(model, "prompt")` is its prompt trunk's `Products`,
    `phase(model, "completion")` the rest's."""

    memo: ProductMemo
    rows: torch.Tensor
    left: int
    width: int

    def phase(self, model: GPT, name: str) -> _Replaying:
        return _Replaying(self, self.memo._named(model), name)
