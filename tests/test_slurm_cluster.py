"""The pipeline on a real two-node Slurm (scripts/slurm_cluster.py: munged, slurmctld and `slurmd -N n1/n2` on this
machine, MaxArraySize 2): `submit pipeline` (features -> kmeans -> quantize -> asr -> align -> train, afterok)
over more shards than MaxArraySize, under --array-parallelism, gives the local run's bytes in every data
folder; train on both nodes (srun, one torchrun each, gloo) requeued mid-run ends with the checkpoint of an
uninterrupted two-process local run; and the scheduler's faults: a running task requeued, a task killed with
SIGKILL then retried with --only-incomplete, a training job past its time limit, a shard that fails for good
(its downstream jobs cancelled, `status` and `errors` naming it), sbatch's refusals."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from media_factory import make_video, pattern_of

from pipeline import cli
from pipeline.engine.lineage import Lineage
from scripts.slurm_cluster import SlurmCluster, missing_programs
from videobert.checkpoints import problem_of as checkpoints_problem

# the real schedulers run in `make test-cluster` (CI runs it after `make test`)
pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent
MAX_ARRAY_SIZE = 2
VIDEOS = 3
# tiny everywhere: 2 s videos, S3D's smallest clips with random weights, transcripts beside the videos (no
# Whisper), a 2-leaf codebook, a tiny BERT. One encoder thread on Slurm and locally (a task's default is its
# CPUs, 1; the local run's the machine's, 2): in float32 (features.precision auto on a CPU without bf16) a
# vector's last bits depend on the thread count
STAGE_SETTINGS = [
    "features.weights=random",
    "features.num_threads=1",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.batch_size=2",
    "features.decode_workers=0",
    "shards.videos_per_shard=1",
    "kmeans.k=2",
    "kmeans.depth=1",
    "kmeans.niter=5",
    "asr.language=en",
]
TRAIN_SETTINGS = [
    "train.init_checkpoint=random:tiny",
    "train.batch_size=4",
    "train.max_steps=6",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=5",
    "train.num_workers=0",
    "train.num_threads=1",
    "train.max_len=48",
    "train.log_every=1",
    "train.shuffle_buffer=8",
]
SLURM_SETTINGS = ["executor.slurm_cpus_per_task=1", "executor.slurm_mem=200M", "executor.slurm_time='00:10:00'"]


@pytest.fixture(scope="module")
def slurm():
    missing = missing_programs()
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} not found): apt-get install slurm-wlm munge")
    cluster = SlurmCluster(max_array_size=MAX_ARRAY_SIZE).start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", str(cluster.conf))  # for submit, scontrol and the jobs
            yield cluster
    finally:
        cluster.stop()


def _settings(*extra: str) -> list[str]:
    return [word for value in (*STAGE_SETTINGS, *extra) for word in ("--set", value)]


def _videos(folder: Path, count: int = VIDEOS) -> Path:
    folder.mkdir()
    for index in range(count):
        make_video(folder / f"v{index}.mp4", duration_s=2.0, fps=25, frame_fn=pattern_of(index))  # not copies
        (folder / f"v{index}.vtt").write_text(
            f"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nchop onion {index}.\n\n"
            f"00:00:01.000 --> 00:00:02.000\nstir the pan.\n"
        )
    return folder


def _pipeline(*args, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, f"{args[:2]} failed:\n{done.stderr[-3000:]}"
    return done


def _data_files(work: Path) -> dict[str, bytes]:
    """Every data file (not the completion records or logs, which hold times and hosts) by relative path."""
    return {
        str(p.relative_to(work)): p.read_bytes()
        for p in sorted(work.rglob("*"))
        if p.is_file() and p.suffix in (".parquet", ".safetensors") and "train" not in p.relative_to(work).parts
    }


def _checkpoint(work: Path, step: int) -> dict[str, bytes]:
    folder = work / "train" / "checkpoints" / f"step-{step:08d}"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _wait_for(ready, timeout_s: float, what: str, cluster: SlurmCluster):
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s} s; queue {cluster.jobs()}")
        time.sleep(0.2)


def _requeue(cluster: SlurmCluster, job: str, before_start=lambda: None) -> None:
    """`scontrol requeue`, then start it again at once: Slurm holds a requeued job back for a while (its
    begin time moves on), which a test need not wait out."""
    cluster.scontrol("requeue", job)
    _wait_for(lambda: set(cluster.job_states(job).values()) == {"PENDING"}, 120, f"job {job} pending again", cluster)
    before_start()
    cluster.scontrol("update", f"JobId={job}", "StartTime=now")


def _restarts(cluster: SlurmCluster, job: str) -> int:
    record = cluster.scontrol("show", "job", "--oneliner", job)
    return int(record.split("Restarts=")[1].split()[0])


@pytest.fixture(scope="module")
def chain(slurm, tmp_path_factory):
    """The same videos through `submit pipeline --with-train` and through local commands."""
    root = tmp_path_factory.mktemp("slurm-chain")
    videos = _videos(root / "videos")
    on_slurm, local = root / "slurm", root / "local"
    rdzv_port = _free_port()
    for work in (on_slurm, local):
        assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet", *_settings()]) == 0
    submitted = _pipeline(
        "submit",
        "pipeline",
        "--with-train",
        "--work-dir",
        on_slurm,
        "--array-parallelism",
        2,
        *_settings(*TRAIN_SETTINGS, *SLURM_SETTINGS, "executor.slurm_nodes=2", f"executor.slurm_rdzv_port={rdzv_port}"),
    )
    jobs = dict(line.split() for line in submitted.stdout.splitlines())
    # while Slurm works: the local run, stage by stage, then a two-process training run
    for stage in ("features", "quality", "dedup", "kmeans", "quantize", "asr", "align"):
        # in this process, as each Slurm task runs its shards (--workers is the task's CPUs, 1 here)
        assert cli.main([stage, "--work-dir", str(local), "--quiet", "--workers", "1", *_settings()]) == 0, stage
    # train requeued once it has saved its first checkpoint: it must resume from it
    first = on_slurm / "train" / "checkpoints" / "step-00000002" / "trainer.pt"
    _wait_for(first.exists, 300, "train's first checkpoint", slurm)
    _requeue(slurm, jobs["train"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "pipeline",
            "train",
            "--work-dir",
            str(local),
            "--quiet",
            "--resume",
            *_settings(*TRAIN_SETTINGS),
        ],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    slurm.wait_for_jobs(300)
    return {"slurm": on_slurm, "local": local, "jobs": jobs, "cluster": slurm}


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_submit_pipeline_runs_every_stage_on_both_nodes_with_the_local_runs_bytes(chain):
    cluster, jobs = chain["cluster"], chain["jobs"]
    assert list(jobs) == ["features", "shots", "quality", "dedup", "kmeans", "quantize", "asr", "align", "train"]
    for stage in ("features", "shots", "quality", "quantize", "asr", "align"):
        # 3 tasks, MaxArraySize 2 (read from the cluster, no setting): two array jobs
        assert len(jobs[stage].split(":")) == 2, jobs
        states = {}
        for job in jobs[stage].split(":"):
            states.update(cluster.job_states(job))
        assert sorted(states.values()) == ["COMPLETED"] * VIDEOS, (stage, states)
    for stage in ("kmeans", "dedup"):
        assert cluster.job_states(jobs[stage]) == {jobs[stage]: "COMPLETED"}
    local, on_slurm = _data_files(chain["local"]), _data_files(chain["slurm"])
    # the manifest; per shard decode's clips and videos, features, shots, quality's clips and videos, quantize,
    # asr and align, and the error tables of decode, features, shots, quality, quantize, asr and align; the
    # codebook and the near-duplicate groups
    assert len(local) == 1 + VIDEOS * (9 + 7) + 2 and "kmeans/codebook.safetensors" in local
    assert "dedup/groups.parquet" in local
    assert on_slurm.keys() == local.keys()
    assert [name for name in local if on_slurm[name] != local[name]] == []
    assert Lineage(chain["slurm"]).stage_states("align", verify=True)[0].current


def test_train_on_two_nodes_requeued_mid_run_ends_with_the_two_process_local_checkpoint(chain):
    cluster, job = chain["cluster"], chain["jobs"]["train"]
    assert cluster.job_states(job) == {job: "COMPLETED"}
    assert _restarts(cluster, job) == 1
    record = cluster.scontrol("show", "job", "--oneliner", job)
    assert "NumNodes=2" in record and "NodeList=n[1-2]" in record
    log = [json.loads(line) for line in (chain["slurm"] / "train" / "log.jsonl").read_text().splitlines()]
    starts = [r for r in log if r["event"] in ("start", "resume")]
    assert starts[0]["event"] == "start" and starts[0]["world_size"] == 2
    assert [r["event"] for r in starts[1:]] == ["resume"] and starts[1]["step"] >= 2
    for step in (2, 4, 6):
        assert _checkpoint(chain["slurm"], step) == _checkpoint(chain["local"], step), step


# ---------------------------------------------------------------- the scheduler's faults


def _decode_run(root: Path, count: int = VIDEOS) -> tuple[Path, Path]:
    """A work dir with its manifest for the Slurm run, and the local run's decode outputs beside it."""
    videos = _videos(root / "videos", count)
    on_slurm, local = root / "slurm", root / "local"
    for work in (on_slurm, local):
        assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet", *_settings()]) == 0
    assert cli.main(["decode", "--work-dir", str(local), "--quiet", "--workers", "1", *_settings()]) == 0
    return on_slurm, local


