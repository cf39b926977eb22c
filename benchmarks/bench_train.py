"""Is the VideoBERT data loader ever the bottleneck? Measured side by side in one run, on the same batch size:

1. the DataLoader alone (shards -> masked, padded batches, `train.num_workers` worker processes): examples/s;
2. the model's training step alone (forward, backward, AdamW; the batches are prefetched): examples/s.
The loader should deliver at least 5x what the step consumes. An example is one segment or a run of up
to `train.max_concat` joined neighbours.

On a GPU (`--device cuda --preset bert-large`) it also reports the bf16 training throughput in tokens/s and
the model FLOPs utilisation (MFU): model FLOPs per step (3x the forward matmuls: encoder, attention, the
MLM head on the masked positions) over the step time, divided by the chip's dense bf16 peak.

    .venv/bin/python benchmarks/bench_train.py                       # CPU, tiny model
    .venv/bin/python benchmarks/bench_train.py --device cuda --preset bert-large --batch-size 128
    .venv/bin/python benchmarks/bench_train.py --work-dir DIR        # real align shards + codebook"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from common import machine
from torch.utils.data import DataLoader

from pipeline import visual_words
from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.models import PRESETS
from pipeline.tokenizer import load_tokenizer
from videobert.data import (
    DataParams,
    ShardDataset,
    VocabLayout,
    replacement_text_ids,
    streams_per_rank,
    training_shards,
)
from videobert.metrics import compute_losses
from videobert.model import build_model, count_parameters
from videobert.runtime import autocast, resolve_device
from videobert.synthetic import write_synthetic
from videobert.train_setup import make_optimizer

# dense bf16 peak TFLOP/s by device name (NVIDIA data sheets, SXM parts)
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}


def measure_loader(loader, batches: int) -> tuple[float, list[dict]]:
    """(examples/s, the batches) over `batches` batches, after the workers have started and warmed up."""
    stream = iter(loader)
    kept = [next(stream) for _ in range(3)]
    started = time.perf_counter()
    examples = 0
    for _ in range(batches):
        batch = next(stream)
        examples += len(batch["regimes"])
        kept.append(batch)
    return examples / (time.perf_counter() - started), kept


def step_flops(model, batch) -> float:
    """Model FLOPs of one training step on this (padded) batch: 3x the forward matmul FLOPs."""
    config = model.config
    batch_size, length = batch["input_ids"].shape
    masked = int((batch["labels"] != -100).sum())
    encoder_params = sum(p.numel() for name, p in model.bert.encoder.named_parameters() if p.ndim == 2)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    forward = (
        2 * encoder_params * batch_size * length  # the layers' linear maps
        + 4 * layers * batch_size * length * length * hidden  # attention scores and weighted sums
        + 2 * masked * (hidden * hidden + hidden * config.vocab_size)
    )  # MLM head, masked positions only
    return 3.0 * forward


def measure_steps(
    model, optimizer, batches: list[dict], device, precision: str, steps: int, loss_weights: dict
) -> tuple[float, float, float, float]:
    """(examples/s, real tokens/s, padded tokens/s, model FLOP/s) of training steps on prefetched batches."""
    # counted on the host beforehand, so that the timed loop never waits for the device
    counts = [
        (len(b["regimes"]), float(b["attention_mask"].sum()), b["input_ids"].numel(), step_flops(model, b))
        for b in batches
    ]
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]

    def step(batch):
        with autocast(device, precision):
            loss, _ = compute_losses(model, batch, loss_weights)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:3]:  # warm-up: allocator, kernels, autotuning
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    examples = tokens = padded = flops = 0.0
    started = time.perf_counter()
    for index in range(steps):
        chosen = 3 + index % (len(batches) - 3)
        step(batches[chosen])
        examples, tokens, padded, flops = (
            total + part for total, part in zip((examples, tokens, padded, flops), counts[chosen])
        )
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    return examples / elapsed, tokens / elapsed, padded / elapsed, flops / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (train.num_workers)")
    parser.add_argument("--loader-batches", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="a pipeline work dir (align shards + kmeans codebook); default: synthetic shards in a temporary folder",
    )
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the model step; 0 = default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = load_config(
        None,
        [f"train.max_len={args.max_len}", f"train.num_workers={args.workers}", f"train.batch_size={args.batch_size}"],
    )
    tokenizer = load_tokenizer(cfg.align.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = args.work_dir
        if work_dir is None:
            # about 40k segments, 16 visual tokens and one sentence each, in 16 shards
            work_dir = Path(tmp)
            write_synthetic(
                work_dir, tokenizer, videos=1600, segments_per_video=25, videos_per_shard=100, tokens_per_segment=16
            )
        shards = training_shards([path for _, path in Lineage(work_dir).current_parts("align")])
        codebook = visual_words.load(WorkDir(work_dir).codebook)
        layout = VocabLayout.from_tokenizer(tokenizer, codebook.num_leaves)
        streams = streams_per_rank(len(shards), 1, args.workers)
        dataset = ShardDataset(
            shards,
            layout,
            replacement_text_ids(tokenizer),
            DataParams.from_config(cfg.train, tokenizer),
            args.batch_size,
            cfg.train.seed,
        )
        loader = DataLoader(
            dataset, batch_size=None, num_workers=streams if args.workers else 0, generator=torch.Generator()
        )
        loader_rate, batches = measure_loader(loader, args.loader_batches)
        del loader

    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    model, _ = build_model(
        f"random:{args.preset}", layout, codebook.centroids[-1], codebook.counts[-1], max_len=args.max_len, seed=0
    )
    model.word_embeddings.weight.requires_grad_(False)
    model.to(device).train()
    optimizer = make_optimizer(model, 1e-5, 0.0)
    step_rate, tokens_rate, padded_rate, flop_rate = measure_steps(
        model, optimizer, batches, device, cfg.train.precision, args.steps, cfg.train.loss_weights
    )

    precision = cfg.train.precision
    if precision == "auto":
        precision = "bf16 autocast" if device.type == "cuda" else "float32"
    total, trainable = count_parameters(model)
    mean_length = sum(float(b["attention_mask"].sum()) for b in batches) / sum(len(b["regimes"]) for b in batches)
    print(f"machine: {machine()}")
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
        f"torch threads {torch.get_num_threads()}, preset {args.preset} ({total / 1e6:.1f}M parameters, "
        f"{trainable / 1e6:.1f}M trainable), batch {args.batch_size}, max_len {args.max_len}, "
        f"mean example length {mean_length:.1f} tokens, {precision}"
    )
    where = f"{streams} worker process(es)" if args.workers else "in-process"
    ratio = loader_rate / step_rate
    print(f"{'data loader (' + where + ')':<36}{loader_rate:10.1f} examples/s")
    print(
        f"{'training step':<36}{step_rate:10.1f} examples/s  ({step_rate / args.batch_size:.2f} steps/s, "
        f"{tokens_rate:,.0f} tokens/s, {padded_rate:,.0f} padded tokens/s)"
    )
    print(f"{'loader / step':<36}{ratio:10.1f}x  ({'meets' if ratio >= 5 else 'BELOW'} the 5x goal)")
    print(f"{'model FLOPs':<36}{flop_rate / 1e12:10.3f} TFLOP/s")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        if peak:
            print(f"{'MFU':<36}{100 * flop_rate / 1e12 / peak:10.1f}%  (of {peak:.0f} TFLOP/s dense bf16)")
        else:
            print("MFU: unknown peak for this device; pass --peak-tflops")


if __name__ == "__main__":
    main()
