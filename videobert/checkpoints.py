"""Where training keeps its checkpoints and log: DIR/train/, written on a local disk.

A checkpoint folder `train/checkpoints/step-NNNNNNNN/` holds model.safetensors, model.json, trainer.pt and
checksums.json (the sha256 and size of the other three); it is written under a temporary name and renamed,
so a folder with that name is always complete, and every opening checks its files against the record
first (`verify`): a damaged checkpoint is refused in one line that offers the previous verified one.
A folder without checksums.json (written by an earlier version) is accepted with a note: refusing it would
strand every run made before, and loading still refuses a file that does not parse or non-finite weights.
Training holds DIR/_state/train.lock (`train_lock`) while it runs.

For a work dir on object storage, training writes into a local mirror of train/ (under the user's cache
folder), pulled before the run and pushed after every checkpoint: each folder's trainer.pt is uploaded
last, and a pull takes only folders that have one, so a half-uploaded checkpoint is never continued."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from pipeline import storage
from pipeline.engine.lineage import explain
from pipeline.engine.records import CorruptFile
from pipeline.engine.workdir import WorkDir

TRAINER_STATE_NAME = "trainer.pt"


def latest_checkpoint(files) -> Path | None:
    """The newest complete checkpoint folder (temporary ones start with '.') of a local train/."""
    folder = WorkDir(files).checkpoints
    found = sorted(folder.glob("step-*")) if folder.exists() else []
    return found[-1] if found else None


def mirror_root(work: WorkDir) -> Path:
    """The local folder standing in for a remote work dir's train/ (its path names the URL)."""
    return storage.user_cache("train-mirrors") / hashlib.sha256(str(work.root).encode()).hexdigest()[:16]


def mirror_of(work: WorkDir) -> WorkDir:
    """The work dir whose train/ training reads and writes, as it is: `work` on a local disk, else its mirror."""
    return WorkDir(mirror_root(work)) if storage.is_remote(work.root) else work


def local_files(work: WorkDir) -> WorkDir:
    """The work dir whose train/ training reads and writes: `work` itself on a local disk, else a local
    mirror brought up to date with the remote train/ (complete checkpoints and the log)."""
    if not storage.is_remote(work.root):
        return work
    mirror = mirror_of(work)
    remote = work.train_folder
    pulled = set()
    if remote.exists():
        for path in remote.rglob("*"):
            if path.is_dir():
                continue
            name = storage.relative_name(remote, path)
            parts = name.split("/")
            if (
                parts[0] == "checkpoints"
                and len(parts) > 2
                and not (remote / parts[0] / parts[1] / TRAINER_STATE_NAME).exists()
            ):
                continue  # an upload that did not finish
            local = mirror.train_folder / name
            pulled.add(name)
            if not local.exists() or local.stat().st_size != path.stat().st_size:
                local.parent.mkdir(parents=True, exist_ok=True)
                path.fs.get_file(path.path, str(local))
    # what the store does not hold (any more) is not part of the run: a mirror never has more than it
    if mirror.train_folder.exists():
        for local in sorted(mirror.train_folder.rglob("*"), reverse=True):
            name = str(local.relative_to(mirror.train_folder))
            if local.is_file() and name not in pulled:
                local.unlink()
            elif local.is_dir() and not any(local.iterdir()):
                local.rmdir()
    return mirror


def push(files: WorkDir, work: WorkDir) -> None:
    """Upload what the local mirror has and the remote train/ lacks (trainer.pt of each checkpoint last),
    and remove the remote checkpoints the mirror no longer keeps."""
    if files.root == work.root or not files.train_folder.exists():
        return
    # not temporaries, nor what is in a temporary folder (a checkpoint being written, one an evaluation holds)
    local_files_ = sorted(
        p
        for p in files.train_folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(files.train_folder).parts)
    )
    names = [str(p.relative_to(files.train_folder)) for p in local_files_]
    for path, name in sorted(zip(local_files_, names), key=lambda item: item[0].name == TRAINER_STATE_NAME):
        remote = work.train_folder / name
        if not remote.exists() or remote.stat().st_size != path.stat().st_size or name.endswith(".jsonl"):
            storage.publish(path, remote)
    kept = {name.split("/")[1] for name in names if name.startswith("checkpoints/")}
    if work.checkpoints.exists():
        for folder in work.checkpoints.glob("step-*"):
            if folder.name not in kept:
                folder.fs.rm(folder.path, recursive=True)


