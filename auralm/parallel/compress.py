"""DiLoCo's pseudo-gradient on the wire (``training.diloco.compress``): none (fp32), bf16, int8 or int4.

none and bf16 are summed by one all-reduce. int8 and int4 cannot be summed as integers (every block has its own
scale), so they travel as a reduce-scatter and an all-gather of codes (torchft's and INTELLECT-1's way): each rank
quantises its pseudo-gradient; every rank owns a slice of the blocks and receives every rank's codes for it
(an all-to-all), decodes and sums them in fp32 in rank order, quantises the sum and sends it to all (an all-gather);
every rank decodes the same average, and the outer step is taken on it in fp32.

The quantisation (per block, as Streaming DiLoCo and torchft's quantised collectives do): the flat vector in blocks of
BLOCK values, each scaled by its largest magnitude to the integers -127..127 (int8) or -7..7 (int4, two to a byte),
rounded to the nearest; on the wire a block is its codes then its fp32 scale, so any run of blocks is one slice.
What either rounding leaves out is carried to the next round (error feedback): a rank adds it to its next
pseudo-gradient, so nothing quantised away is lost, only sent a round later. The remainder is the rank's own (a
checkpoint keeps it per rank: an exact resume).

Bytes a rank sends a round, P parameters over W ranks: 2(W-1)/W x P x 4 (none), x 2 (bf16), x (1 + 4/BLOCK) (int8),
x (1/2 + 4/BLOCK) (int4): int8 about half of bf16's, int4 about a quarter, at any W.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from auralm.training.config import COMPRESS as KINDS

if TYPE_CHECKING:
    import torch

# torch is imported where a tensor is made: the byte model above the codec (bytes_per_value, sent_per_round) is read by
# the link budget (auralm.planning.link_budget), which imports no torch

BLOCK = 256  # values a scale covers
LEVELS = {"int8": 127, "int4": 7}


def bytes_per_value(kind: str) -> float:
    """What a rank's payload holds per parameter (the scales included)."""
    return {"none": 4.0, "bf16": 2.0}.get(kind) or record_bytes(kind) / BLOCK


def sent_per_round(kind: str, parameters: int, world: int) -> float:
    """Bytes one rank sends a round (a ring's reduce-scatter and all-gather), for ``world`` ranks."""
    return 2 * (world - 1) / world * parameters * bytes_per_value(kind) if world > 1 else 0.0


def record_bytes(kind: str) -> int:
    """A block on the wire: its codes, then its scale."""
    return (BLOCK if kind == "int8" else BLOCK // 2) + 4


def blocks(n: int) -> int:
    return -(-n // BLOCK)


def quantize(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x`` (flat, float) as (blocks, record_bytes) uint8: each block's codes (two to a byte for int4), then its
    fp32 scale."""
    import torch

    levels, n = LEVELS[kind], x.numel()
    rows = torch.zeros(blocks(n) * BLOCK, dtype=torch.float32, device=x.device)
    rows[:n] = x
    rows = rows.view(-1, BLOCK)
    scales = rows.abs().amax(dim=1) / levels
    scales[scales == 0] = 1.0
    codes = torch.round(rows / scales[:, None]).clamp_(-levels, levels).to(torch.int16)
    if kind == "int8":
        packed = codes.to(torch.int8).view(torch.uint8)
    else:
        nibbles = (codes + 8).to(torch.uint8)  # 1..15
        packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    return torch.cat([packed, scales[:, None].contiguous().view(torch.uint8)], dim=1)


def dequantize(data: torch.Tensor, kind: str, n: int | None = None) -> torch.Tensor:
    """The fp32 values of ``quantize``'s records (the first ``n``; None: every block's)."""
    import torch

    data = data.view(-1, record_bytes(kind))
    raw, scales = data[:, :-4], data[:, -4:].contiguous().view(torch.float32)
    if kind == "int8":
        codes = raw.contiguous().view(torch.int8).to(torch.float32)
    else:
        codes = torch.empty(len(data), BLOCK, dtype=torch.float32, device=data.device)
        codes[:, 0::2] = (raw & 0x0F).to(torch.float32) - 8
        codes[:, 1::2] = (raw >> 4).to(torch.float32) - 8
    values = (codes * scales).view(-1)
    return values if n is None else values[:n]


def slices(n_blocks: int, ranks: int) -> list[tuple[int, int]]:
    """The blocks each of ``ranks`` ranks owns (reduces): [start, end), in rank order."""
    return [(n_blocks * i // ranks, n_blocks * (i + 1) // ranks) for i in range(ranks)]


class Wire:
    """One rank's side of the wire: what it sends, what it sums, and the rounding's remainder it carries."""

    def __init__(self, kind: str, numel: int):
        if kind not in KINDS:  # config.py checks the user's value first
            raise ValueError(f"training.diloco.compress={kind}: expected one of {', '.join(KINDS)}")
        self.kind, self.numel = kind, numel
        self.summed = kind in ("none", "bf16")  # one all-reduce sums it; else reduce-scatter and all-gather of codes
        self.residual: torch.Tensor | None = None  # int8/int4: what the last rounds' rounding left out
        self._before: torch.Tensor | None = None  # the remainder before the round in flight (a discarded round)

    def encode(self, payload: torch.Tensor) -> torch.Tensor:
        """What this rank sends of its ``payload`` (none, bf16: the tensor; int8, int4: its block records, the
        remainder carried in and the new one kept)."""
        import torch

        if self.kind == "none":
            return payload.float()
        if self.kind == "bf16":
            return payload.to(torch.bfloat16)
        self._before = self.residual
        carried = payload.float() + (0 if self.residual is None else self.residual)
        data = quantize(carried, self.kind)
        self.residual = carried - dequantize(data, self.kind, self.numel)
        return data

    def reduce(self, received: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's records of the blocks this rank owns, summed in fp32 in rank order and quantised again: (the
        records to send to all, what that rounding left out: ``keep`` adds it to the remainder once the round is
        through)."""
        total = sum(dequantize(r, self.kind) for r in received)
        data = quantize(total, self.kind)
        return data, total - dequantize(data, self.kind)

    def keep(self, left_out: torch.Tensor, start: int) -> None:
        """The sum's rounding on this rank's blocks, carried by this rank into the next round."""
        lo = start * BLOCK
        hi = min(self.numel, lo + left_out.numel())
        self.residual[lo:hi] += left_out[:hi - lo]

    def decode(self, received) -> torch.Tensor:
        """The fp32 sum over ranks: the all-reduced tensor, or the all-gathered records of every rank's blocks (a
        list in rank order)."""
        import torch

        if self.summed:
            return received.float()
        return torch.cat([dequantize(r, self.kind) for r in received])[:self.numel]

    def undo(self) -> None:
        """The round in flight is discarded (a rank's pseudo-gradient was not finite): its remainder too."""
        self.residual = self._before

    def reset(self) -> None:
        """The weights were restored (the NaN guard): what was left out belongs to the trajectory left behind."""
        self.residual = self._before = None

    def state_dict(self) -> dict:
        return {"residual": self.residual}

    def load_state_dict(self, state: dict) -> None:
        self.residual, self._before = state.get("residual"), None
