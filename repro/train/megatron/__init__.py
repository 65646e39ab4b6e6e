"""The Megatron-core trainer backend (needs megatron-core: `make test-megatron` builds .venv-megatron)."""
