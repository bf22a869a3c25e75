"""The critic of `--advantage gae`: a scalar value per position, read off the policy's final hidden state.

PPO with a learned value baseline, beside critic-free GRPO. The head is one linear layer on the shared trunk,
saved in its own file beside a checkpoint's `model.safetensors`, so the policy stays a plain GPT-2 that
`transformers` and `--model` load as they are.
"""

from __future__ import annotations

from torch import nn

#: The head's file in a checkpoint directory.
VALUE_HEAD_NAME = "value_head"


class ValueHead(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.proj = nn.Linear(n_embd, 1)
        # V = 0 everywhere at the start: no prior about the rewards, and no random advantages from a random head.
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden):
        """Values [...] of hidden states [..., n_embd]."""
        return self.proj(hidden).squeeze(-1)
