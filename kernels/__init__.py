"""Triton kernels, importable as ``minillm.kernels``.

The folder sits at the top of the repository (kernels are a part of the course of
their own) and is mapped into the package by ``pyproject.toml``. It is not a top-level
``kernels`` package on purpose: that name belongs to a Hugging Face library that
transformers probes for.
"""
