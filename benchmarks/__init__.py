"""Benchmarks of the APGAS runtime."""
