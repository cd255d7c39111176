"""Seed 004's Ray Core collectives slice check, adapted for CPU: submit ray_core_collectives.py as `ray job submit` would."""
