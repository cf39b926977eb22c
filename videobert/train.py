"""VideoBERT pre-training: AdamW with linear decay (optional warm-up), gradient accumulation, bf16 autocast
on GPU, data parallel under torchrun (gloo on CPU, nccl on GPU; shards split by rank).

Outputs in DIR/train/:
- checkpoints/step-NNNNNNNN/: model.safetensors + model.json (how the model was made) + trainer.pt
  (optimiser, scheduler, the data position, and per rank its RNG states, open log window and examples per
  regime so far); written under
  a temporary name and renamed, so a checkpoint folder is always complete, with checksums.json (the sha256
  of its files, verified on every opening); the newest `train.keep_checkpoints` are kept;
- log.jsonl: a start/resume record, then per `train.log_every` steps the loss, masked accuracy and
  alignment accuracy per regime, the examples of each regime and their share (the realised mix), learning
  rate and tokens/s. A run ends by printing the mix of all examples trained on so far. The start record
  also has `warnings` (data that cannot teach, videobert/data_checks.py; regimes the held-out videos cannot
  measure), `validation_videos` and `test_videos` (train.splits); every `train.validation_every` steps a
  `validation` record gives the held-out figures, under the clean protocol and the run's own noise
  (videobert/validation.py).

`resume=True` continues from the newest checkpoint and gives the same losses and weights as a run that was
never stopped: every data stream continues from its saved state (see videobert/data.py; nothing is
replayed, so resuming costs the same at step 500k as at step 5) and the RNG states, optimiser and scheduler
are restored. `train.steps_per_run` stops a run early with a checkpoint, for
time-limited batch jobs chained with --resume.

A step whose loss or gradient norm is not finite, or a checkpoint whose weights are not, stops the run
(TrainingDiverged) before that state is applied or saved: every checkpoint on disk is finite, and the
newest is always kept. One run per work dir: rank 0 holds DIR/_state/train.lock for the whole run."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import schemas.codebook as codebook_format
from pipeline import devices, storage, threads, visual_words
from pipeline.config import Config, ConfigError
from pipeline.engine.lineage import InputNotReady, Lineage, explain, relative
from pipeline.engine.workdir import WorkDir
from pipeline.executors.dispatch import env_int
from pipeline.progress import Progress
from pipeline.tokenizer import load_tokenizer, vocabulary_sha256
from videobert import checkpoints, tensorboard_log, youcook2
from videobert.checkpoints import CorruptCheckpoint, TrainingDiverged, latest_checkpoint
from videobert.data import (REGIMES, DataParams, ShardDataset, VocabLayout, replacement_text_ids, streams_per_rank,
                            training_shards)
from videobert.data_checks import require_codebook
from videobert.metrics import Window, compute_losses, format_record, mix_line
from videobert.model import INFO_NAME, VideoBert, build_model, count_parameters
from videobert.stream import confirm_pins, pin_shards
from videobert.subset import subset_shards
from videobert.validation import Protocols, format_validation, read_validation_videos, split_shards, validate_protocols



# ---------------------------------------------------------------- runtime

@dataclass
class Runtime:
    rank: int
    world_size: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


resolve_device = devices.resolve


def autocast(device: torch.device, precision: str):
    """Training's autocast: bf16 on GPU by default, float32 on CPU (pipeline/devices.py)."""
    dtype = devices.autocast_dtype(precision, device, cpu_auto="float32")
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def _start_runtime(device_name: str, num_threads: int = 0) -> tuple[Runtime, bool]:
    """(runtime, whether this call started the process group); torchrun sets RANK and WORLD_SIZE."""
    world_size = env_int("WORLD_SIZE", 1, minimum=1)
    rank, local_rank = env_int("RANK", 0), env_int("LOCAL_RANK", 0)
    if rank >= world_size:
        raise ConfigError(f"environment error: RANK={rank} must be below WORLD_SIZE={world_size}")
    device = resolve_device(device_name, local_rank)
    threads.set_torch_threads(num_threads)   # 0: this rank's share of the task's CPUs (pipeline/threads.py)
    started = False
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        started = True
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    return Runtime(rank, world_size, device), started


# ---------------------------------------------------------------- checkpoints

