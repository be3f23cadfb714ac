"""`zerofit export`: a checkpoint of any engine as a Hugging Face folder (full, merged LoRA, or
a PEFT adapter)."""
