"""Many prompts of different lengths as one rectangle: left padding, per-row positions, and the mask.

Prompts of lengths 3, 5 and 2 become a ``[3, 5]`` batch, padded on the LEFT so that every row's last prompt
token sits in the last column (that is where the next token is sampled, and where decode steps append)::

    slot:        0    1    2    3    4   | 5 (1st decode step) ...
    row 0:      pad  pad   a0   a1   a2  | a3
    row 1:       b0   b1   b2   b3   b4  | b5
    row 2:      pad  pad  pad   c0   c1  | c2

* **positions** are per row: ``slot - pad``, so ``a0`` is at position 0 even though it sits in slot 2.
  RoPE must see the same positions as in an unpadded run, or the tokens would change.
* **the mask** lets a query at slot ``s`` see key slots ``t <= s`` that are not padding. A padding query
  would then see nothing, and a softmax over nothing is NaN; so every query may also see itself. Padding
  rows compute garbage, but finite garbage that no real token ever reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from milestones.m01_naive_loop.request import Request


@dataclass
class PaddedBatch:
    input_ids: torch.Tensor  # [B, P] token ids, pad id 0 on the left
    positions: torch.Tensor  # [B, P] position of each token in its own sequence (0 for padding)
    pad_lens: torch.Tensor  # [B] how many padding slots each row starts with
    num_padding: int  # padding slots in the rectangle

    @classmethod
    def from_requests(cls, requests: list[Request], device: torch.device) -> PaddedBatch:
        width = max(r.num_tokens for r in requests)
        pads = [width - r.num_tokens for r in requests]
        ids = [[0] * pad + r.all_token_ids for r, pad in zip(requests, pads)]
        pad_lens = torch.tensor(pads, device=device)
        slots = torch.arange(width, device=device)[None, :]
        positions = (slots - pad_lens[:, None]).clamp(min=0)
        return cls(torch.tensor(ids, device=device), positions, pad_lens, sum(pads))


def padded_causal_mask(pad_lens: torch.Tensor, query_start: int, query_end: int, key_end: int) -> torch.Tensor:
    """``[B, 1, T, key_end]`` bool: may query slot ``q`` (in ``[query_start, query_end)``) read key slot ``k``?

    Yes when ``k <= q`` and ``k`` is not padding of that row, and always for ``k == q`` (see module docstring).
    """
    device = pad_lens.device
    query_slots = torch.arange(query_start, query_end, device=device)[:, None]  # [T, 1]
    key_slots = torch.arange(key_end, device=device)[None, :]  # [1, S]
    causal = key_slots <= query_slots  # [T, S]
    not_padding = key_slots[None] >= pad_lens[:, None, None]  # [B, 1, S]
    return ((causal[None] & not_padding) | (key_slots == query_slots)[None]).unsqueeze(1)
