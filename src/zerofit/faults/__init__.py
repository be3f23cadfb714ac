"""What a run does when things go wrong: preemption signals, non-finite values, dead ranks and
failed writes, each ending in one line (see docs/troubleshooting.md).

- `signals`: a worker's SIGTERM/SIGINT become "stop after this optimizer step".
- `step_gate`: the one per-step agreement across ranks (apply this update? was a stop asked?).
- `nonfinite`: the `train.on_nonfinite` policy.
- `report`: what a worker leaves for the launcher, and the one line the launcher prints.
"""
