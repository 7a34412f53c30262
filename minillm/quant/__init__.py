"""Quantization: storing weights in fewer bits (course part III)."""
