"""VideoBERT pre-training: AdamW with linear decay (optional warm-up), gradient accumulation, bf16 autocast
on GPU, data parallel under torchrun (gloo on CPU, nccl on GPU; shards split by rank).

Outputs in DIR/train/:
- checkpoints/step-NNNNNNNN/: model.safetensors + model.json (how the model was made) + trainer.pt
  (optimiser, scheduler, the data position, and per rank its RNG states, open log window and examples per
  regime so far); written under a temporary name and renamed, so a checkpoint folder is always complete,
  with checksums.json (the sha256 of its files, verified on every opening); the newest
  `train.keep_checkpoints` are kept;
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
are restored. `train.steps_per_run` stops a run early with a checkpoint, for time-limited batch jobs
chained with --resume.

A step whose loss or gradient norm is not finite, or a checkpoint whose weights are not, stops the run
(TrainingDiverged) before that state is applied or saved: every checkpoint on disk is finite, and the
newest is always kept. One run per work dir: rank 0 holds DIR/_state/train.lock for the whole run.

Settings: the config's `train` section, read as `t = s.cfg.train`. Read top to bottom (`Session`, what every
helper works with, is videobert/session.py): `train`, the loop `_train` and `_train_step`, then the helpers in
the order the loop calls them (ranks and devices: videobert/runtime.py; what it reads: train_inputs.py; the
model, optimiser and data: train_setup.py; checkpoint files: checkpoints.py; the log: train_log.py)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline import storage
from pipeline.config import Config, ConfigError
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from pipeline.tokenizer import load_tokenizer, vocabulary_sha256
from videobert import checkpoints, train_log
from videobert.checkpoints import CorruptCheckpoint, TrainingDiverged, TrainingLocked, latest_checkpoint
from videobert.data import REGIMES, DataParams, VocabLayout, replacement_text_ids
from videobert.data_checks import data_warnings
from videobert.metrics import Window, compute_losses, format_record, mix_line
from videobert.runtime import Runtime, autocast, on_rank_zero, start_runtime
from videobert.session import Session
from videobert.subset import subset_shards
from videobert.train_inputs import shards_to_train_on, training_inputs
from videobert.train_setup import initial_model, micro_batch_size, setup
from videobert.validation import Protocols, format_validation, read_validation_videos, validate_protocols


def identities(cfg: Config, videos: list[dict]) -> dict[str, str]:
    """What shapes a training run besides the train config and its inputs: the WordPiece vocabulary."""
    return {"tokenizer": vocabulary_sha256(load_tokenizer(cfg.align.tokenizer))}


def train(cfg: Config, work_dir, *, resume: bool = False, restart: bool = False, quiet: bool = False) -> dict:
    """Pre-train VideoBERT on DIR/align shards with the DIR/kmeans codebook; returns the final stats."""
    runtime, started_group = start_runtime(cfg.train.device, cfg.train.num_threads)
    work = WorkDir(work_dir)
    try:
        with _locked(work, runtime):
            # checkpoints and the log are written on a local disk: the work dir's, or a mirror of a remote
            # one, which each node's first rank brings up to date while the others wait
            local_first = int(os.environ.get("LOCAL_RANK", "0")) == 0
            files = checkpoints.local_files(work) if local_first else checkpoints.mirror_of(work)
            runtime.barrier()
            session = Session(cfg, runtime, work, files, quiet)
            try:
                return _train(session, resume, restart)
            except TrainingDiverged as error:
                raise _stopped(session, error) from None
    finally:
        if started_group:
            dist.destroy_process_group()


def _train(s: Session, resume: bool, restart: bool) -> dict:
    t, runtime = s.cfg.train, s.runtime
    # inputs (current align shards of this codebook) and the checkpoint to continue
    lineage, codebook, align_shards = training_inputs(s.cfg, s.work)
    if restart:
        _restart_checks(s, codebook, align_shards)
    latest, state = _open_checkpoint(s, lineage, resume, restart)
    # YouCook II's evaluation videos, the held-out videos and the videos outside train.subset_videos left out
    shards, align_shards, validation_videos, test_videos = shards_to_train_on(s, align_shards)
    start_step = state["step"] if state else 0
    if start_step >= t.max_steps:
        return {
            "step": start_step,
            "max_steps": t.max_steps,
            "finished": True,
            "steps_this_run": 0,
            "checkpoint": str(latest),
        }
    stop_step = t.max_steps if t.steps_per_run == 0 else min(t.max_steps, start_step + t.steps_per_run)
    # model, optimiser, scheduler, data and RNG states: restored from the checkpoint when resuming
    setup(s, shards, codebook, lineage, latest, state, stop_step)
    s.info["validation_videos"] = validation_videos
    s.info["align_sha256"] = getattr(align_shards, "sha256", None)  # the bytes it reads (pinned: shards.pin_shards)
    s.info["test_videos"] = test_videos
    validation = _validation_set(s, align_shards, validation_videos)
    window = Window(runtime.device)
    if state is not None:
        window.load(state["ranks"][runtime.rank]["window"])
    warnings = _start_warnings(s, shards, validation)
    s.log = train_log.open_log(
        s,
        start_step,
        shards,
        state is not None,
        {"warnings": warnings, "validation_videos": validation_videos, "test_videos": test_videos},
    )

    step, last_record, last_validation, checkpoint, started = start_step, None, None, latest, time.time()
    s.wrapped.train()
    try:
        with Progress(
            total=stop_step - start_step, unit="steps", desc="train", quiet=s.quiet or not runtime.main
        ) as progress:
            while step < stop_step:
                # forward, backward and the optimiser step over grad_accum micro-batches
                tokens, lr = _train_step(s, window)
                step += 1
                progress.update(1, tokens=tokens)
                # a log record of the metrics summed since the last one (over all ranks)
                if step % t.log_every == 0 or step == t.max_steps:
                    last_record = window.record(step, lr, runtime)
                    s.log.write(last_record, format_record(last_record, t.max_steps))
                    window = Window(runtime.device)
                if validation is not None and (step % t.validation_every == 0 or step == t.max_steps):
                    last_validation = _validate(s, validation, step)
                # a checkpoint: model, optimiser, scheduler, RNG states, data position, the open window
                if step % t.checkpoint_every == 0 or step == stop_step:
                    checkpoint = _save_checkpoint(s, step, window)
        # the realised regime mix of everything trained on so far, summed over ranks
        if runtime.distributed:
            dist.all_reduce(s.examples)
        line, mix = mix_line(s.examples.cpu(), s.cfg)
        s.log.say(line)
    finally:
        if s.log.open:
            s.log.close()
            checkpoints.push(s.files, s.work)
    return {
        "step": step,
        "max_steps": t.max_steps,
        "finished": step >= t.max_steps,
        "steps_this_run": step - start_step,
        "checkpoint": str(checkpoint),
        "regime_mix": mix,
        "seconds": round(time.time() - started, 3),
        "last": last_record,
        "validation": last_validation,
        "log": str(s.work.train_log),
    }


def _train_step(s: Session, window: Window) -> tuple[int, float]:
    """One optimiser step over `grad_accum` micro-batches; returns (tokens, the learning rate it used)."""
    t, device = s.cfg.train, s.runtime.device
    tokens = 0
    step_loss = torch.zeros((), device=device)
    for micro in range(t.grad_accum):
        batch = next(s.batches)
        if "plan_state" in batch:  # its stream's position, for the next checkpoint
            plan_state = batch.pop("plan_state")
            s.plan_states[plan_state["stream"]] = plan_state
        tokens += int(batch["attention_mask"].sum())
        batch = {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}
        # gradients are all-reduced once per step, on the last micro-batch
        sync = micro == t.grad_accum - 1 or not s.runtime.distributed
        with contextlib.nullcontext() if sync else s.wrapped.no_sync():
            with autocast(device, t.precision):
                loss, metrics = compute_losses(s.wrapped, batch, t.loss_weights)
            (loss / t.grad_accum).backward()
        window.metrics += metrics
        window.loss_sum += loss.detach() / t.grad_accum
        step_loss += loss.detach() / t.grad_accum
        s.examples += metrics[: len(REGIMES), -1]
    trainable = [p for p in s.model.parameters() if p.requires_grad]
    if t.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, t.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainable if p.grad is not None])
    _stop_if_not_finite(s, step_loss, grad_norm)
    lr = s.scheduler.get_last_lr()[0]
    s.optimizer.step()
    s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    window.steps += 1
    window.tokens += tokens
    return tokens, lr


def _stop_if_not_finite(s: Session, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
    """Stop before the optimiser step when this step's loss or gradient norm is not finite, whatever the
    cause (data, learning rate, weights): an update from it would make every later step NaN. Summed over
    ranks, so that every rank stops at the same step."""
    values = torch.stack([loss.detach().float(), grad_norm.detach().float().to(loss.device)])
    if s.runtime.distributed:
        dist.all_reduce(values)
    loss_value, norm_value = values.tolist()
    if math.isfinite(loss_value) and math.isfinite(norm_value):
        return
    what = "the loss" if not math.isfinite(loss_value) else "the gradient norm"
    raise TrainingDiverged(
        s.scheduler.last_epoch + 1,
        f"{what} is {loss_value if what == 'the loss' else norm_value} (loss {loss_value}, "
        f"gradient norm {norm_value}, learning rate {s.scheduler.get_last_lr()[0]})",
    )


# ---------------------------------------------------------------- one run per work dir; a diverged run's stop


@contextlib.contextmanager
def _locked(work: WorkDir, runtime: Runtime):
    """One run per work dir: rank 0 holds the lock (DIR/_state/train.lock) for the whole run; when it is
    taken, every rank refuses at once."""
    with contextlib.ExitStack() as stack:
        on_rank_zero(runtime, lambda: stack.enter_context(checkpoints.train_lock(work)), TrainingLocked)
        yield


def _stopped(s: Session, error: TrainingDiverged) -> TrainingDiverged:
    """The one-line stop of a diverged run, naming the checkpoint it keeps; a `stopped` record in the log."""
    kept = latest_checkpoint(s.files)
    fix = (
        f"nothing of this step was saved; the newest checkpoint {kept.name} is kept: lower train.lr or check "
        f"the data and the init checkpoint, then train --resume (or --restart)"
        if kept is not None
        else "nothing was saved: lower train.lr or check the data and train.init_checkpoint, then train again"
    )
    stopped = TrainingDiverged(error.step, f"{error.what}; {fix}")
    if s.runtime.main and s.files.train_log.exists():
        train_log.write_stopped(s.files.train_log, error.step, error.what, kept)
        checkpoints.push(s.files, s.work)
    return stopped


# ---------------------------------------------------------------- the checkpoint to continue


def _open_checkpoint(s: Session, lineage: dict, resume: bool, restart: bool) -> tuple[Path | None, dict | None]:
    """(the checkpoint to continue and its trainer state, or None, None for a new run)."""
    work, files = s.work, s.files
    if restart and s.runtime.main and (work.train_folder.exists() or files.train_folder.exists()):
        s.say(f"the previous run was moved to {checkpoints.move_aside(work, files)}")
    s.runtime.barrier()
    if s.runtime.main:
        storage.remove_stale_temporaries(files.checkpoints)  # a killed save's half-written folder
    latest = latest_checkpoint(files)
    if latest is None:
        return None, None
    if not resume:
        raise FileExistsError(
            f"{work.checkpoints} already holds {latest.name}: pass --resume to "
            f"continue that run, or --restart to move it aside and train anew"
        )
    # its files against the sha256 recorded when it was written, before anything is read from it
    for note in on_rank_zero(s.runtime, lambda: checkpoints.verify(latest, resuming=True), CorruptCheckpoint):
        s.say(note)
    checkpoints.require_same_lineage(latest, checkpoints.read_info(latest), lineage)
    return latest, checkpoints.load_trainer_state(latest)


def _restart_checks(s: Session, codebook, shards: list[Path]) -> None:
    """What `--restart` checks before it moves the old run aside: the new run's batch shape, subset and
    initial model can be made (a ConfigError naming the key otherwise; the inputs were checked before)."""
    t = s.cfg.train
    try:
        micro_batch_size(t.batch_size, t.grad_accum, s.runtime.world_size)
        subset_shards(s.cfg, s.work, shards, write=False)
    except ValueError as error:
        raise ConfigError(f"config error: {error}") from None
    layout = VocabLayout.from_tokenizer(load_tokenizer(s.cfg.align.tokenizer), codebook.num_leaves)
    initial_model(s.cfg, layout, codebook)  # built and dropped: setup builds it again, from the same seed


def _save_checkpoint(s: Session, step: int, window: Window) -> Path:
    """Model, optimiser, scheduler, data position and, per rank, the RNG states, open log window and examples
    per regime. Weights that are not finite are never saved (the same on every rank: DDP keeps them equal)."""
    t, runtime = s.cfg.train, s.runtime
    bad = checkpoints.non_finite_weights(s.model)
    if bad:
        raise TrainingDiverged(step, f"the weights hold non-finite values after the update ({bad})")
    rank_state = {
        "window": window.state(),
        "examples": s.examples.cpu(),
        "plan_states": s.plan_states,
        "rng": checkpoints.rng_state(runtime.device),
    }
    rank_states = [rank_state]
    if runtime.distributed:
        rank_states = [None] * runtime.world_size
        dist.all_gather_object(rank_states, rank_state)
    if runtime.main:
        trainer_state = {
            "optimizer": s.optimizer.state_dict(),
            "scheduler": s.scheduler.state_dict(),
            "micro_batches": step * t.grad_accum,
            "data_shape": s.data_shape,
            "step": step,
            "ranks": rank_states,
        }
        checkpoints.save(s.files.checkpoints, step, s.model, s.info, trainer_state, t.keep_checkpoints)
    runtime.barrier()
    if runtime.main:
        checkpoints.push(s.files, s.work)  # a work dir on object storage gets it now
    return s.files.checkpoints / f"step-{step:08d}"


# ---------------------------------------------------------------- the log, held-out validation and data warnings


def _validation_set(s: Session, align_shards: list[Path], videos: list[str]) -> Protocols | None:
    if not videos:
        return None
    layout, tokenizer = s.model.layout, load_tokenizer(s.cfg.align.tokenizer)
    return Protocols.build(
        read_validation_videos(align_shards, layout, videos),
        layout,
        replacement_text_ids(tokenizer),
        DataParams.from_config(s.cfg.train, tokenizer),
        s.cfg.train.seed,
    )


def _validate(s: Session, validation: Protocols, step: int) -> dict:
    """The held-out metrics, clean protocol and the run's own (the same on every rank), logged by rank 0."""
    runtime = s.runtime
    record = validate_protocols(
        s.model,
        validation,
        step,
        s.data_shape["micro_batch"],
        runtime.device,
        lambda: autocast(runtime.device, s.cfg.train.precision),
        runtime.rank,
        runtime.world_size,
    )
    s.log.write(record, format_validation(record))
    return record


def _start_warnings(s: Session, shards: list[Path], validation: Protocols | None) -> list[str]:
    """Where the training data cannot teach (videobert/data_checks.py) and what the held-out videos cannot
    measure: said once, by rank 0."""
    if not s.runtime.main:
        return []
    t = s.cfg.train
    warnings = data_warnings(shards, t.batch_size, t.regime_weights, t.regime_mix)
    warnings += validation.warnings() if validation is not None else []
    for warning in warnings:
        s.say(f"warning: {warning}")
    return warnings