def _rng_state(device: torch.device) -> dict:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def _save_checkpoint(work: WorkDir, step: int, model: VideoBert, info: dict, trainer_state: dict,
                     rank_state: dict, runtime: Runtime, keep: int) -> Path:
    """`trainer_state` is the same on every rank; `rank_state` (with the RNG states added) is each rank's.
    Weights that are not finite are never saved (the same on every rank: DDP keeps them equal)."""
    _stop_on_non_finite_weights(model, step)
    rank_state = dict(rank_state, rng=_rng_state(runtime.device))
    rank_states = [rank_state]
    if runtime.distributed:
        rank_states = [None] * runtime.world_size
        dist.all_gather_object(rank_states, rank_state)
    root = work.checkpoints
    final = root / f"step-{step:08d}"
    if runtime.main and not final.exists():
        tmp = storage.atomic_path(final)
        tmp.mkdir()
        with checkpoints.written(tmp):           # a full disk: one OSError naming it, not a library's traceback
            model.save(tmp, dict(info, step=step))
            torch.save(_interned_keys(dict(trainer_state, step=step, ranks=rank_states)),
                       tmp / checkpoints.TRAINER_STATE_NAME)
            checkpoints.write_checksums(tmp)     # inside the folder before it has its final name
        os.replace(tmp, final)
        checkpoints.rotate(root, keep)
    if runtime.distributed:
        dist.barrier()
    return final


def _interned_keys(value):
    """`value` with every dict's string keys interned. Pickle writes a string once per object: the optimiser
    state a resumed run loaded holds keys ("step", ...) that are other objects than the code's own, and
    without this its trainer.pt would differ in bytes from an uninterrupted run's."""
    if isinstance(value, dict):
        return {sys.intern(k) if type(k) is str else k: _interned_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned_keys(v) for v in value]
    return value


def _stop_on_non_finite_weights(model: VideoBert, step: int) -> None:
    bad = checkpoints.non_finite_weights(model)
    if bad:
        raise TrainingDiverged(step, f"the weights hold non-finite values after the update ({bad})")


def _stop_if_not_finite(run: "Run", loss: torch.Tensor, grad_norm: torch.Tensor, runtime: Runtime) -> None:
    """Stop before the optimiser step when this step's loss or gradient norm is not finite, whatever the
    cause (data, learning rate, weights): an update from it would make every later step NaN. Summed over
    ranks, so that every rank stops at the same step."""
    values = torch.stack([loss.detach().float(), grad_norm.detach().float().to(loss.device)])
    if runtime.distributed:
        dist.all_reduce(values)
    loss_value, norm_value = values.tolist()
    if math.isfinite(loss_value) and math.isfinite(norm_value):
        return
    what = "the loss" if not math.isfinite(loss_value) else "the gradient norm"
    raise TrainingDiverged(run.scheduler.last_epoch + 1,
                           f"{what} is {loss_value if what == 'the loss' else norm_value} (loss {loss_value}, "
                           f"gradient norm {norm_value}, learning rate {run.scheduler.get_last_lr()[0]})")


def _on_rank_zero(runtime: Runtime, check) -> list[str]:
    """Run `check` (which returns notes or raises CorruptCheckpoint) on rank 0 only, e.g. hashing a
    checkpoint's files once rather than once per process, and give every rank its verdict."""
    verdict: list = [None, []]
    if runtime.main:
        try:
            verdict[1] = check()
        except CorruptCheckpoint as error:
            verdict[0] = str(error)
    if runtime.distributed:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise CorruptCheckpoint(verdict[0])
    return verdict[1]


# ---------------------------------------------------------------- the loop

def _micro_batch_size(batch_size: int, grad_accum: int, world_size: int) -> int:
    if batch_size % (grad_accum * world_size):
        raise ValueError(f"train.batch_size {batch_size} must be a multiple of train.grad_accum {grad_accum} "
                         f"x {world_size} ranks")
    return batch_size // (grad_accum * world_size)


def _lr_factor(warmup_steps: int, max_steps: int):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))
    return factor


def make_optimizer(model: VideoBert, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # as in BERT: no weight decay on biases and LayerNorm weights (the 1-d parameters)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0}]
    # the fused kernel updates every parameter in one launch on GPU; the same math as the loop version
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, fused=trainable[0].is_cuda)


def identities(cfg: Config, videos: list[dict]) -> dict[str, str]:
    """What shapes a training run besides the train config and its inputs: the WordPiece vocabulary."""
    return {"tokenizer": vocabulary_sha256(load_tokenizer(cfg.align.tokenizer))}


