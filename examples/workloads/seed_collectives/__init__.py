"""Seed 004's Ray Core collectives: ray_core_collectives.py is the seed's script byte for byte (ray job submit it from here)."""
