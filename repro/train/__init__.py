"""Trainers behind one interface: the embedded torch trainer, Megatron-core."""
