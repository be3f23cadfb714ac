"""The ddp engine: options.py (its config section), spec.py (planner, doctor, launch), runtime.py (torch)."""
