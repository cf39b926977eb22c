"""The bundled VideoBERT trainer (Sun et al., ICCV 2019) that consumes the pipeline's align shards.

- `videobert.data`: align shards streamed into text-only, video-only and text-video examples, masked;
- `videobert.model`: BERT with the visual words in its vocabulary, an MLM head and an alignment head;
- `videobert.train`: the pre-training loop (`train(cfg, work_dir, resume=...)`);
- `videobert.evaluate`: zero-shot verb/noun classification, downstream features, video prediction."""
