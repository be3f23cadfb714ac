"""Training data: tokenizers, sources, fine-tuning samples, packing, and the resumable loader.

- ``tokenizers``: bytes, a ``tokenizer.json``, or a tokenizer folder (AutoTokenizer).
- ``sources``: "stdlib", .txt/.jsonl/.json/.parquet files and directories.
- ``formats``: what chat, ShareGPT and Alpaca records hold (fields, role map).
- ``samples``: prompt/completion and chat records rendered to ids and loss masks.
- ``pairs``: preference records (prompt, chosen, rejected) rendered to two documents each.
- ``sizing``: whether the rows hold out validation and fill a global batch; steps from epochs.
- ``packing``: text rows, sample rows kept apart (first-fit), the train/val split.
- ``pair_rows``: pairs split by pair, fitted and packed into rows with a pair-id channel.
- ``build``: a data config to a ``DataBundle``; ``loader``: ``PackedLoader`` and eval batches.
"""

from zerofit.data.build import DataBundle, SampleOptions, build_data
from zerofit.data.formats import SAMPLE_FORMATS, field_names
from zerofit.data.loader import Batch, PackedLoader, eval_batches, real_tokens, to_batch
from zerofit.data.packing import (
    IGNORE_INDEX,
    PackStats,
    first_fit,
    fit_samples,
    pack,
    pack_samples,
    split_train_val,
    tokenize_stream,
)
from zerofit.data.pair_rows import (
    PairStats,
    fit_pairs,
    pack_pairs,
    pair_ids,
    split_pairs,
    truncate_pair,
)
from zerofit.data.pairs import Pair, PairRenderer, render_pairs
from zerofit.data.samples import (
    ChatRenderer,
    Sample,
    has_chat_template,
    prompt_completion_sample,
    render_samples,
    sampler,
)
from zerofit.data.sizing import GlobalBatch, RowSupply, check_rows, epoch_steps
from zerofit.data.sources import iter_documents, iter_records, iter_sample_records, stdlib_files
from zerofit.data.tokenizers import (
    EOS_CANDIDATES,
    AnyTokenizer,
    ByteTokenizer,
    FolderTokenizer,
    HFTokenizer,
    Tokenizer,
    load_tokenizer,
)

__all__ = [
    "EOS_CANDIDATES",
    "IGNORE_INDEX",
    "SAMPLE_FORMATS",
    "AnyTokenizer",
    "Batch",
    "ByteTokenizer",
    "ChatRenderer",
    "DataBundle",
    "FolderTokenizer",
    "GlobalBatch",
    "HFTokenizer",
    "PackStats",
    "PackedLoader",
    "Pair",
    "PairRenderer",
    "PairStats",
    "real_tokens",
    "RowSupply",
    "Sample",
    "SampleOptions",
    "Tokenizer",
    "build_data",
    "check_rows",
    "epoch_steps",
    "eval_batches",
    "field_names",
    "first_fit",
    "fit_pairs",
    "fit_samples",
    "has_chat_template",
    "iter_documents",
    "iter_records",
    "iter_sample_records",
    "load_tokenizer",
    "pack",
    "pack_pairs",
    "pack_samples",
    "pair_ids",
    "prompt_completion_sample",
    "render_pairs",
    "render_samples",
    "sampler",
    "split_pairs",
    "split_train_val",
    "stdlib_files",
    "to_batch",
    "tokenize_stream",
    "truncate_pair",
]
