"""Speech for the asr stage: Whisper backends, the CTranslate2 weight reader, imported transcripts, and the
split of a word stream into sentences. The stage itself is stages/asr/; audio decoding is pipeline/media/audio.py."""