def train(cfg: Config, work_dir, *, resume: bool = False, restart: bool = False, quiet: bool = False) -> dict:
    """Pre-train VideoBERT on DIR/align shards with the DIR/kmeans codebook; returns the final stats."""
    runtime, started_group = _start_runtime(cfg.train.device, cfg.train.num_threads)
    work = WorkDir(work_dir)
    try:
        with _locked(work, runtime):
            # checkpoints and the log are written on a local disk: the work dir's, or a mirror of a remote
            # one, which each node's first rank brings up to date while the others wait
            local_first = int(os.environ.get("LOCAL_RANK", "0")) == 0
            files = checkpoints.local_files(work) if local_first else checkpoints.mirror_of(work)
            if runtime.distributed:
                dist.barrier()
            try:
                return _train(cfg, work, files, runtime, resume, restart, quiet)
            except TrainingDiverged as error:
                raise _stopped(files, work, runtime, error) from None
    finally:
        if started_group:
            dist.destroy_process_group()


@contextlib.contextmanager
def _locked(work: WorkDir, runtime: Runtime):
    """One run per work dir: rank 0 holds the lock (DIR/_state/train.lock) for the whole run; when it is
    taken, every rank refuses at once."""
    with contextlib.ExitStack() as stack:
        refusal = [None]
        if runtime.main:
            try:
                stack.enter_context(checkpoints.train_lock(work))
            except checkpoints.TrainingLocked as error:
                refusal[0] = str(error)
        if runtime.distributed:
            dist.broadcast_object_list(refusal, src=0)
        if refusal[0] is not None:
            raise checkpoints.TrainingLocked(refusal[0])
        yield


def _stopped(files: WorkDir, work: WorkDir, runtime: Runtime, error: TrainingDiverged) -> TrainingDiverged:
    """The one-line stop of a diverged run, naming the checkpoint it keeps; a `stopped` record in the log."""
    kept = latest_checkpoint(files)
    fix = (f"nothing of this step was saved; the newest checkpoint {kept.name} is kept: lower train.lr or check "
           f"the data and the init checkpoint, then train --resume (or --restart)" if kept is not None else
           "nothing was saved: lower train.lr or check the data and train.init_checkpoint, then train again")
    stopped = TrainingDiverged(error.step, f"{error.what}; {fix}")
    if runtime.main and files.train_log.exists():
        with open(files.train_log, "a") as log_file:
            log_file.write(json.dumps({"event": "stopped", "step": error.step, "time": time.time(),
                                       "reason": error.what, "checkpoint": str(kept) if kept else None}) + "\n")
        checkpoints.push(files, work)
    return stopped


def training_inputs(cfg: Config, work: WorkDir) -> tuple[dict, codebook_format.Codebook, list[Path]]:
    """(the run's lineage, the codebook, the align shards with segments). Every align shard must be
    current and made from this very codebook: visual rows initialised from one tree and tokens of
    another would train on noise."""
    checker = Lineage(work, cfg)
    codebook_state = checker.state("kmeans", verify=True)
    if not codebook_state.current:
        raise InputNotReady(f"train needs a current codebook; it is {codebook_state.status}"
                            f"{f' ({codebook_state.reason})' if codebook_state.reason else ''}: run the kmeans stage")
    lineage = checker.expected("train")          # every align shard current, or InputNotReady
    codebook = visual_words.load(work.codebook)
    parts = [work.part("align", shard) for shard in checker.manifest_shards()]
    pinned = pin_shards(parts, work.state / "pinned")   # before verifying: what is verified is what is read
    # checked against their records before training: a flipped bit would become a wrong token for 500k steps
    checksums = {}
    for shard, path in zip(checker.manifest_shards(), parts):
        checker.verified("align", shard, path)
        checksums[path.name] = checker.record("align", shard)["outputs"][relative(work, path)]["sha256"]
    confirm_pins(parts, pinned, checksums)
    require_codebook(pinned, codebook.info.get("sha256"), f"{work.codebook} is", InputNotReady,
                     ": run quantize and align again")
    return lineage, codebook, training_shards(pinned)


def _checkpoint_matches(latest: Path, info: dict, lineage: dict) -> None:
    """A checkpoint is continued only on the inputs and config it was trained with."""
    if info.get("lineage") != lineage:
        raise ValueError(f"{latest} was trained on other inputs or settings ({explain(info.get('lineage'), lineage)}): "
                         f"`train --restart` moves the old run aside and trains anew")