# ---------------------------------------------------------------- checksums, verified opening, rotation

CHECKSUMS_NAME = "checksums.json"


class CorruptCheckpoint(CorruptFile):
    """A checkpoint whose files are missing, truncated or not what its checksums record says; one line naming
    the file, and the previous complete, verified checkpoint to use instead."""


_FULL_DISK_WORDS = ("No space left", "os error 28", "ENOSPC")
_QUOTA_WORDS = ("quota exceeded", "os error 122", "EDQUOT")


@contextlib.contextmanager
def written(folder: Path):
    """Writes into a checkpoint folder, with the libraries' write errors as the OSError they are:
    safetensors says "I/O error: No space left on device (os error 28)" in a SafetensorError, torch.save
    only "file write failed" in a RuntimeError. The folder (half written) is removed, freeing its space."""
    try:
        yield
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    except Exception as error:  # noqa: BLE001 - re-raised as it is unless it is a failed write
        shutil.rmtree(folder, ignore_errors=True)
        text = str(error)
        code = (
            errno.ENOSPC
            if any(word in text for word in _FULL_DISK_WORDS)
            else errno.EDQUOT
            if any(word in text for word in _QUOTA_WORDS)
            else None
        )
        if code is None and ("write failed" in text or "I/O error" in text or "failed writing" in text):
            try:  # torch.save names no cause: the disk's free space does
                code = errno.ENOSPC if shutil.disk_usage(folder.parent).free < 16 << 20 else errno.EIO
            except OSError:
                code = errno.EIO
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(folder.parent)) from None


def write_checksums(folder: Path) -> dict:
    """Record the sha256 and size of every file of a checkpoint folder (before it is renamed into place)."""
    folder = Path(folder)
    files = {
        path.name: {"sha256": storage.file_sha256(path), "bytes": path.stat().st_size}
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != CHECKSUMS_NAME
    }
    record = {"format": 1, "files": files}
    storage.atomic_write_json(folder / CHECKSUMS_NAME, record)
    return record


