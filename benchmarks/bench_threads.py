"""Threads that follow the allocation against torch's own choice, side by side in one run.

The case it measures: P processes share this machine, each given cpus/P CPUs (a local pool's workers, or P
Slurm tasks of `--cpus-per-task cpus/P` on one node without CPU binding; SLURM_CPUS_PER_TASK is set in each).
Each runs the same work at once, with its thread count either
- before: torch's own choice (one thread per core of the machine, whatever the process was given), or
- after: the default of pipeline/threads.py (num_threads 0: the process's share, SLURM_CPUS_PER_TASK here),
through the real code paths: the trainer's `start_runtime` (a training step of a small BERT: forward,
backward, AdamW) and the features encoder `encoder_for` (S3D, random weights, uint8 clips in, 1024-d out).
Rounds alternate before and after so that both see the same load; the medians and their ratio are printed.

    .venv/bin/python benchmarks/bench_threads.py                   # P = every CPU, 2 rounds
    .venv/bin/python benchmarks/bench_threads.py --processes 4 --rounds 3"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import REPO, machine

CHILD_ENV = ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE", "MKL_NUM_THREADS")


def train_rate(mode: str, steps: int) -> tuple[int, float]:
    """(torch threads, training steps/s) of a small BERT on random tokens."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from videobert.runtime import start_runtime

    start_runtime("cpu", torch.get_num_threads() if mode == "before" else 0)
    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=8000,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
            max_position_embeddings=128,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8000, (16, 96))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocations, the optimiser's state
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return torch.get_num_threads(), steps / (time.perf_counter() - started)


def features_rate(mode: str, batches: int) -> tuple[int, float]:
    """(torch threads, clips/s) of the S3D encoder on uint8 clips of 16 frames."""
    import torch

    from pipeline.config import load_config
    from stages.features.s3d.encoder import encoder_for

    threads = torch.get_num_threads() if mode == "before" else 0
    cfg = load_config(
        None,
        ["features.weights=random", "features.device=cpu", "decode.clip_frames=16", f"features.num_threads={threads}"],
    )
    encoder = encoder_for(cfg)
    batch = torch.randint(0, 256, (2, cfg.decode.clip_frames, cfg.decode.crop, cfg.decode.crop, 3), dtype=torch.uint8)
    encoder(batch)  # warm-up
    started = time.perf_counter()
    for _ in range(batches):
        encoder(batch)
    return torch.get_num_threads(), batches * len(batch) / (time.perf_counter() - started)


def child(work: str, mode: str, amount: int) -> None:
    threads, rate = (train_rate if work == "train" else features_rate)(mode, amount)
    print(json.dumps({"threads": threads, "rate": rate}))


def run_together(work: str, mode: str, processes: int, cpus_each: int, amount: int) -> dict:
    """P children at once; their summed rate and the threads each ran."""
    env = {k: v for k, v in os.environ.items() if k not in CHILD_ENV}
    env.update(SLURM_CPUS_PER_TASK=str(cpus_each), PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}")
    command = [sys.executable, __file__, "--child", work, mode, str(amount)]
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    results = []
    for process in running:
        out, _ = process.communicate()
        if process.returncode:
            raise SystemExit(f"{work} {mode} child failed ({process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"rate": sum(r["rate"] for r in results), "threads": sorted({r["threads"] for r in results})}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 1, help="processes sharing the machine (default: every CPU)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--feature-batches", type=int, default=6)
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    cpus_each = max(1, cpus // args.processes)
    print(f"machine: {machine()}")
    print(
        f"{args.processes} processes at once, each given {cpus_each} of {cpus} CPUs; {args.rounds} rounds, "
        f"before and after alternating"
    )
    units = {"train": "steps/s", "features": "clips/s"}
    amounts = {"train": args.train_steps, "features": args.feature_batches}
    for work in ("train", "features"):
        rates: dict[str, list[float]] = {"before": [], "after": []}
        threads: dict[str, list[int]] = {}
        for _ in range(args.rounds):
            for mode in ("before", "after"):
                result = run_together(work, mode, args.processes, cpus_each, amounts[work])
                rates[mode].append(result["rate"])
                threads[mode] = result["threads"]
        before, after = statistics.median(rates["before"]), statistics.median(rates["after"])
        print(
            f"{work:>8}: before (torch's choice, {threads['before']} threads each) {before:.2f} {units[work]}, "
            f"after (the allocation, {threads['after']} threads each) {after:.2f} {units[work]}; "
            f"after/before {after / before:.2f}x  (rounds: before {[round(r, 2) for r in rates['before']]}, "
            f"after {[round(r, 2) for r in rates['after']]})"
        )


if __name__ == "__main__":
    main()