def _move_aside(work: WorkDir, files: WorkDir) -> Path:
    destination = work.state / "replaced" / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    if storage.is_remote(work.root):
        if work.train_folder.exists():
            work.train_folder.fs.mv(work.train_folder.path, destination.path, recursive=True)
        shutil.rmtree(files.train_folder, ignore_errors=True)
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(work.train_folder, destination)
    return destination


@dataclass
class Run:
    """What the loop works with: the model (and its DDP wrapper), optimiser, scheduler and data."""
    model: VideoBert
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    batches: Iterator[dict]
    info: dict                 # how the model was made (saved with every checkpoint)
    notes: list[str]
    data_shape: dict           # ranks, streams and micro-batch: a resume must keep them
    examples: torch.Tensor     # this rank's examples per regime so far (the realised mix)
    plan_states: dict          # this rank's data streams' latest saved positions, by stream


def _open_checkpoint(work: WorkDir, files: WorkDir, runtime: Runtime, lineage: dict, resume: bool, restart: bool,
                     quiet: bool) -> tuple[Path | None, dict | None]:
    """(the checkpoint to continue and its trainer state, or None, None for a new run)."""
    if restart and runtime.main and (work.train_folder.exists() or files.train_folder.exists()):
        moved = _move_aside(work, files)
        if not quiet:
            print(f"[train] the previous run was moved to {moved}", file=sys.stderr)
    if runtime.distributed:
        dist.barrier()
    if runtime.main:
        storage.remove_stale_temporaries(files.checkpoints)   # a killed save's half-written folder
    latest = latest_checkpoint(files)
    if latest is None:
        return None, None
    if not resume:
        raise FileExistsError(f"{work.checkpoints} already holds {latest.name}: pass --resume to "
                              f"continue that run, or --restart to move it aside and train anew")
    # its files against the sha256 recorded when it was written, before anything is read from it
    for note in _on_rank_zero(runtime, lambda: checkpoints.verify(latest, resuming=True)):
        if runtime.main and not quiet:
            print(f"[train] {note}", file=sys.stderr)
    try:
        info = json.loads((latest / INFO_NAME).read_text())
    except (OSError, ValueError) as error:
        raise checkpoints.damaged(latest, f"{latest / INFO_NAME} cannot be read ({storage.one_line(error)})",
                                  resuming=True) from None
    _checkpoint_matches(latest, info, lineage)
    return latest, checkpoints.load_trainer_state(latest)


def _model(cfg: Config, layout: VocabLayout, codebook, lineage: dict, shards: list[Path], latest: Path | None,
           state: dict | None, data_shape: dict) -> tuple[VideoBert, dict, list[str]]:
    """(model, info, notes): loaded from the checkpoint when resuming, else initialised as the paper does."""
    t = cfg.train
    if state is not None:
        model, info = checkpoints.load_model(latest, resuming=True)
        if model.layout != layout:
            raise ValueError(f"{latest} was trained with vocabulary {model.layout.to_dict()}, but this tokenizer "
                             f"and codebook give {layout.to_dict()}")
        changed = {key: (state["data_shape"][key], value) for key, value in data_shape.items()
                   if state["data_shape"][key] != value}
        if changed:
            raise ValueError(f"cannot resume {latest} exactly: (saved, now) differ for {changed}; resume with "
                             f"the same ranks, train.num_workers and train.batch_size")
        return model, info, [f"resumed from {latest}"]
    model, notes = _initial_model(cfg, layout, codebook)
    info = {"init_checkpoint": t.init_checkpoint, "tokenizer": cfg.align.tokenizer,
            "codebook_sha256": codebook.info.get("sha256"), "init_notes": notes, "lineage": lineage,
            "config": json.loads(cfg.section_json("train", "align")),
            "config_hash": cfg.section_hash("train", "align"), "shards": [path.name for path in shards]}
    return model, info, notes


def _initial_model(cfg: Config, layout: VocabLayout, codebook) -> tuple[VideoBert, list[str]]:
    """`build_model` with its config errors (those naming a train.* key: an init checkpoint that cannot be
    loaded, a vocabulary or length it cannot take) as ConfigError."""
    t = cfg.train
    try:
        return build_model(t.init_checkpoint, layout, codebook.centroids[-1], codebook.counts[-1],
                           max_len=t.max_len, seed=t.seed)
    except (OSError, ValueError) as error:
        if not str(error).startswith("train."):
            raise
        raise ConfigError(f"config error: {storage.one_line(error).split(': ', 1)[1]}") from None


