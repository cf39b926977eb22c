"""The bundled VideoBERT trainer (Sun et al., ICCV 2019) that consumes the pipeline's align shards.

- `videobert.data`: align shards streamed into text-only, video-only and text-video examples, masked
  (`videobert.shards`: reading and pinning the shards; `videobert.stream`: the stream of example plans);
- `videobert.model`: BERT with the visual words in its vocabulary, an MLM head and an alignment head;
- `videobert.train`: the pre-training loop (`train(cfg, work_dir, resume=...)`), with `videobert.runtime`
  (ranks, device, autocast), `videobert.train_inputs` (what a run reads), `videobert.train_setup` (its model,
  optimiser and data), `videobert.checkpoints`, `videobert.train_log` and `videobert.validation`
  (the held-out figures training logs);
- `videobert.eval`: evaluation apart from training (zero-shot, the probe, captioning, forecasting);
- `videobert.export`: a checkpoint as a Hugging Face model folder."""
