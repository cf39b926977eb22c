"""The work dir's layout: every path of every stage, state file and report, in one place.

Nothing else spells a path inside a work dir: stages, tools and tests ask a `WorkDir` for it."""

from __future__ import annotations

from pathlib import Path

STATE = "_state"  # pyarrow.dataset and most readers skip names starting with "_"


class LayoutError(ValueError):
    """The folder is not a work dir this version can use."""


def part_name(shard_index: int) -> str:
    return f"part-{shard_index:05d}.parquet"


class WorkDir:
    def __init__(self, root: str | Path | WorkDir):
        from pipeline.storage import location

        # a local folder, or a folder on object storage (s3://bucket/run1): the same paths either way
        self.root = root.root if isinstance(root, WorkDir) else location(root)

    def __repr__(self) -> str:
        return f"WorkDir({str(self.root)!r})"

    def __str__(self) -> str:
        return str(self.root)

    # ------------------------------------------------------------ data

    @property
    def manifest(self) -> Path:
        return self.root / "manifest" / "manifest.parquet"

    def data_folder(self, stage: str, table: str = "") -> Path:
        """The folder of one per-shard output table: one schema per folder, so that any Parquet reader
        opens it as a dataset. A stage's main table ("") is named after the stage; decode's per-video
        table is `videos`."""
        return self.root / (table or stage)

    def part(self, stage: str, shard_index: int, table: str = "") -> Path:
        return self.data_folder(stage, table) / part_name(shard_index)

    @property
    def kmeans_folder(self) -> Path:
        return self.root / "kmeans"

    @property
    def codebook(self) -> Path:
        return self.kmeans_folder / "codebook.safetensors"

    @property
    def codebook_sidecar(self) -> Path:
        return self.kmeans_folder / "codebook.json"

    @property
    def dedup_groups(self) -> Path:
        """The near-duplicate groups: one table for the collection (one schema, a folder of its own)."""
        return self.root / "dedup" / "groups.parquet"

    @property
    def train_folder(self) -> Path:
        return self.root / "train"

    @property
    def checkpoints(self) -> Path:
        return self.train_folder / "checkpoints"

    @property
    def train_log(self) -> Path:
        return self.train_folder / "log.jsonl"

    @property
    def eval_folder(self) -> Path:
        return self.root / "eval"

    # ------------------------------------------------------------ state: apart from the data
    # (completion records inside a data folder would break `read_parquet(DIR/align)` in every reader)

    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def temporaries(self) -> Path:
        """Files being written into a data folder, until they are complete and renamed into it."""
        return self.state / "tmp"

    def records_folder(self, stage: str) -> Path:
        return self.state / "done" / stage

    def record(self, stage: str, shard_index: int | None = None) -> Path:
        """A shard's completion record (written last, it is what marks the shard done), or with no shard
        the record of a whole-collection stage (manifest, kmeans)."""
        if shard_index is None:
            return self.state / "done" / f"{stage}.json"
        return self.records_folder(stage) / f"part-{shard_index:05d}.json"

    def failure(self, stage: str, shard_index: int) -> Path:
        """Why a shard's last attempt crashed (error and traceback); removed when the shard completes."""
        return self.state / "failed" / stage / f"part-{shard_index:05d}.json"

    @property
    def errors_folder(self) -> Path:
        """Per-video error rows of every stage: one schema, so the folder reads as one table."""
        return self.state / "errors"

    def errors(self, stage: str, shard_index: int) -> Path:
        return self.errors_folder / f"{stage}-{part_name(shard_index)}"

    def shard_log(self, stage: str, shard_index: int) -> Path:
        return self.state / "logs" / stage / f"part-{shard_index:05d}.log"

    @property
    def remembered_config(self) -> Path:
        """The resolved config of the last command that wrote here: later commands without --config use it."""
        return self.state / "config.json"

    @property
    def slurm_folder(self) -> Path:
        return self.state / "slurm"

    @property
    def slurm_logs(self) -> Path:
        return self.slurm_folder / "logs"

    def check_writable(self) -> None:
        """Fail now, in one line, on a work dir that cannot be written (read-only, full, not ours), instead
        of in the middle of the first shard."""
        import os
        import uuid

        from pipeline.storage import is_remote

        probe = self.state / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if is_remote(self.root):
            probe.write_bytes(b"\0")
            probe.unlink(missing_ok=True)
            return
        try:
            self.state.mkdir(parents=True, exist_ok=True)
            try:
                with open(probe, "wb") as handle:
                    handle.write(b"\0" * 4096)
                    handle.flush()
                    os.fsync(handle.fileno())
            finally:
                probe.unlink(missing_ok=True)
        except OSError as error:  # the probe file is ours, not the user's: the work dir is what to name
            error.filename = str(self.root)
            raise

    def check_layout(self) -> None:
        """Work dirs of earlier versions kept completion records inside the data folders (`<stage>/_done`);
        their records carry no lineage, so nothing in them can be trusted as current."""
        for old in sorted(self.root.glob("*/_done")):
            raise LayoutError(
                f"{self.root} was written by an earlier version of the pipeline ({old} holds "
                f"completion records without lineage): start a new work dir"
            )

    # ------------------------------------------------------------ reports

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def report_data(self) -> Path:
        return self.root / "report.json"

    @property
    def gallery(self) -> Path:
        return self.root / "gallery"

    # ------------------------------------------------------------ the dataset card: beside the data folders
    # (a file inside align/ would break reading the folder as a dataset)

    @property
    def card(self) -> Path:
        """A Hugging Face dataset card: `load_dataset(DIR)` finds the align shards through its configs."""
        return self.root / "README.md"

    @property
    def card_sidecar(self) -> Path:
        """What the shards mean (tokenizer, vocabularies, codebook, feature provenance), as JSON."""
        return self.root / "dataset.json"