def _restart_checks(cfg: Config, work: WorkDir, runtime: Runtime, codebook, shards: list[Path]) -> None:
    """What `--restart` checks before it moves the old run aside: the new run's batch shape, subset and
    initial model can be made (a ConfigError naming the key otherwise; the inputs were checked before)."""
    t = cfg.train
    try:
        _micro_batch_size(t.batch_size, t.grad_accum, runtime.world_size)
        subset_shards(cfg, work, shards, write=False)
    except ValueError as error:
        raise ConfigError(f"config error: {error}") from None
    layout = VocabLayout.from_tokenizer(load_tokenizer(cfg.align.tokenizer), codebook.num_leaves)
    _initial_model(cfg, layout, codebook)       # built and dropped: _setup builds it again, from the same seed


def _setup(cfg: Config, runtime: Runtime, shards: list[Path], codebook, lineage: dict, latest: Path | None,
           state: dict | None, stop_step: int) -> Run:
    """Model, optimiser, scheduler and the data loader, all restored from `state` when resuming."""
    t = cfg.train
    micro_batch = _micro_batch_size(t.batch_size, t.grad_accum, runtime.world_size)
    tokenizer = load_tokenizer(cfg.align.tokenizer)
    layout = VocabLayout.from_tokenizer(tokenizer, codebook.num_leaves)
    streams = streams_per_rank(len(shards), runtime.world_size, t.num_workers)
    data_shape = {"world_size": runtime.world_size, "streams_per_rank": streams, "micro_batch": micro_batch}
    model, info, notes = _model(cfg, layout, codebook, lineage, shards, latest, state, data_shape)
    if t.freeze_input_embeddings:
        # the paper freezes the input embeddings (text and visual rows) for the whole pre-training
        model.word_embeddings.weight.requires_grad_(False)
    model.to(runtime.device)
    wrapped = (DistributedDataParallel(model, device_ids=[runtime.device] if runtime.device.type == "cuda" else None)
               if runtime.distributed else model)
    optimizer = make_optimizer(model, t.lr, t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(t.warmup_steps, t.max_steps))
    saved = state["ranks"][runtime.rank] if state is not None else {"plan_states": {}}
    dataset = ShardDataset(shards, layout, replacement_text_ids(tokenizer), DataParams.from_config(t), micro_batch,
                           t.seed, runtime.rank, runtime.world_size,
                           start_batch=state["micro_batches"] if state is not None else 0,
                           plan_states=saved["plan_states"], checkpoint_every=t.checkpoint_every * t.grad_accum,
                           stop_batch=stop_step * t.grad_accum)
    # its own generator: creating the loader must not draw from the global RNG that dropout uses
    loader = DataLoader(dataset, batch_size=None, num_workers=streams if t.num_workers else 0,
                        pin_memory=runtime.device.type == "cuda", generator=torch.Generator())
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(saved["rng"], runtime.device)
    else:
        torch.manual_seed(t.seed + runtime.rank)     # dropout differs between ranks
    examples = saved["examples"] if state is not None else torch.zeros(len(REGIMES))
    return Run(model, wrapped, optimizer, scheduler, iter(loader), info, notes, data_shape,
               examples.to(runtime.device), dict(saved["plan_states"]))


def _open_log(cfg: Config, work: WorkDir, runtime: Runtime, run: Run, start_step: int, shards: list[Path],
              resumed: bool, quiet: bool, extra: dict | None = None):
    """The log file (None off rank 0), with its start or resume record (and `extra`) written."""
    if not runtime.main:
        return None
    total_params, trainable_params = count_parameters(run.model)
    header = {"event": "resume" if resumed else "start", "step": start_step, "time": time.time(),
              "notes": run.notes, "parameters": total_params, "trainable_parameters": trainable_params,
              "device": str(runtime.device), "threads": threads.describe(cfg.train.num_threads),
              "shards": len(shards), **run.data_shape,
              "config": json.loads(cfg.section_json("train")), **(extra or {})}
    work.train_log.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(work.train_log, "a", buffering=1)
    log_file.write(json.dumps(header) + "\n")
    if not quiet:
        for note in run.notes:
            print(f"[train] {note}", file=sys.stderr)
        shape = run.data_shape
        print(f"[train] {total_params:,} parameters ({trainable_params:,} trainable), {len(shards)} shards, "
              f"{runtime.world_size} rank(s) x {shape['streams_per_rank']} data stream(s), micro-batch "
              f"{shape['micro_batch']}, device {runtime.device}", file=sys.stderr)
    return log_file


