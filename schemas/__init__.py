"""The Parquet schemas of every stage's output, with their versions: the only contract between stages.

A stage reads an earlier stage's files through these column names and nothing else. Bump a schema's
version whenever a column changes meaning or type; outputs record `schema=<name>:<version>`."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

FEATURE_DIM = 1024  # S3D's pooled activation before its classifier


@dataclass(frozen=True)
class Schema:
    name: str
    version: int
    arrow: pa.Schema

    @property
    def tag(self) -> str:
        return f"{self.name}:{self.version}"


_clip_key = [
    pa.field("video_id", pa.string(), nullable=False),
    pa.field("clip_index", pa.int32(), nullable=False),
    pa.field("start_s", pa.float64(), nullable=False),
    pa.field("end_s", pa.float64(), nullable=False),
]

MANIFEST = Schema(
    "manifest",
    2,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("uri", pa.string(), nullable=False),
            pa.field("bytes", pa.int64()),  # null when the file could not be stat'ed
            # what tells a change of the bytes without reading them: "mtime:<ns>" of a local file, the object's
            # "etag:..." (else "mtime:...") on object storage; null where unknown (a URL in a list)
            pa.field("content_tag", pa.string()),
            pa.field("transcript_uri", pa.string()),  # WebVTT / SRT / JSON to import instead of ASR
            pa.field("shard", pa.int32(), nullable=False),
        ]
    ),
)

# decode's two tables are made by the features stage's pass (one read per video) or by the decode stage run
# alone; the same columns and meaning either way, so their versions stay.
# 2: what the quality and dedup stages read of each clip, measured on its real frames in the same pass (the
# frames never reach disk): luma (BT.601, 0-255) over the frames as the model sees them, the mean absolute
# luma change between consecutive frames, and the 64-bit perceptual hashes (DCT, imagehash.phash) of three
# of its frames, at 1/6, 1/2 and 5/6 of its real frames (HASHED_AT): one every half second of a 1.5 s clip
DECODE_CLIPS = Schema(
    "decode",
    2,
    pa.schema(
        _clip_key
        + [
            pa.field("n_real_frames", pa.int32(), nullable=False),  # frames before padding
            pa.field("padded", pa.bool_(), nullable=False),
            pa.field("thumbnail_jpeg", pa.binary(), nullable=False),  # the clip's middle frame, as the model sees it
            pa.field("luma_mean", pa.float32(), nullable=False),  # mean luma of its real frames
            pa.field("luma_contrast", pa.float32(), nullable=False),  # mean of the frames' spatial luma std
            pa.field("motion_mean", pa.float32(), nullable=False),  # mean |luma change| between frames
            pa.field("motion_max", pa.float32(), nullable=False),  # the largest change between two frames
            pa.field("phashes", pa.list_(pa.int64()), nullable=False),  # the 64 bits of each, as int64
        ]
    ),
)

VIDEO_STATUSES = ("ok", "partial", "too_short", "error")

# 2: video_stream and video_streams (the stream decoded is chosen, no longer the first)
DECODE_VIDEOS = Schema(
    "decode.videos",
    2,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("uri", pa.string(), nullable=False),
            pa.field("status", pa.string(), nullable=False),  # one of VIDEO_STATUSES
            pa.field("duration_s", pa.float64()),  # container or stream duration; null if unknown
            pa.field("decoded_s", pa.float64()),  # time span actually decoded
            pa.field("source_fps", pa.float64()),
            pa.field("width", pa.int32()),
            pa.field("height", pa.int32()),
            pa.field("codec", pa.string()),
            pa.field("has_audio", pa.bool_()),
            pa.field("rotation", pa.int32()),  # degrees applied to make the picture upright
            pa.field("n_frames", pa.int64()),  # frames produced at the target fps
            pa.field("n_clips", pa.int32(), nullable=False),
            pa.field("video_stream", pa.int32()),  # the stream index decoded: marked default, else the longest
            pa.field("video_streams", pa.int32()),  # real video streams in the file (no covers or stills)
        ]
    ),
)

# where a clip's hashed frames lie: frame int(share * n_real_frames) of its real frames, for each share
HASHED_AT = (1 / 6, 3 / 6, 5 / 6)

FEATURES = Schema(
    "features",
    1,
    pa.schema(
        _clip_key
        + [
            pa.field("feature", pa.list_(pa.float16(), FEATURE_DIM), nullable=False),
        ]
    ),
)

QUANTIZE = Schema(
    "quantize",
    1,
    pa.schema(
        _clip_key
        + [
            pa.field("token", pa.int32(), nullable=False),  # leaf id in [0, k**depth)
        ]
    ),
)

SHOT_KINDS = ("cut", "gradual")

# shot boundaries per video, from the frames the visual path decodes (stages/shots): the first frame of
# each new shot, counted at decode.fps from the video's first frame, and its time on the container clock
SHOTS = Schema(
    "shots",
    1,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("boundary_index", pa.int32(), nullable=False),  # 0, 1, ... in time order per video
            pa.field("frame", pa.int32(), nullable=False),  # the new shot's first frame
            pa.field("time_s", pa.float64(), nullable=False),  # that frame's time
            pa.field("kind", pa.string(), nullable=False),  # one of SHOT_KINDS
            # the histogram distance (0-1) across the boundary: the two frames of a cut, the half-second
            # windows either side of a gradual one; TransNetV2's transition probability with that detector
            pa.field("score", pa.float32(), nullable=False),
        ]
    ),
)

CLIP_FLAGS = ("black", "dark", "frozen", "static")
VIDEO_FLAGS = ("too_short", "black", "dark", "frozen", "static")

FLAG = pa.struct(
    [
        pa.field("reason", pa.string()),  # one of CLIP_FLAGS / VIDEO_FLAGS
        pa.field("value", pa.float64()),  # what was measured
        pa.field("threshold", pa.float64()),  # the setting it was compared with
    ]
)

# quality flags per clip (stages/quality): every clip of the decode stage's clip index, with its flags
QUALITY = Schema(
    "quality",
    1,
    pa.schema(
        _clip_key
        + [
            pa.field("flags", pa.list_(FLAG), nullable=False),  # empty: the clip is usable
            # left out of the k-means fit and the training shards (a flag of its own or of its video)
            pa.field("excluded", pa.bool_(), nullable=False),
        ]
    ),
)

QUALITY_VIDEOS = Schema(
    "quality.videos",
    1,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("clips", pa.int32(), nullable=False),
            pa.field("flagged_clips", pa.int32(), nullable=False),
            pa.field("flags", pa.list_(FLAG), nullable=False),  # the video's own: every clip of it is left out
        ]
    ),
)

# near-duplicate videos (stages/dedup): one row per video of a group of two or more; a video in no row
# has no copy
DEDUP_GROUPS = Schema(
    "dedup",
    1,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("group_id", pa.int32(), nullable=False),  # 0, 1, ... in the order of the representatives
            pa.field("representative", pa.string(), nullable=False),  # the group's video that training keeps
            pa.field("matched_to", pa.string()),  # the video it was found a copy of (null: the representative)
            pa.field("matched_share", pa.float32()),  # of the shorter one's clips, matched at one time offset
            pa.field("offset_s", pa.float32()),  # where its clips sit in matched_to's
        ]
    ),
)

SENTENCE = pa.struct(
    [
        pa.field("text", pa.string()),
        pa.field("start_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        # confidence (speech/confidence.py): word probabilities, and Whisper's segment signals
        # as a word-weighted mean over the segments the sentence draws words from; the
        # last three are null for imported transcripts, all five for imports without them
        pa.field("avg_word_prob", pa.float32()),
        pa.field("min_word_prob", pa.float32()),
        pa.field("no_speech_prob", pa.float32()),
        pa.field("avg_logprob", pa.float32()),
        pa.field("compression_ratio", pa.float32()),
        # null: kept as speech; else one of REJECTIONS, and align keeps none of its text
        pa.field("rejected", pa.string()),
    ]
)
REJECTIONS = ("no_speech", "low_confidence", "repetition", "not_speech_language")
WORD = pa.struct(
    [
        pa.field("word", pa.string()),
        pa.field("start_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        pa.field("prob", pa.float32()),
    ]
)

ASR = Schema(
    "asr",
    2,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("status", pa.string(), nullable=False),  # ok | no_audio
            pa.field("source", pa.string(), nullable=False),  # model name, or import:vtt / import:srt / import:json
            pa.field("language", pa.string()),
            pa.field("language_prob", pa.float32()),
            pa.field("audio_s", pa.float64()),
            pa.field("speech_s", pa.float64()),  # speech the voice-activity filter found; null: imports, no VAD
            pa.field("sentences", pa.list_(SENTENCE), nullable=False),
            pa.field("words", pa.list_(WORD), nullable=False),
        ]
    ),
)

SEGMENT_KINDS = ("text_video", "video_only")

ALIGN = Schema(
    "align",
    1,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("segment_index", pa.int32(), nullable=False),
            pa.field("start_s", pa.float64(), nullable=False),
            pa.field("end_s", pa.float64(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),  # one of SEGMENT_KINDS
            pa.field("text", pa.string()),  # null for video_only
            pa.field("text_ids", pa.list_(pa.int32()), nullable=False),  # WordPiece ids, no [CLS]/[SEP]
            pa.field("visual_ids", pa.list_(pa.int32()), nullable=False),  # codebook leaf ids in [0, k**depth)
            pa.field("language", pa.string()),
        ]
    ),
)

ERRORS = Schema(
    "errors",
    1,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("stage", pa.string(), nullable=False),
            pa.field("error_type", pa.string(), nullable=False),
            pa.field("message", pa.string(), nullable=False),
        ]
    ),
)


def conform(table: pa.Table, schema: Schema) -> pa.Table:
    """Reorder and cast `table` to `schema`; a missing or extra column is a programming error."""
    names = schema.arrow.names
    if sorted(table.column_names) != sorted(names):
        raise ValueError(f"{schema.tag}: columns {table.column_names} do not match {names}")
    return table.select(names).cast(schema.arrow)


def empty(schema: Schema) -> pa.Table:
    return schema.arrow.empty_table()
