"""features: the stage's vector is torchvision's S3D pooled activation; weights are loaded and recorded;
frames reach the device as uint8 and are normalised there; random weights are calibrated; vanishing
features are refused; the stage's single pass writes the decode stage's outputs, as the decode stage would."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from media_factory import make_video
from torchvision.models.video import s3d

from pipeline import devices, storage
from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import write_manifest
from pipeline.engine.runner import run_one_shard, run_one_shard_safely
from pipeline.engine.workdir import WorkDir
from pipeline.media.video import ClipReader
from stages.features import run as features
from stages.features.s3d import model as s3d_model
from stages.features.s3d.encoder import S3DEncoder, autocast_dtype


def _reference_embedding(model, frames_uint8):
    """torchvision's own forward, capturing what enters `classifier`, pooled over time and space."""
    captured = {}
    hook = model.classifier.register_forward_hook(lambda m, inputs, out: captured.setdefault("x", inputs[0]))
    with torch.inference_mode():
        model(s3d_model.normalise(frames_uint8))
    hook.remove()
    return captured["x"].mean(dim=(2, 3, 4))


def _cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def clip_frames(tmp_path_factory):
    path = make_video(tmp_path_factory.mktemp("v") / "v.mp4", duration_s=1.6, fps=25, width=96, height=64)
    with ClipReader(str(path), load_config(None).decode) as reader:
        return torch.from_numpy(next(reader.clips()).frames).unsqueeze(0)


def _calibrated_random_s3d(cfg):
    """torchvision's S3D with what `features.weights: random` means: seeded, BatchNorm calibrated."""
    model = s3d(weights=None)
    model.load_state_dict(s3d_model.calibrated_random_state(cfg.seed, s3d_model.calibration_digest()))
    return model.eval()


