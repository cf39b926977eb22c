"""Evaluation of a trained VideoBERT, apart from training (which never imports it):

- `evaluate`: the evaluator (a checkpoint on its device), downstream features, video prediction;
- `zero_shot`: zero-shot verb/noun classification, the text-only prior and chance;
- `probe`: the supervised S3D linear probe;
- `captioning` and `caption_metrics`: YouCook II dense captioning and its BLEU, METEOR, ROUGE-L and CIDEr;
- `forecast`: the most likely later visual words of a visual word;
- `youcook2`: YouCook II as an evaluation set (its manifest, annotated segments, verb and noun labels)."""
