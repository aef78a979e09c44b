"""A small pre-tokenized data set for MaxText's grain pipeline, written by the tests themselves.

``python -m simjob.maxtext.grain_data OUT.array_record [RECORDS] [LENGTH] [VOCAB] [SEED]`` (in the
MaxText venv, which has ``array_record``): RECORDS ``tf.train.Example`` records, each a ``text``
feature of LENGTH token ids in 1..VOCAB-1 (int64, so MaxText reads it as pre-tokenized:
``tokenize_train_data=false``), seeded, in one ArrayRecord file. MaxText 0.2.5's grain pipeline
(``input_pipeline/grain_data_processing.py``: ``grain_file_type=arrayrecord`` parses each record with
``ParseFeatures``; ``grain_use_elastic_iterator`` needs ArrayRecord, ``packing=false`` and truncation)
reads it with :func:`maxtext_flags`. No download: the records are random tokens, which is all a
test of which batches were consumed needs. The tokenizer MaxText still builds for its pad id is the
wheel's own ``assets/tokenizers/tokenizer.default`` (:func:`maxtext_flags`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

RECORDS = 4096
LENGTH = 64
VOCAB = 256
SEED = 1234


def write(out: Path, records: int = RECORDS, length: int = LENGTH, vocab: int = VOCAB, seed: int = SEED) -> Path:
    """Write the data set to ``out`` (an ``.array_record`` file); return its path."""
    import numpy as np
    from array_record.python.array_record_module import ArrayRecordWriter
    from maxtext.input_pipeline.protos import example_pb2

    if records < 1 or length < 2 or vocab < 2:
        raise ValueError(f"records={records}, length={length}, vocab={vocab}: expected >= 1, >= 2, >= 2")
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = ArrayRecordWriter(str(out), "group_size:1")
    rows = []
    try:
        for _ in range(records):
            tokens = rng.integers(1, vocab, size=length)
            ex = example_pb2.Example()
            ex.features.feature["text"].int64_list.value.extend(tokens.tolist())
            writer.write(ex.SerializeToString())
            # MaxText's ParseFeatures reads int64 features as int32: the row a batch then holds
            rows.append(hashlib.sha256(tokens.astype(np.int32).tobytes()).hexdigest()[:12])
    finally:
        writer.close()
    rows_file(out).write_text(json.dumps(rows))
    return out


def rows_file(data: Path) -> Path:
    """The JSON list beside the data: each record's row hash, in file order (``cpu_elastic.batch_fields``'
    ``rows``), so a test can tell which records a run's batches held without reading ArrayRecord."""
    return data.with_name(data.name + ".rows.json")


def rows(data: Path) -> list[str]:
    return list(json.loads(rows_file(data).read_text()))


def maxtext_flags(path: Path | str, *, elastic_iterator: bool = True) -> list[str]:
    """MaxText's arguments for a grain pipeline over :func:`write`'s file (replacing ``dataset_type=synthetic``).

    ``grain_worker_count=0``: the records are read in the MaxText process (no worker processes);
    ``enable_data_shuffling=false``: the order is the file's, so a batch's rows name its records.
    """
    return [
        "dataset_type=grain",
        "grain_file_type=arrayrecord",
        f"grain_train_files={path}",
        "tokenize_train_data=false",
        "tokenizer_type=sentencepiece",
        f"tokenizer_path={wheel_tokenizer()}",
        "packing=false",
        "use_truncation=true",
        "grain_worker_count=0",
        "enable_data_shuffling=false",
        f"grain_use_elastic_iterator={'true' if elastic_iterator else 'false'}",
        "eval_interval=-1",
    ]


def wheel_tokenizer() -> str:
    """The wheel's own sentencepiece tokenizer (``maxtext/assets/tokenizers/tokenizer.default``), found from
    the MaxText venv next to this checkout; only its pad id is used (the data are already token ids)."""
    venv = Path(__file__).resolve().parents[2] / ".venv-maxtext"  # simjob.maxtext.job.MAXTEXT_VENV
    found = sorted(venv.glob("lib/python3*/site-packages/maxtext/assets/tokenizers/tokenizer.default"))
    if not found:
        raise FileNotFoundError(f"no maxtext/assets/tokenizers/tokenizer.default under {venv}")
    return str(found[0])


if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    nums = [int(a) for a in argv[1:5]]
    print(write(Path(argv[0]), *nums))