def _cpu_float32_normalise(frames_uint8):
    """How frames were prepared before: float32 on the CPU, then moved (4x the bytes of uint8)."""
    x = frames_uint8.permute(0, 4, 1, 2, 3).float().div(255.0)
    mean = torch.tensor(s3d_model.KINETICS_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(s3d_model.KINETICS_STD).view(1, 3, 1, 1, 1)
    return (x - mean) / std


def test_the_s3d_limits_and_defaults_are_torchvisions():
    """Config checks and defaults are typed without torch (a config loads fast): held equal to the weights'."""
    from torchvision.models.video import S3D_Weights

    from stages import decode
    from stages.decode import DecodeConfig

    weights = S3D_Weights.KINETICS400_V1
    assert decode.S3D_MIN_FRAMES == weights.meta["min_temporal_size"]
    assert [decode.S3D_MIN_CROP] * 2 == list(weights.transforms().crop_size)
    assert [DecodeConfig().crop] * 2 == list(weights.transforms().crop_size)
    assert [DecodeConfig().resize] * 2 == list(weights.transforms().resize_size)
    assert list(s3d_model.KINETICS_MEAN) == list(weights.transforms().mean)


@pytest.mark.slow
def test_stage_vector_equals_torchvision_s3d_forward(clip_frames):
    cfg = load_config(None, ["features.weights=random", "features.precision=bfloat16"])
    encoder = S3DEncoder(cfg, torch.device("cpu"))
    assert encoder.dtype == torch.bfloat16
    reference_model = _calibrated_random_s3d(cfg)
    reference = _reference_embedding(reference_model, clip_frames)
    got = encoder(clip_frames)
    assert got.shape == (1, 1024)
    # bf16 autocast against float32: 0.998 here on a random network (its activations are less regular
    # than a trained one's)
    assert _cosine(got, reference) > 0.995
    exact = S3DEncoder(
        load_config(None, ["features.weights=random", "features.precision=float32"]), torch.device("cpu")
    )(clip_frames)
    assert _cosine(exact, reference) > 0.99999


def test_auto_precision_is_bf16_on_a_cpu_with_bf16_instructions_and_float32_on_one_without(monkeypatch):
    cfg = load_config(None, ["features.weights=random", "features.precision=auto"])
    cpu = torch.device("cpu")
    for native, expected in ((True, torch.bfloat16), (False, None)):
        monkeypatch.setattr(devices, "cpu_computes_bf16", lambda native=native: native)
        assert autocast_dtype(cfg, cpu) is expected
    # training's auto is float32 on any CPU; a GPU's is bf16 for both
    assert devices.autocast_dtype("auto", cpu, cpu_auto="float32") is None
    for cpu_auto in ("bfloat16", "float32"):
        assert devices.autocast_dtype("auto", torch.device("cuda"), cpu_auto=cpu_auto) is torch.bfloat16
    assert devices.autocast_dtype("float32", cpu, cpu_auto="bfloat16") is None


def test_local_checkpoint_is_loaded_and_its_hash_recorded(tmp_path, clip_frames):
    torch.manual_seed(123)
    saved = s3d(weights=None).eval()
    checkpoint = tmp_path / "s3d_random.pth"
    torch.save(saved.state_dict(), checkpoint)
    cfg = load_config(None, [f"features.weights={checkpoint}", "features.precision=float32"])
    got = S3DEncoder(cfg, torch.device("cpu"))(clip_frames)
    assert _cosine(got, _reference_embedding(saved, clip_frames)) > 0.99999
    assert s3d_model.weights_identity(cfg) == f"file:sha256={storage.file_sha256(checkpoint)}"
    with pytest.raises(FileNotFoundError, match="features.weights"):
        s3d_model.load_s3d(load_config(None, [f"features.weights={tmp_path / 'missing.pth'}"]))


def test_frames_reach_the_device_as_uint8_and_are_normalised_there(clip_frames):
    cfg = load_config(None, ["features.weights=random", "features.precision=float32"])
    encoder = S3DEncoder(cfg, torch.device("cpu"))
    on_device = encoder.to_device(clip_frames)
    assert on_device.dtype == torch.uint8 and on_device.device == encoder.device  # 1 byte per value moved
    with pytest.raises(TypeError, match="uint8"):
        encoder.to_device(clip_frames.float())
    normalised = s3d_model.normalise(on_device)
    assert normalised.device == on_device.device and normalised.dtype == torch.float32
    # the permuted NDHWC batch is channels_last_3d already: normalising copies nothing into another layout
    assert normalised.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(normalised, _cpu_float32_normalise(clip_frames), atol=1e-5)
    # the vectors equal those of the float32 CPU-normalised input through the same model
    with torch.inference_mode():
        before = s3d_model.clip_embedding(encoder.model, _cpu_float32_normalise(clip_frames))
    vectors = encoder(clip_frames)
    assert _cosine(vectors, before) > 0.99999
    # a batch submitted as the stage submits it gives the same vectors
    assert np.allclose(encoder.submit(clip_frames).result(), vectors.numpy())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_uint8_frames_from_pinned_memory_are_normalised_there_in_bf16(clip_frames):
    cfg = load_config(None, ["features.weights=random", "features.device=cuda"])
    encoder = S3DEncoder(cfg)
    pinned = clip_frames.pin_memory()
    on_device = encoder.to_device(pinned)
    assert on_device.dtype == torch.uint8 and on_device.is_cuda
    assert s3d_model.normalise(on_device).is_cuda
    assert encoder.dtype == torch.bfloat16
    cpu = S3DEncoder(load_config(None, ["features.weights=random", "features.device=cpu"]))
    assert _cosine(encoder.submit(pinned).result(), cpu(clip_frames)) > 0.999


def test_random_weights_are_calibrated_the_same_in_every_process_and_recorded(tmp_path):
    cfg = load_config(None, ["features.weights=random"])
    identity = s3d_model.weights_identity(cfg)
    assert identity.startswith("random(seed=0, BatchNorm calibrated") and "NOT pretrained" in identity
    assert s3d_model.calibration_digest() in identity
    assert identity != s3d_model.weights_identity(load_config(None, ["features.weights=random", "seed=1"]))
    # another process computes the same network, bit for bit
    here = s3d_model.calibrated_random_state(cfg.seed, s3d_model.calibration_digest())
    script = (
        "import torch; from stages.features.s3d import model; "
        "state = model.calibrated_random_state(0, model.calibration_digest()); "
        f"torch.save(state, {str(tmp_path / 'state.pt')!r})"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(features.__file__).parents[2])
    there = torch.load(tmp_path / "state.pt", weights_only=True)
    assert all(torch.equal(here[name], there[name]) for name in here)


def test_a_part_of_vanishing_values_is_refused_naming_the_shard(tmp_path):
    # an uncalibrated random S3D (what `random` meant before): pooled activations of about 1e-7
    torch.manual_seed(0)
    checkpoint = tmp_path / "uncalibrated.pth"
    torch.save(s3d(weights=None).state_dict(), checkpoint)
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=0.8, fps=25)
    cfg = load_config(
        None,
        [
            f"features.weights={checkpoint}",
            "decode.clip_frames=14",
            "decode.min_clip_frames=7",
            "features.decode_workers=0",
        ],
    )
    work = tmp_path / "work"
    write_manifest(cfg, videos, work)
    result = run_one_shard_safely(cfg, work, "features", 0)
    assert result["failed"] and result["error"].startswith("VanishingFeatures: features part 00000: ")
    assert "zero or subnormal" in result["error"] and "not written" in result["error"]
    assert not WorkDir(work).part("features", 0).exists() and not WorkDir(work).record("features", 0).exists()
    with pytest.raises(features.VanishingFeatures, match="features part 00007: 75% of its float16"):
        features.check_values(np.array([[0, 1e-6, 3e-5, 0.5]], np.float16), "features part 00007")
    with pytest.raises(features.VanishingFeatures, match="NaN"):
        features.check_values(np.array([[np.nan, 1.0]], np.float16), "features part 00007")
    features.check_values(np.array([[0, 0.25, 0.5, 1.0]], np.float16), "features part 00007")  # 25%: kept


