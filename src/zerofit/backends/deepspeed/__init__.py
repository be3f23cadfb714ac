"""DeepSpeed ZeRO: options.py (its config section), ds_json.py (its JSON table), spec.py (planner, doctor, launch), runtime.py and checkpoint.py (torch, deepspeed)."""
