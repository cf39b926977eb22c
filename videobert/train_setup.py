"""What a training run trains with, made once per run by `setup` (called by videobert/train.py): the model (loaded
from the checkpoint when resuming, else initialised as the paper does), its DDP wrapper, the AdamW optimiser
(no weight decay on 1-d parameters) with its linear-decay schedule, and the data loader of this rank's
streams; all restored from the trainer state when resuming, so that a resumed run continues exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from pipeline import storage
from pipeline.config import Config, ConfigError
from pipeline.tokenizer import load_tokenizer
from videobert import checkpoints
from videobert.data import REGIMES, DataParams, ShardDataset, VocabLayout, replacement_text_ids, streams_per_rank
from videobert.model import VideoBert, build_model

if TYPE_CHECKING:
    from videobert.session import Session


def setup(
    s: Session, shards: list[Path], codebook, lineage: dict, latest: Path | None, state: dict | None, stop_step: int
) -> None:
    """The session's model, optimiser, scheduler and data loader, all restored from `state` when resuming."""
    cfg, runtime, t = s.cfg, s.runtime, s.cfg.train
    micro_batch = micro_batch_size(t.batch_size, t.grad_accum, runtime.world_size)
    tokenizer = load_tokenizer(cfg.align.tokenizer)
    layout = VocabLayout.from_tokenizer(tokenizer, codebook.num_leaves)
    streams = streams_per_rank(len(shards), runtime.world_size, t.num_workers)
    s.data_shape = {"world_size": runtime.world_size, "streams_per_rank": streams, "micro_batch": micro_batch}
    model, s.info, s.notes = _model(s, layout, codebook, lineage, shards, latest, state)
    if t.freeze_input_embeddings:
        # the paper freezes the input embeddings (text and visual rows) for the whole pre-training
        model.word_embeddings.weight.requires_grad_(False)
    model.to(runtime.device)
    wrapped = (
        DistributedDataParallel(model, device_ids=[runtime.device] if runtime.device.type == "cuda" else None)
        if runtime.distributed
        else model
    )
    optimizer = make_optimizer(model, t.lr, t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(t.warmup_steps, t.max_steps))
    saved = state["ranks"][runtime.rank] if state is not None else {"plan_states": {}}
    dataset = ShardDataset(
        shards,
        layout,
        replacement_text_ids(tokenizer),
        DataParams.from_config(t, tokenizer),
        micro_batch,
        t.seed,
        runtime.rank,
        runtime.world_size,
        start_batch=state["micro_batches"] if state is not None else 0,
        plan_states=saved["plan_states"],
        checkpoint_every=t.checkpoint_every * t.grad_accum,
        stop_batch=stop_step * t.grad_accum,
    )
    # its own generator: creating the loader must not draw from the global RNG that dropout uses
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=streams if t.num_workers else 0,
        pin_memory=runtime.device.type == "cuda",
        generator=torch.Generator(),
    )
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        checkpoints.set_rng_state(saved["rng"], runtime.device)
    else:
        torch.manual_seed(t.seed + runtime.rank)  # dropout differs between ranks
    examples = saved["examples"] if state is not None else torch.zeros(len(REGIMES))
    s.model, s.wrapped, s.optimizer, s.scheduler, s.batches = model, wrapped, optimizer, scheduler, iter(loader)
    s.examples, s.plan_states = examples.to(runtime.device), dict(saved["plan_states"])


def _model(
    s: Session,
    layout: VocabLayout,
    codebook,
    lineage: dict,
    shards: list[Path],
    latest: Path | None,
    state: dict | None,
) -> tuple[VideoBert, dict, list[str]]:
    """(model, info, notes): loaded from the checkpoint when resuming, else initialised as the paper does."""
    cfg, t = s.cfg, s.cfg.train
    if state is not None:
        model, info = checkpoints.load_model(latest, resuming=True)
        if model.layout != layout:
            raise ValueError(
                f"{latest} was trained with vocabulary {model.layout.to_dict()}, but this tokenizer "
                f"and codebook give {layout.to_dict()}"
            )
        changed = {
            key: (state["data_shape"][key], value)
            for key, value in s.data_shape.items()
            if state["data_shape"][key] != value
        }
        if changed:
            raise ValueError(
                f"cannot resume {latest} exactly: (saved, now) differ for {changed}; resume with "
                f"the same ranks, train.num_workers and train.batch_size"
            )
        return model, info, [f"resumed from {latest}"]
    model, notes = initial_model(cfg, layout, codebook)
    info = {
        "init_checkpoint": t.init_checkpoint,
        "tokenizer": cfg.align.tokenizer,
        "codebook_sha256": codebook.info.get("sha256"),
        "init_notes": notes,
        "lineage": lineage,
        "config": json.loads(cfg.section_json("train", "align")),
        "config_hash": cfg.section_hash("train", "align"),
        "shards": [path.name for path in shards],
    }
    return model, info, notes


def initial_model(cfg: Config, layout: VocabLayout, codebook) -> tuple[VideoBert, list[str]]:
    """`build_model` with its config errors (those naming a train.* key: an init checkpoint that cannot be
    loaded, a vocabulary or length it cannot take) as ConfigError."""
    t = cfg.train
    try:
        return build_model(
            t.init_checkpoint,
            layout,
            codebook.centroids[-1],
            codebook.counts[-1],
            max_len=t.max_len,
            seed=t.seed,
            text_embeddings=t.text_embeddings,
        )
    except (OSError, ValueError) as error:
        if not str(error).startswith("train."):
            raise
        raise ConfigError(f"config error: {storage.one_line(error).split(': ', 1)[1]}") from None


def make_optimizer(model: VideoBert, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # as in BERT: no weight decay on biases and LayerNorm weights (the 1-d parameters)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    # the fused kernel updates every parameter in one launch on GPU; the same math as the loop version
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, fused=trainable[0].is_cuda)


def _lr_factor(warmup_steps: int, max_steps: int):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


def micro_batch_size(batch_size: int, grad_accum: int, world_size: int) -> int:
    if batch_size % (grad_accum * world_size):
        raise ValueError(
            f"train.batch_size {batch_size} must be a multiple of train.grad_accum {grad_accum} x {world_size} ranks"
        )
    return batch_size // (grad_accum * world_size)