def _train_step(run: Run, window: Window, cfg: Config, runtime: Runtime) -> tuple[int, float]:
    """One optimiser step over `grad_accum` micro-batches; returns (tokens, the learning rate it used)."""
    t = cfg.train
    tokens = 0
    step_loss = torch.zeros((), device=runtime.device)
    for micro in range(t.grad_accum):
        batch = next(run.batches)
        if "plan_state" in batch:            # its stream's position, for the next checkpoint
            plan_state = batch.pop("plan_state")
            run.plan_states[plan_state["stream"]] = plan_state
        tokens += int(batch["attention_mask"].sum())
        batch = {name: tensor.to(runtime.device, non_blocking=True) for name, tensor in batch.items()}
        # gradients are all-reduced once per step, on the last micro-batch
        sync = micro == t.grad_accum - 1 or not runtime.distributed
        with contextlib.nullcontext() if sync else run.wrapped.no_sync():
            with autocast(runtime.device, t.precision):
                loss, metrics = compute_losses(run.wrapped, batch, t.loss_weights)
            (loss / t.grad_accum).backward()
        window.metrics += metrics
        window.loss_sum += loss.detach() / t.grad_accum
        step_loss += loss.detach() / t.grad_accum
        run.examples += metrics[:len(REGIMES), -1]
    trainable = [p for p in run.model.parameters() if p.requires_grad]
    if t.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, t.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainable if p.grad is not None])
    _stop_if_not_finite(run, step_loss, grad_norm, runtime)
    lr = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    window.steps += 1
    window.tokens += tokens
    return tokens, lr


def _train(cfg: Config, work: WorkDir, files: WorkDir, runtime: Runtime, resume: bool, restart: bool,
           quiet: bool) -> dict:
    t = cfg.train
    # inputs (current align shards of this codebook) and the checkpoint to continue
    lineage, codebook, shards = training_inputs(cfg, work)
    if restart:
        _restart_checks(cfg, work, runtime, codebook, shards)
    latest, state = _open_checkpoint(work, files, runtime, lineage, resume, restart, quiet)
    # YouCook II's evaluation videos never reach pre-training (videobert/youcook2.py; written by rank 0)
    shards, kept_apart = youcook2.keep_apart(cfg, work, shards, write=runtime.main, quiet=quiet)
    if runtime.distributed and kept_apart:
        dist.barrier()
    # train.validation_videos: held-out videos, never trained on; then train.subset_videos: the segments of a
    # seeded subset of the other videos only (both written by rank 0)
    align_shards = shards
    shards, validation_videos, test_videos = _held_out(cfg, work, shards, runtime)
    shards = subset_shards(cfg, work, shards, write=runtime.main)
    if runtime.distributed and cfg.train.subset_videos:
        dist.barrier()
    start_step = state["step"] if state else 0
    if start_step >= t.max_steps:
        return {"step": start_step, "max_steps": t.max_steps, "finished": True, "steps_this_run": 0,
                "checkpoint": str(latest)}
    stop_step = t.max_steps if t.steps_per_run == 0 else min(t.max_steps, start_step + t.steps_per_run)
    # model, optimiser, scheduler, data and RNG states: restored from the checkpoint when resuming
    run = _setup(cfg, runtime, shards, codebook, lineage, latest, state, stop_step)
    run.info["validation_videos"] = validation_videos
    run.info["align_sha256"] = getattr(align_shards, "sha256", None)   # the bytes it reads (pinned: stream.pin_shards)
    run.info["test_videos"] = test_videos
    validation = _validation_set(cfg, run, align_shards, validation_videos)
    window = Window(runtime.device)
    if state is not None:
        window.load(state["ranks"][runtime.rank]["window"])
    warnings = _start_warnings(cfg, runtime, shards, quiet, validation)
    log_file = _open_log(cfg, files, runtime, run, start_step, shards, state is not None, quiet,
                         {"warnings": warnings, "validation_videos": validation_videos, "test_videos": test_videos})
    log_file = tensorboard_log.tee(cfg, files, log_file)      # train.tensorboard: the same records as events
    last_validation = None

    step, last_record, checkpoint, started = start_step, None, latest, time.time()
    run.wrapped.train()
    try:
        with Progress(total=stop_step - start_step, unit="steps", desc="train",
                      quiet=quiet or not runtime.main) as progress:
            while step < stop_step:
                # forward, backward and the optimiser step over grad_accum micro-batches
                tokens, lr = _train_step(run, window, cfg, runtime)
                step += 1
                progress.update(1, tokens=tokens)
                # a log record of the metrics summed since the last one (over all ranks)
                if step % t.log_every == 0 or step == t.max_steps:
                    last_record = window.record(step, lr, runtime)
                    if log_file is not None:
                        log_file.write(json.dumps(last_record) + "\n")
                        if not quiet:
                            print(f"[train] {format_record(last_record, t.max_steps)}", file=sys.stderr)
                    window = Window(runtime.device)
                if validation is not None and (step % t.validation_every == 0 or step == t.max_steps):
                    last_validation = _validate(run, validation, step, cfg, runtime, log_file, quiet)
                # a checkpoint: model, optimiser, scheduler, RNG states, data position, the open window
                if step % t.checkpoint_every == 0 or step == stop_step:
                    trainer_state = {"optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
                                     "micro_batches": step * t.grad_accum, "data_shape": run.data_shape}
                    rank_state = {"window": window.state(), "examples": run.examples.cpu(),
                                  "plan_states": run.plan_states}
                    checkpoint = _save_checkpoint(files, step, run.model, run.info, trainer_state, rank_state,
                                                  runtime, t.keep_checkpoints)
                    if runtime.main:
                        checkpoints.push(files, work)   # a work dir on object storage gets it now
        # the realised regime mix of everything trained on so far, summed over ranks
        if runtime.distributed:
            dist.all_reduce(run.examples)
        line, mix = mix_line(run.examples.cpu(), cfg)
        if log_file is not None and not quiet:
            print(f"[train] {line}", file=sys.stderr)
    finally:
        if log_file is not None:
            log_file.close()
            checkpoints.push(files, work)
    return {"step": step, "max_steps": t.max_steps, "finished": step >= t.max_steps,
            "steps_this_run": step - start_step, "checkpoint": str(checkpoint), "regime_mix": mix,
            "seconds": round(time.time() - started, 3), "last": last_record, "validation": last_validation,
            "log": str(work.train_log)}


