"""Seed 004's FSDP2 TorchTrainer fine-tune, adapted for CPU: submit train.py as `ray job submit` would."""