def _records(work: Path, stage: str) -> dict[int, bytes]:
    return {
        int(p.stem.split("-")[1]): p.read_bytes()
        for p in sorted((work / "_state" / "done" / stage).glob("part-*.json"))
    }


def _submit(*args) -> str:
    return _pipeline("submit", *args, "--quiet", *_settings(*SLURM_SETTINGS)).stdout.strip()


def _hold_decode(monkeypatch, release: Path) -> None:
    """The jobs submitted from here on decode their first shard, then wait before any other until `release`
    exists (tests/slurm_hold): a test can act on a task that is surely still running."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests" / "slurm_hold"), str(REPO)]))
    monkeypatch.setenv("VIDEOBERT_HOLD_DECODE", str(release))


def test_a_running_task_requeued_keeps_its_finished_shards_and_completes_the_rest(slurm, tmp_path, monkeypatch):
    on_slurm, local = _decode_run(tmp_path)
    # the task holds after its first shard: it is running when requeued, whatever the machine's speed
    release = tmp_path / "release"
    _hold_decode(monkeypatch, release)
    job = _submit("decode", "--work-dir", on_slurm, "--num-shards", 1)  # one task: shards 0, 1, 2 in turn
    _wait_for(lambda: _records(on_slurm, "decode"), 120, "the task's first shard", slurm)
    before = _records(on_slurm, "decode")
    assert sorted(before) == [0]
    _requeue(slurm, job, before_start=release.touch)
    slurm.wait_for_jobs(180)
    assert slurm.job_states(job) == {f"{job}_0": "COMPLETED"} and _restarts(slurm, job) == 1
    after = _records(on_slurm, "decode")
    assert sorted(after) == [0, 1, 2]
    assert {shard: after[shard] for shard in before} == before  # not done twice
    # the second attempt's summary: the shard finished before the requeue was skipped
    log = next((on_slurm / "_state" / "slurm" / "logs").glob("videobert-decode-*.out")).read_text()
    assert "DUE TO JOB REQUEUE" in log
    summaries = re.findall(r"decode: (\d+) shard\(s\) run, (\d+) already current", log)
    run, skipped = map(int, summaries[-1])
    assert (run, skipped) == (2, 1)
    assert _data_files(on_slurm) == _data_files(local)


def test_a_task_killed_with_sigkill_leaves_no_complete_output_and_only_it_is_resubmitted(slurm, tmp_path, monkeypatch):
    on_slurm, local = _decode_run(tmp_path)
    release = tmp_path / "release"
    _hold_decode(monkeypatch, release)
    # three tasks, one a shard each, tasks 1 and 2 held before their shard: task 2 is killed while it waits
    jobs = _submit("decode", "--work-dir", on_slurm).split(":")
    assert len(jobs) == 2  # MaxArraySize 2, read from the cluster
    victim = f"{jobs[1]}_0"  # task 2
    _wait_for(lambda: slurm.job_states(jobs[1]).get(victim) == "RUNNING", 120, "task 2 running", slurm)
    subprocess.run(["scancel", "--signal=KILL", victim], check=True, timeout=60)
    _wait_for(
        lambda: slurm.job_states(jobs[1]).get(victim) not in ("RUNNING", "COMPLETING"), 120, "task 2 ended", slurm
    )
    release.touch()
    slurm.wait_for_jobs(180)
    assert slurm.job_states(jobs[1])[victim] != "COMPLETED"
    lineage = Lineage(on_slurm)
    assert lineage.state("decode", 2, verify=True).status == "missing"  # nothing passes for complete
    assert all(lineage.state("decode", shard, verify=True).current for shard in (0, 1))
    status = _pipeline("status", "--work-dir", on_slurm).stdout
    assert re.search(r"^decode +2/3 ", status, re.MULTILINE), status

    retry = _pipeline(
        "submit", "decode", "--work-dir", on_slurm, "--only-incomplete", "--dry-run", *_settings(*SLURM_SETTINGS)
    ).stdout
    assert retry.count("#!/bin/bash") == 1 and "#SBATCH --array=0\n" in retry  # task 2 alone, as task 2
    assert '--shard "$((SLURM_ARRAY_TASK_ID + 2))" --num-shards 3' in retry
    again = _submit("decode", "--work-dir", on_slurm, "--only-incomplete")
    slurm.wait_for_jobs(180)
    assert slurm.job_states(again) == {f"{again}_0": "COMPLETED"}
    assert _data_files(on_slurm) == _data_files(local)
    done = _pipeline("submit", "decode", "--work-dir", on_slurm, "--only-incomplete", *_settings(*SLURM_SETTINGS))
    assert done.stdout.strip() == "" and "every shard of decode is current" in done.stderr


def test_a_shard_that_fails_for_good_cancels_what_depends_on_it_and_status_names_it(slurm, tmp_path):
    videos = _videos(tmp_path / "videos")
    (videos / "v2.mp4").write_text("not a video")  # its shard: every video failed, the task exits 3
    work = tmp_path / "work"
    assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet", *_settings()]) == 0
    jobs = dict(line.split() for line in _submit("pipeline", "--work-dir", work).splitlines())
    slurm.wait_for_jobs(300)
    features = {}
    for job in jobs["features"].split(":"):
        features.update(slurm.job_states(job))
    assert sorted(features.values()) == ["COMPLETED", "COMPLETED", "FAILED"], features
    # everything downstream of features is cancelled by its dependency, asr (manifest only) still runs
    for stage in ("kmeans", "quantize", "align"):
        states = {state for job in jobs[stage].split(":") for state in slurm.job_states(job).values()}
        assert states == {"CANCELLED"}, (stage, states)
    assert {s for job in jobs["asr"].split(":") for s in slurm.job_states(job).values()} == {"COMPLETED"}
    # which task, and why: its log ends with the stage's verdict; errors names the shard, the video, the cause
    failed = next(task for task, state in features.items() if state == "FAILED")
    log = (work / "_state" / "slurm" / "logs" / f"videobert-features-{failed}.out").read_text().splitlines()
    assert log[-1].startswith("features: 1 of 1 videos failed (100%), more than executor.max_failed_share=0.5")
    status = _pipeline("status", "--work-dir", work).stdout
    assert re.search(r"^features +3/3 .*VideoDecodeError 1$", status, re.MULTILINE), status
    assert re.search(r"^kmeans +not run$", status, re.MULTILINE), status
    errors = _pipeline("errors", "--work-dir", work).stdout
    assert re.search(
        r"^decode, features part 00002 +v2-\w+ +VideoDecodeError: cannot open .*v2\.mp4", errors, re.MULTILINE
    ), errors


def test_sbatch_refusing_an_array_prints_its_message_and_the_fix_in_one_line(slurm, tmp_path):
    on_slurm, _ = _decode_run(tmp_path)
    # a setting larger than the cluster's MaxArraySize: sbatch refuses the 3-task array
    done = _pipeline(
        "submit",
        "decode",
        "--work-dir",
        on_slurm,
        *_settings(*SLURM_SETTINGS, "executor.slurm_max_array_size=10"),
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    said = [line for line in done.stderr.splitlines() if line.startswith("submit:")]
    assert len(said) == 1 and done.stderr.endswith(said[0] + "\n"), done.stderr
    assert "sbatch: error: Batch job submission failed: Invalid job array specification" in said[0]
    assert "MaxArraySize" in said[0] and "set executor.slurm_max_array_size" in said[0]


def test_train_past_its_time_limit_keeps_only_complete_checkpoints_and_resumes_from_the_newest(chain, tmp_path):
    cluster = chain["cluster"]
    work = tmp_path / "work"
    shutil.copytree(chain["slurm"], work, ignore=shutil.ignore_patterns("train", "slurm"))
    # a run far longer than the time it is given (the chain's train.max_steps replaced)
    settings = _settings(
        *[s for s in TRAIN_SETTINGS if not s.startswith("train.max_steps=")],
        *SLURM_SETTINGS,
        "train.max_steps=100000",
        "executor.slurm_nodes=2",
        f"executor.slurm_rdzv_port={_free_port()}",
    )
    job = _pipeline("submit", "train", "--work-dir", work, "--quiet", *settings).stdout.strip()
    checkpoints = work / "train" / "checkpoints"
    _wait_for(lambda: (checkpoints / "step-00000002" / "trainer.pt").exists(), 300, "a first checkpoint", cluster)
    # its time is up in a few seconds: Slurm's next time-limit check ends it (SIGTERM, then SIGKILL after
    # KillWait). Not EndTime=now: scontrol reads "now" on its own clock, and slurmctld refuses an end time
    # already past ("Invalid time specified") when its second has ticked on before it handles the update.
    cluster.scontrol("update", f"JobId={job}", "EndTime=now+5")
    _wait_for(lambda: cluster.job_states(job)[job] not in ("RUNNING", "COMPLETING"), 120, "the time limit", cluster)
    assert cluster.job_states(job) == {job: "TIMEOUT"}
    # every checkpoint that passes for one is complete (a cut-off one is still under its temporary name)
    saved = sorted(checkpoints.glob("step-*"))
    assert saved and all(checkpoints_problem(folder) is None for folder in saved)
    newest = int(saved[-1].name.split("-")[1])
    again = _pipeline("submit", "train", "--work-dir", work, "--quiet", "--only-incomplete", *settings).stdout.strip()
    log = work / "train" / "log.jsonl"

    def resumed():
        records = [json.loads(line) for line in log.read_text().splitlines()]
        return [r for r in records if r["event"] == "resume"]

    _wait_for(resumed, 300, "the resubmitted job's resume", cluster)
    assert resumed()[0]["step"] == newest and resumed()[0]["world_size"] == 2
    subprocess.run(["scancel", again], check=True, timeout=60)
    cluster.wait_for_jobs(120)
