"""Malleability on top of the core: orders, communicators, safe steps and their checkpoints."""
