"""features: the stage's vector is torchvision's S3D pooled activation; weights are loaded and recorded."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from media_factory import make_video
from torchvision.models.video import s3d

from pipeline import storage
from pipeline.config import load_config
from pipeline.manifest import write_manifest
from pipeline.media import ClipReader
from pipeline.runner import run_one_shard
from pipeline.workdir import WorkDir
from stages import features


def _reference_embedding(model, frames_uint8):
    """torchvision's own forward, capturing what enters `classifier`, pooled over time and space."""
    captured = {}
    hook = model.classifier.register_forward_hook(lambda m, inputs, out: captured.setdefault("x", inputs[0]))
    with torch.inference_mode():
        model(features.normalise(frames_uint8))
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


def test_stage_vector_equals_torchvision_s3d_forward(clip_frames):
    cfg = load_config(None, ["features.weights=random", "features.precision=auto"])
    encoder = features.S3DEncoder(cfg, torch.device("cpu"))
    torch.manual_seed(cfg.seed)
    reference_model = s3d(weights=None).eval()
    reference = _reference_embedding(reference_model, clip_frames)
    got = encoder(clip_frames)
    assert got.shape == (1, 1024)
    assert _cosine(got, reference) > 0.999          # bf16 autocast against float32
    exact = features.S3DEncoder(load_config(None, ["features.weights=random", "features.precision=float32"]),
                                torch.device("cpu"))(clip_frames)
    assert _cosine(exact, reference) > 0.99999


def test_local_checkpoint_is_loaded_and_its_hash_recorded(tmp_path, clip_frames):
    torch.manual_seed(123)
    saved = s3d(weights=None).eval()
    checkpoint = tmp_path / "s3d_random.pth"
    torch.save(saved.state_dict(), checkpoint)
    cfg = load_config(None, [f"features.weights={checkpoint}", "features.precision=float32"])
    got = features.S3DEncoder(cfg, torch.device("cpu"))(clip_frames)
    assert _cosine(got, _reference_embedding(saved, clip_frames)) > 0.99999
    assert features.weights_identity(cfg) == f"file:sha256={storage.file_sha256(checkpoint)}"
    with pytest.raises(FileNotFoundError, match="features.weights"):
        features.load_s3d(load_config(None, [f"features.weights={tmp_path / 'missing.pth'}"]))


def test_features_stage_matches_the_clip_index_and_records_provenance(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=3.1, fps=30)
    make_video(videos / "b.mp4", duration_s=1.6, fps=24)
    (videos / "broken.mp4").write_text("not a video")
    cfg = load_config(None, ["features.weights=random", "features.batch_size=2", "shards.videos_per_shard=8"])
    work = tmp_path / "work"
    write_manifest(cfg, videos, work)
    run_one_shard(cfg, work, "decode", 0)
    stats = run_one_shard(cfg, work, "features", 0)
    table = pq.read_table(work / "features" / "part-00000.parquet")
    clips = pq.read_table(work / "decode" / "part-00000.parquet")
    assert table.select(["video_id", "clip_index", "start_s", "end_s"]).equals(
        clips.select(["video_id", "clip_index", "start_s", "end_s"]))
    assert stats["clips"] == table.num_rows == 3
    vectors = np.array(table["feature"].to_pylist(), dtype=np.float32)
    assert vectors.shape == (3, 1024) and np.isfinite(vectors).all()
    metadata = storage.read_metadata(work / "features" / "part-00000.parquet")
    provenance = json.loads(metadata.feature_provenance)
    assert provenance["weights"].startswith("random") and "NOT pretrained" in provenance["weights"]
    assert provenance["fps"] == 20.0 and provenance["clip_frames"] == 30
    assert metadata.feature_provenance_hash == features.provenance_hash(provenance)
    errors = pq.read_table(WorkDir(work).errors("features", 0)).to_pylist()
    assert [e["video_id"].split("-")[0] for e in errors] == ["broken"]
