"""Benchmarks: each compares tensorwire with a baseline in the same run and prints a table."""