def _parquet_files(work):
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*.parquet"))}


@pytest.mark.slow
def test_features_stage_writes_the_decode_stage_outputs_from_its_one_pass(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=3.1, fps=30)
    make_video(videos / "b.mp4", duration_s=1.6, fps=24)
    (videos / "broken.mp4").write_text("not a video")
    cfg = load_config(None, ["features.weights=random", "features.batch_size=2", "shards.videos_per_shard=8"])
    work, decoded = tmp_path / "work", tmp_path / "decoded"
    for folder in (work, decoded):
        write_manifest(cfg, videos, folder)
    stats = run_one_shard(cfg, work, "features", 0)
    table = pq.read_table(work / "features" / "part-00000.parquet")
    clips = pq.read_table(work / "decode" / "part-00000.parquet")
    assert table.select(["video_id", "clip_index", "start_s", "end_s"]).equals(
        clips.select(["video_id", "clip_index", "start_s", "end_s"])
    )
    assert stats["clips"] == table.num_rows == 3
    # the decode stage's files, byte for byte as the decode stage alone makes them, with its own record
    run_one_shard(cfg, decoded, "decode", 0)
    made = {name: data for name, data in _parquet_files(work).items() if "features" not in name}
    assert made == {name: data for name, data in _parquet_files(decoded).items()}
    checker = Lineage(work, cfg)
    assert checker.state("decode", 0, verify=True).current and checker.record("decode", 0)["made_by"] == "features"
    assert run_one_shard(cfg, work, "decode", 0)["skipped"]
    # a change of decode config makes both stale; features redoes both in one pass
    changed = load_config(None, ["features.weights=random", "features.batch_size=2", "decode.thumbnail_size=64"])
    assert not Lineage(work, changed).state("features", 0).current
    run_one_shard(changed, work, "features", 0)
    assert Lineage(work, changed).state("decode", 0, verify=True).current
    # operational settings do not make the features stale
    assert (
        Lineage(
            work,
            load_config(
                None,
                [
                    "features.weights=random",
                    "features.batch_size=5",
                    "features.decode_workers=0",
                    "decode.thumbnail_size=64",
                ],
            ),
        )
        .state("features", 0)
        .current
    )
    vectors = np.array(table["feature"].to_pylist(), dtype=np.float32)
    assert vectors.shape == (3, 1024) and np.isfinite(vectors).all()
    metadata = storage.read_metadata(work / "features" / "part-00000.parquet")
    provenance = json.loads(metadata.feature_provenance)
    assert provenance["weights"].startswith("random") and "NOT pretrained" in provenance["weights"]
    assert provenance["fps"] == 20.0 and provenance["clip_frames"] == 30
    assert metadata.feature_provenance_hash == features.provenance_hash(provenance)
    errors = pq.read_table(WorkDir(work).errors("features", 0)).to_pylist()
    assert [e["video_id"].split("-")[0] for e in errors] == ["broken"]