# ---------------------------------------------------------------- held-out validation and data warnings

def _held_out(cfg: Config, work: WorkDir, shards: list[Path],
              runtime: Runtime) -> tuple[list[Path], list[str], list[str]]:
    """(the shards to train on, the validation videos, the test videos); see videobert/validation.py."""
    kept, videos, test = split_shards(cfg, work, shards, write=runtime.main)
    if runtime.distributed and (videos or test):
        dist.barrier()
    return kept, videos, test


def _validation_set(cfg: Config, run: Run, align_shards: list[Path], videos: list[str]) -> Protocols | None:
    if not videos:
        return None
    layout = run.model.layout
    return Protocols.build(read_validation_videos(align_shards, layout, videos), layout,
                           replacement_text_ids(load_tokenizer(cfg.align.tokenizer)),
                           DataParams.from_config(cfg.train), cfg.train.seed)


def _validate(run: Run, validation: Protocols, step: int, cfg: Config, runtime: Runtime, log_file,
              quiet: bool) -> dict:
    """The held-out metrics, clean protocol and the run's own (the same on every rank), logged by rank 0."""
    record = validate_protocols(run.model, validation, step, run.data_shape["micro_batch"], runtime.device,
                                lambda: autocast(runtime.device, cfg.train.precision), runtime.rank,
                                runtime.world_size)
    if log_file is not None:
        log_file.write(json.dumps(record) + "\n")
        if not quiet:
            print(f"[train] {format_validation(record)}", file=sys.stderr)
    return record


def _start_warnings(cfg: Config, runtime: Runtime, shards: list[Path], quiet: bool,
                    validation: Protocols | None = None) -> list[str]:
    """Where the training data cannot teach (videobert/data_checks.py) and what the held-out videos cannot
    measure: printed once, by rank 0."""
    if not runtime.main:
        return []
    from videobert.data_checks import data_warnings

    t = cfg.train
    warnings = data_warnings(shards, t.batch_size, t.regime_weights, t.regime_mix)
    warnings += validation.warnings() if validation is not None else []
    if not quiet:
        for warning in warnings:
            print(f"[train] warning: {warning}", file=sys.stderr)
    return warnings
