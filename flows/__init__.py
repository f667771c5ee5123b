"""User-facing flows on top of every package: `accel sweep`, `accel bisect`, lockstep runs, and the
command-line inputs they share with the CLI (inputs.py).

Only accel.cli imports this package; nothing in accel.isa, accel.hw, sim, host_runtime or compiler
does (the import-linter layers in pyproject.toml keep it so).
"""
