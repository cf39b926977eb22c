"""The training losses and what the train log reports: metrics summed over a window of steps (and ranks),
per regime, with the realised regime mix."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from videobert.data import IGNORE, REGIMES

if TYPE_CHECKING:
    from pipeline.config import Config

METRIC_ROWS = REGIMES + ("alignment",)
# the log records' key prefix per metric row
METRIC_PREFIXES = {name: "alignment" if name == "alignment" else f"mlm_{name}" for name in METRIC_ROWS}
METRIC_COLUMNS = ("loss_sum", "correct", "count", "examples")


def compute_losses(
    model, batch: dict[str, torch.Tensor], loss_weights: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, metrics): the masked-LM loss averaged over all masked tokens of the batch, each token
    scaled by its regime's weight, + the alignment weight * the mean alignment loss of the text-video
    examples. (Averaging over all tokens, not per regime, keeps a regime with few examples in a batch
    from weighing as much as the others: `train.regime_weights` sets the mix.) Metrics rows are
    METRIC_ROWS, columns METRIC_COLUMNS (sums, so windows and ranks add up)."""
    predict = batch["labels"] != IGNORE
    _, logits, alignment_logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], predict)
    labels = batch["labels"][predict]
    token_regimes = batch["regimes"][:, None].expand_as(predict)[predict]
    token_loss = F.cross_entropy(logits.float(), labels, reduction="none")
    token_correct = (logits.argmax(dim=-1) == labels).float()
    # masked sums rather than boolean indexing: no device-to-host sync per regime on GPU
    rows, total = [], torch.zeros((), device=logits.device)
    for index, name in enumerate(REGIMES):
        chosen = (token_regimes == index).float()
        loss_sum = (token_loss * chosen).sum()
        total = total + loss_weights[name] * loss_sum / max(len(labels), 1)
        rows.append(
            torch.stack(
                [
                    loss_sum.detach(),
                    (token_correct * chosen).sum(),
                    chosen.sum(),
                    (batch["regimes"] == index).sum().float(),
                ]
            )
        )
    alignment_labels = batch["alignment_labels"]
    aligned = (alignment_labels != IGNORE).float()
    count = aligned.sum()
    loss_sum = F.cross_entropy(alignment_logits.float(), alignment_labels, ignore_index=IGNORE, reduction="sum")
    total = total + loss_weights["alignment"] * loss_sum / count.clamp(min=1)
    correct = ((alignment_logits.argmax(dim=-1) == alignment_labels).float() * aligned).sum()
    rows.append(torch.stack([loss_sum.detach(), correct, count, count]))
    return total, torch.stack(rows)


class Window:
    """Metrics summed over the steps since the last log record."""

    def __init__(self, device: torch.device):
        self.metrics = torch.zeros(len(METRIC_ROWS), len(METRIC_COLUMNS), device=device)
        self.loss_sum = torch.zeros((), device=device)
        self.steps = 0
        self.tokens = 0  # this process's tokens, for tokens/s (not restored on resume)
        self.started = time.time()

    def state(self) -> dict:
        return {"metrics": self.metrics.cpu(), "loss_sum": self.loss_sum.cpu(), "steps": self.steps}

    def load(self, state: dict) -> None:
        self.metrics = state["metrics"].to(self.metrics.device)
        self.loss_sum = state["loss_sum"].to(self.loss_sum.device)
        self.steps = state["steps"]

    def record(self, step: int, lr: float, runtime) -> dict:
        """The log record of this window, summed over ranks."""
        totals = torch.cat(
            [
                self.metrics.flatten(),
                self.loss_sum[None],
                torch.tensor([float(self.tokens)], device=self.metrics.device),
            ]
        )
        if runtime.distributed:
            dist.all_reduce(totals)
        totals = totals.cpu().double()
        metrics = totals[: self.metrics.numel()].view(self.metrics.shape)
        elapsed = max(time.time() - self.started, 1e-9)
        record = {
            "event": "train",
            "step": step,
            "lr": lr,
            "loss": float(totals[-2]) / max(self.steps * runtime.world_size, 1),
        }
        all_examples = float(metrics[: len(REGIMES), -1].sum())
        for index, name in enumerate(METRIC_ROWS):
            loss_sum, correct, count, examples = (float(v) for v in metrics[index])
            prefix = METRIC_PREFIXES[name]
            record[f"{prefix}_loss"] = loss_sum / count if count else None
            record[f"{prefix}_acc"] = correct / count if count else None
            record[f"{prefix}_examples"] = int(examples)
            if name in REGIMES:  # the realised regime mix
                record[f"{prefix}_share"] = examples / all_examples if all_examples else None
        record["tokens_per_s"] = float(totals[-1]) / elapsed
        return record


def format_record(record: dict, max_steps: int) -> str:
    parts = [f"step {record['step']}/{max_steps}", f"loss {record['loss']:.4f}"]
    for name, prefix in METRIC_PREFIXES.items():
        if record[f"{prefix}_loss"] is not None:
            parts.append(f"{name} {record[f'{prefix}_loss']:.3f} (acc {record[f'{prefix}_acc']:.3f})")
    shares = [record[f"mlm_{name}_share"] or 0.0 for name in REGIMES]
    parts.append(f"mix {'/'.join(f'{100 * share:.0f}' for share in shares)}%")
    parts.append(f"{record['tokens_per_s']:,.0f} tokens/s")
    return " | ".join(parts)


def mix_line(examples: torch.Tensor, cfg: Config) -> tuple[str, dict[str, float]]:
    """The realised mix of `examples` (per regime) against the configured one."""
    total = max(float(examples.sum()), 1.0)
    shares = {name: float(examples[index]) / total for index, name in enumerate(REGIMES)}
    weights = cfg.train.regime_weights
    line = (
        f"regime mix of {int(examples.sum()):,} examples: "
        + ", ".join(f"{name} {100 * share:.1f}%" for name, share in shares.items())
        + f" (train.regime_weights {':'.join(f'{weights[name]:g}' for name in REGIMES)}, "
        f"regime_mix {cfg.train.regime_mix})"
    )
    return line, shares
