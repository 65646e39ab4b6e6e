"""The tiny genuine DeepSeek-V4: builder, tokenizer, safetensors checkpoints, SFT warm start, routing replay."""