def problem_of(folder: Path) -> str | None:
    """What is wrong with a checkpoint's files (one phrase naming the file), or None when every file its
    checksums record names is there with its size and sha256. A folder without the record (written before
    checksums were recorded) gives None too: see `unverified`."""
    folder = Path(folder)
    record_path = folder / CHECKSUMS_NAME
    if not folder.is_dir():
        return f"{folder} is missing"
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        files = record["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{record_path} cannot be read"
    for name, expected in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{path} is truncated or overwritten ({size:,} bytes, its record says {expected['bytes']:,})"
        if storage.file_sha256(path) != expected["sha256"]:
            return f"{path} does not match the sha256 recorded when it was written (damaged on disk or in transfer)"
    return None


def unverified(folder: Path) -> bool:
    """Whether a checkpoint predates checksums: accepted, its files unchecked (loading still refuses a
    truncated file or non-finite weights)."""
    return not (Path(folder) / CHECKSUMS_NAME).exists()


def previous_verified(folder: Path) -> Path | None:
    """The newest checkpoint before `folder` in its checkpoints folder that has a checksums record and
    matches it."""
    folder = Path(folder)
    earlier = [path for path in sorted(folder.parent.glob("step-*")) if path.name < folder.name]
    for path in reversed(earlier):
        if not unverified(path) and problem_of(path) is None:
            return path
    return None


def damaged(folder: Path, problem: str, *, resuming: bool) -> CorruptCheckpoint:
    """The one-line error for a damaged checkpoint, offering the previous complete, verified one."""
    folder = Path(folder)
    previous = previous_verified(folder)
    if previous is None:
        fix = (
            "no earlier verified checkpoint: `train --restart` moves the run aside and trains anew"
            if resuming
            else "no earlier verified checkpoint to evaluate instead"
        )
    elif resuming:
        fix = (
            f"the previous complete, verified checkpoint is {previous}: move {folder.name} out of "
            f"{folder.parent} and run `train --resume` again to continue from {previous.name}"
        )
    else:
        fix = f"the previous complete, verified checkpoint is {previous}: pass --checkpoint {previous}"
    return CorruptCheckpoint(f"checkpoint {folder.name} is damaged: {problem}; {fix}")


def verify(folder: Path, *, resuming: bool) -> list[str]:
    """Check a checkpoint's files against its checksums record before anything is loaded from it: raises
    CorruptCheckpoint naming the file, or returns notes (an older checkpoint without the record)."""
    problem = problem_of(folder)
    if problem is not None:
        raise damaged(folder, problem, resuming=resuming)
    if unverified(folder):
        return [
            f"{folder} has no {CHECKSUMS_NAME} (written by an earlier version): its files are not "
            f"verified, only that they load and its weights are finite"
        ]
    return []


def load_model(folder: Path, device="cpu", *, resuming: bool):
    """(model, info) of a verified checkpoint folder; a file that cannot be read or weights that are not
    finite are a CorruptCheckpoint too."""
    from videobert.model import WEIGHTS_NAME, VideoBert

    try:
        model, info = VideoBert.load(folder, device)
    except Exception as error:  # safetensors, JSON and shape errors alike: the folder cannot be used
        raise damaged(
            folder,
            f"{Path(folder) / WEIGHTS_NAME} or its model.json cannot be loaded ({storage.one_line(error)})",
            resuming=resuming,
        ) from None
    bad = non_finite_weights(model)
    if bad:
        raise damaged(folder, f"{Path(folder) / WEIGHTS_NAME} holds non-finite weights ({bad})", resuming=resuming)
    return model, info


def non_finite_weights(model) -> str:
    """Empty when every floating-point weight of `model` is finite, else the first such tensor's name and how
    many more there are ("encoder.x.weight and 2 more")."""
    bad = [
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and not bool(tensor.isfinite().all())
    ]
    return f"{bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}" if bad else ""


def load_trainer_state(folder: Path, *, resuming: bool = True) -> dict:
    """The trainer state (optimiser, scheduler, data position, RNG states) of a verified checkpoint."""
    import torch

    path = Path(folder) / TRAINER_STATE_NAME
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip, a pickle error: one line, not a traceback
        raise damaged(folder, f"{path} cannot be loaded ({storage.one_line(error)})", resuming=resuming) from None


def rotate(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (at least the newest one is always kept: only finite
    states are saved, so the newest checkpoint is the newest finite one); returns those deleted."""
    found = sorted(Path(folder).glob("step-*"))
    removed = found[: -max(keep, 1)]
    for old in removed:
        doomed = storage.atomic_path(old)  # out of the step-* names first: a run killed mid-delete leaves a
        os.replace(old, doomed)  # dead writer's temporary (the next run removes it), not a half checkpoint
        shutil.rmtree(doomed)
    return removed


# ---------------------------------------------------------------- reading a checkpoint while training runs


class RotatedOut(CorruptFile):
    """The checkpoint was deleted by a running train's rotation (train.keep_checkpoints) while it was opened."""


def _hold(folder: Path) -> Path:
    """Hard links to a checkpoint's files in a temporary folder beside it: a running train's rotation may
    delete the folder, and the linked bytes stay readable until they are loaded. RotatedOut when the folder
    goes while it is linked."""
    hold = storage.atomic_path(folder.parent / f"hold-{folder.name}")
    hold.mkdir()
    try:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                os.link(path, hold / path.name)
    except FileNotFoundError:
        shutil.rmtree(hold, ignore_errors=True)
        raise RotatedOut(f"{folder} was deleted while it was opened") from None
    except OSError:  # no hard links here: the folder is read in place, as before
        shutil.rmtree(hold, ignore_errors=True)
        return folder
    return hold


def load_for_evaluation(files, checkpoint: Path | None, device="cpu", *, attempts: int = 5):
    """(checkpoint, model, info, notes): `checkpoint`, or the newest complete one, held (`_hold`), verified
    and loaded from the held files, so that a running train's rotation (train.keep_checkpoints) can delete
    it meanwhile without harm. A checkpoint gone before it could be held: the newest is taken again, or, for
    one given, one line says it is gone and which one is newest. "Damaged" only for bytes that do not match
    their checksums."""
    for _ in range(attempts):
        path = Path(checkpoint) if checkpoint else latest_checkpoint(files)
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {WorkDir(files).checkpoints}: run train first")
        try:
            if not path.is_dir():
                raise RotatedOut(f"{path} does not exist")
            hold = _hold(path)
        except RotatedOut:
            if checkpoint is None:
                continue  # the newest one again
            newest = latest_checkpoint(files)
            raise RotatedOut(
                f"checkpoint {checkpoint} does not exist (a running train may have rotated it out: "
                f"train.keep_checkpoints); the newest is "
                f"{newest if newest is not None else 'none yet'}"
            ) from None
        try:
            if hold == path:
                notes = verify(path, resuming=False)
            else:
                problem = problem_of(hold)
                if problem is not None:  # the held bytes themselves: named by the checkpoint's own path
                    raise damaged(path, problem.replace(str(hold), str(path)), resuming=False)
                notes = [] if not unverified(hold) else verify(path, resuming=False)
            model, info = load_model(hold, device, resuming=False)
            return path, model, info, notes
        finally:
            if hold != path:
                shutil.rmtree(hold, ignore_errors=True)
    raise RotatedOut(
        f"the newest checkpoint in {WorkDir(files).checkpoints} was rotated out {attempts} times "
        f"before it could be opened (train saves faster than it can be read): raise "
        f"train.keep_checkpoints"
    )


# ---------------------------------------------------------------- a training run's checkpoints


def rng_state(device) -> dict:
    import torch

    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def save(root: Path, step: int, model, info: dict, trainer_state: dict, keep: int) -> Path:
    """Write checkpoint `root`/step-NNNNNNNN (model, model.json with `info`, trainer.pt with `trainer_state`: the
    optimiser, scheduler, data position and `ranks`, each rank's state; checksums.json) under a temporary
    name, rename it and keep the newest `keep`; a checkpoint that exists is left as it is."""
    import torch

    final = root / f"step-{step:08d}"
    if final.exists():
        return final
    tmp = storage.atomic_path(final)
    tmp.mkdir()
    with written(tmp):  # a full disk: one OSError naming it, not a library's traceback
        model.save(tmp, dict(info, step=step))
        torch.save(_interned_keys(trainer_state), tmp / TRAINER_STATE_NAME)
        write_checksums(tmp)  # inside the folder before it has its final name
    os.replace(tmp, final)
    rotate(root, keep)
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


def read_info(folder: Path) -> dict:
    """A verified checkpoint's model.json (how its model was made), or CorruptCheckpoint."""
    from videobert.model import INFO_NAME

    try:
        return json.loads((folder / INFO_NAME).read_text())
    except (OSError, ValueError) as error:
        raise damaged(
            folder, f"{folder / INFO_NAME} cannot be read ({storage.one_line(error)})", resuming=True
        ) from None


def require_same_lineage(folder: Path, info: dict, lineage: dict) -> None:
    """A checkpoint is continued only on the inputs and config it was trained with."""
    if info.get("lineage") != lineage:
        raise ValueError(
            f"{folder} was trained on other inputs or settings ({explain(info.get('lineage'), lineage)}): "
            f"`train --restart` moves the old run aside and trains anew"
        )


def move_aside(work: WorkDir, files: WorkDir) -> Path:
    """Move a run's train/ (and its local mirror's) to DIR/_state/replaced/train-<time>; returns where."""
    destination = work.state / "replaced" / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    if storage.is_remote(work.root):
        if work.train_folder.exists():
            work.train_folder.fs.mv(work.train_folder.path, destination.path, recursive=True)
        shutil.rmtree(files.train_folder, ignore_errors=True)
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(work.train_folder, destination)
    return destination


# ---------------------------------------------------------------- the errors a run stops with


class TrainingDiverged(ArithmeticError):
    """A non-finite loss, gradient norm or weight: the run stops at that step without saving the state."""

    def __init__(self, step: int, what: str):
        super().__init__(f"stopped at step {step}: {what}")
        self.step, self.what = step, what


class TrainingLocked(RuntimeError):
    """Another `train` holds the work dir's lock."""


def lock_path(work: WorkDir) -> Path:
    """The lock of a work dir's training: in its _state (a remote work dir's: in the local mirror)."""
    return mirror_of(work).state / "train.lock"


@contextlib.contextmanager
def train_lock(work: WorkDir):
    """Hold the work dir's training lock for the run, or refuse at once naming its holder. An flock: the
    kernel releases it when its process ends however it ends, so a dead run's lock is simply taken over."""
    path = lock_path(work)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 4096, 0).decode(errors="replace").strip() or "a process"
        os.close(descriptor)
        raise TrainingLocked(
            f"another train is running on {work.root} ({holder}, lock {path}): wait for it "
            f"to end, or stop it, then run train --resume"
        ) from None
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(
            descriptor,
            f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(),
            0,
        )
        yield path
    finally:
        os.ftruncate(descriptor, 0)
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)
