"""The bundled VideoBERT trainer (Sun et al., ICCV 2019) that consumes the pipeline's align shards.

- `videobert.data`: align shards streamed into text-only, video-only and text-video examples, masked;
- `videobert.model`: BERT with the visual words in its vocabulary, an MLM head and an alignment head;
- `videobert.train`: the pre-training loop (`train(cfg, work_dir, resume=...)`);
- `videobert.evaluate`: zero-shot verb/noun classification, downstream features, video prediction.

This module stays free of heavy imports: the config loader reads `PRESETS` from it."""

# `train.init_checkpoint: random:<preset>`: a randomly initialised BERT of a named size
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=256),
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "bert-large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
}
