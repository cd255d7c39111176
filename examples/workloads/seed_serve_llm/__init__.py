"""Seed 004's model served with Ray Serve LLM (vLLM) on a TPU slice: a team's own RayService app builder."""
