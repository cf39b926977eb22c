"""Where training keeps its checkpoints and log: DIR/train/, written on a local disk.

A checkpoint folder `train/checkpoints/step-NNNNNNNN/` holds model.safetensors, model.json and trainer.pt;
it is written under a temporary name and renamed, so a folder with that name is always complete.

For a work dir on object storage, training writes into a local mirror of train/ (under the user's cache
folder), pulled before the run and pushed after every checkpoint: each folder's trainer.pt is uploaded
last, and a pull takes only folders that have one, so a half-uploaded checkpoint is never continued."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline import storage
from pipeline.workdir import WorkDir

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
            if parts[0] == "checkpoints" and len(parts) > 2 and \
                    not (remote / parts[0] / parts[1] / TRAINER_STATE_NAME).exists():
                continue   # an upload that did not finish
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
    local_files_ = sorted(p for p in files.train_folder.rglob("*") if p.is_file() and not p.name.startswith("."))
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
