"""The parent process of a run: checks every input, resolves the config for this machine, and
starts the workers (or runs `zerofit train` as a child for the commands that compare runs)."""
