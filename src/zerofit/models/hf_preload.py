"""What a Hugging Face model's workers import from transformers before they build it: imported
ahead by the launcher's fork server (`zerofit.launch.forkserver.preload_for`), so that each
worker, a fork of it, starts with them.

transformers resolves its names lazily: the first `transformers.AutoConfig` builds the package's
import structure (it walks `transformers/models/`), and building a model imports its modelling
and quantizer code; about 2.5 s of CPU a rank on this project's CPU machine, measured with
py-spy on a two-rank run of a tiny Llama folder. With this module preloaded the run took 5.6 s
instead of 7.1 s.
"""

from __future__ import annotations

import transformers
import transformers.masking_utils
import transformers.modeling_utils

# the lazy names the workers ask for (`zerofit.models.hf`), each resolved here once
RESOLVED = (transformers.AutoConfig, transformers.AutoModelForCausalLM)
